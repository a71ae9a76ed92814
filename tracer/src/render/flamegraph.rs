//! Folded stacks (`frame;frame;frame COUNT`, the plain-text contract of flame graph
//! tools) and their rendering to an SVG flame graph with inferno.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::sync::OnceLock;

use foldhash::HashMap;
use inferno::flamegraph::{self, color::BasicPalette};

use super::write_output;
use crate::{stacks::StackProfile, symbolize::UNKNOWN};

/// Weighted stacks, keyed by their folded form (root frame first, frames joined by `;`).
/// Kept sorted so output files are deterministic and inferno needs no re-sort.
#[derive(Clone, Debug, Default)]
pub struct FoldedStacks {
    stacks: BTreeMap<String, u64>,
    /// The folded text, built once for both the folded file and the flame graph (inferno
    /// reads lines of text); cleared by every change.
    text: OnceLock<String>,
}

impl PartialEq for FoldedStacks {
    fn eq(&self, other: &Self) -> bool {
        self.stacks == other.stacks
    }
}

impl Eq for FoldedStacks {}

/// A folded-stacks line that is not `STACK COUNT`.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: expected `frame;frame COUNT`, got {text:?}")]
pub struct ParseFoldedError {
    pub line: usize,
    pub text: String,
}

/// A view's stacks as inferno reads them: weighted in microseconds (each stack's own,
/// rounded up, as [`crate::stacks::Weight::us`]).
impl From<&StackProfile> for FoldedStacks {
    fn from(profile: &StackProfile) -> Self {
        fold_profile(profile, |weight| weight.us())
    }
}

/// `profile` folded through a [`StackFolder`]: each distinct frame name is sanitized once
/// rather than once per stack it is in.
fn fold_profile(
    profile: &StackProfile,
    weight_of: impl Fn(&crate::stacks::Weight) -> u64,
) -> FoldedStacks {
    let mut folder = StackFolder::new();
    for (frames, weight) in profile.iter() {
        let ids = folder.frames(&frames);
        folder.add(&ids, weight_of(&weight));
    }
    folder.finish(|sum| sum)
}

impl FoldedStacks {
    /// A profile's stacks weighted by how many events made each (probe hits), not by
    /// their time.
    pub fn of_events(profile: &StackProfile) -> Self {
        fold_profile(profile, |weight| weight.events)
    }

    /// No stacks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `weight` to the stack made of `frames`, root (outermost caller) first.
    /// Frame names are sanitized so they cannot break the folded format.
    pub fn add<I>(&mut self, frames: I, weight: u64)
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut key = String::new();
        for frame in frames {
            if !key.is_empty() {
                key.push(';');
            }
            push_sanitized(&mut key, frame.as_ref());
        }
        if key.is_empty() {
            // A stack with no frames still carries weight; keep it visible.
            key.push_str(UNKNOWN);
        }
        self.text.take();
        let slot = self.stacks.entry(key).or_default();
        *slot = slot.saturating_add(weight);
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// True when no stack was added.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Sum of all weights.
    pub fn total(&self) -> u64 {
        self.stacks
            .values()
            .fold(0, |sum, &w| sum.saturating_add(w))
    }

    /// The folded stacks and their weights, sorted by stack.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.stacks
            .iter()
            .map(|(stack, &weight)| (stack.as_str(), weight))
    }

    /// Parses folded text as written by [`write_folded`] (or by other folded-stack
    /// tools): one `STACK COUNT` per line; blank lines are skipped.
    pub fn parse(text: &str) -> Result<Self, ParseFoldedError> {
        let mut stacks = Self::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let parsed = line
                .rsplit_once(' ')
                .and_then(|(stack, count)| Some((stack.trim_end(), count.parse::<u64>().ok()?)))
                .filter(|(stack, _)| !stack.is_empty());
            let Some((stack, weight)) = parsed else {
                return Err(ParseFoldedError {
                    line: index + 1,
                    text: line.to_string(),
                });
            };
            let slot = stacks.stacks.entry(stack.to_string()).or_default();
            *slot = slot.saturating_add(weight);
        }
        Ok(stacks)
    }

    /// The folded text: one `STACK COUNT` line per stack, sorted.
    pub fn text(&self) -> &str {
        self.text.get_or_init(|| {
            let len = self.stacks.keys().map(|stack| stack.len() + 22).sum();
            let mut text = String::with_capacity(len);
            for (stack, weight) in self.iter() {
                text.push_str(stack);
                text.push(' ');
                text.push_str(itoa_u64(weight, &mut [0; 20]));
                text.push('\n');
            }
            text
        })
    }

    /// Writes the folded lines, sorted.
    pub fn write_to(&self, mut out: impl Write) -> io::Result<()> {
        out.write_all(self.text().as_bytes())
    }
}

impl fmt::Display for FoldedStacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// `value` in decimal, written at the end of `buf`; `format!` costs more per line.
fn itoa_u64(mut value: u64, buf: &mut [u8; 20]) -> &str {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[start..]).expect("ASCII digits")
}

/// Index of a frame name interned in a [`StackFolder`].
pub type FrameId = u32;

/// Builds [`FoldedStacks`] from stacks of interned frames. Profiles hold many stacks over
/// few distinct frames: each distinct name is sanitized once, stacks are summed by their
/// frame ids, and each distinct stack's text is built once at the end, instead of
/// allocating and copying every frame of every stack.
#[derive(Debug, Default)]
pub struct StackFolder {
    ids: HashMap<String, FrameId>,
    /// Sanitized names, by id.
    names: Vec<String>,
    stacks: HashMap<Vec<FrameId>, u64>,
}

impl StackFolder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of the frame named `name`.
    pub fn frame(&mut self, name: &str) -> FrameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = FrameId::try_from(self.names.len()).expect("fewer than 2^32 frame names");
        let mut sanitized = String::with_capacity(name.len());
        push_sanitized(&mut sanitized, name);
        self.names.push(sanitized);
        self.ids.insert(name.to_string(), id);
        id
    }

    /// The ids of `names`, in order.
    pub fn frames<S: AsRef<str>>(&mut self, names: &[S]) -> Vec<FrameId> {
        names.iter().map(|name| self.frame(name.as_ref())).collect()
    }

    /// Adds `weight` to the stack of `frames`, root first.
    pub fn add(&mut self, frames: &[FrameId], weight: u64) {
        if frames.is_empty() {
            // As in `FoldedStacks::add`: a stack with no frames still carries weight.
            let unknown = self.frame(UNKNOWN);
            return self.add(&[unknown], weight);
        }
        match self.stacks.get_mut(frames) {
            Some(slot) => *slot = slot.saturating_add(weight),
            None => {
                self.stacks.insert(frames.to_vec(), weight);
            }
        }
    }

    /// The folded stacks, each stack's summed weight converted by `weight` (e.g. from
    /// nanoseconds to microseconds, once per stack so rounding loses nothing).
    pub fn finish(self, weight: impl Fn(u64) -> u64) -> FoldedStacks {
        let mut stacks: Vec<(Vec<FrameId>, u64)> = self.stacks.into_iter().collect();
        // Sorted by frame ids in the order of their text: texts share long prefixes, so
        // sorting them compares far more bytes.
        stacks.sort_unstable_by(|(a, _), (b, _)| text_order(&self.names, a, b));
        let mut sorted: Vec<(String, u64)> = Vec::with_capacity(stacks.len());
        for (frames, sum) in stacks {
            let text = join_frames(&self.names, &frames);
            let weight = weight(sum);
            match sorted.last_mut() {
                // Distinct names that sanitize alike make the same text.
                Some((last, slot)) if *last == text => *slot = slot.saturating_add(weight),
                _ => sorted.push((text, weight)),
            }
        }
        FoldedStacks {
            stacks: sorted.into_iter().collect(),
            text: OnceLock::new(),
        }
    }
}

/// The folded text of `frames`.
fn join_frames(names: &[String], frames: &[FrameId]) -> String {
    let len = frames.iter().map(|&id| names[id as usize].len() + 1).sum();
    let mut text = String::with_capacity(len);
    for &id in frames {
        if !text.is_empty() {
            text.push(';');
        }
        text.push_str(&names[id as usize]);
    }
    text
}

/// How the folded texts of stacks `a` and `b` compare, from their frames: at the first
/// frame whose names differ, the first differing byte of the texts is in the names, or,
/// when one name is a prefix of the other, the `;` (or end of text) after the shorter.
fn text_order(names: &[String], a: &[FrameId], b: &[FrameId]) -> Ordering {
    for (index, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x == y {
            continue;
        }
        let (x, y) = (names[x as usize].as_bytes(), names[y as usize].as_bytes());
        if x == y {
            continue;
        }
        let common = x.iter().zip(y).take_while(|(p, q)| p == q).count();
        let next = |name: &[u8], frames: &[FrameId]| {
            name.get(common)
                .copied()
                .or((index + 1 < frames.len()).then_some(b';'))
        };
        return next(x, a).cmp(&next(y, b));
    }
    a.len().cmp(&b.len())
}

/// Appends `frame` to a folded stack: `;` would split the frame and control characters
/// would split the line, so they are replaced; a frame ending in ` 123` would be read
/// as a count by flame graph tools, so that space becomes `_`; an empty frame becomes
/// `[unknown]`.
fn push_sanitized(out: &mut String, frame: &str) {
    let frame = frame.trim();
    if frame.is_empty() {
        out.push_str(UNKNOWN);
        return;
    }
    let start = out.len();
    out.extend(frame.chars().map(|c| match c {
        ';' => ':',
        c if c.is_control() => ' ',
        c => c,
    }));
    if let Some(space) = out[start..].rfind(' ') {
        let tail = &out[start + space + 1..];
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '.') {
            out.replace_range(start + space..start + space + 1, "_");
        }
    }
}

/// Writes `stacks` as folded text to `path` (created like every output file, see
/// [`write_output`]).
pub fn write_folded(stacks: &FoldedStacks, path: &Path) -> io::Result<()> {
    write_output(path, |out| stacks.write_to(out))
}

/// Colors of a flame graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Palette {
    /// Red-yellow, the classic CPU flame graph.
    #[default]
    OnCpu,
    /// Blue, the convention for off-CPU (blocked time) flame graphs.
    OffCpu,
}

/// How to draw a flame graph.
#[derive(Clone, Copy, Debug)]
pub struct SvgOptions<'a> {
    pub title: &'a str,
    pub subtitle: Option<&'a str>,
    /// What the weights count, shown on hover: `"us"`, `"samples"`.
    pub count_name: &'a str,
    pub palette: Palette,
}

/// Writes `stacks` as an SVG flame graph to `path` (created like every output file, see
/// [`write_output`]). An empty profile still yields a valid SVG that says so, so
/// the output always exists; a warning is logged.
pub fn write_flamegraph_svg(
    stacks: &FoldedStacks,
    path: &Path,
    options: &SvgOptions<'_>,
) -> io::Result<()> {
    write_output(path, |out| render_flamegraph_svg(stacks, options, out))
}

/// Renders `stacks` as an SVG flame graph into `out`; see [`write_flamegraph_svg`].
pub fn render_flamegraph_svg(
    stacks: &FoldedStacks,
    options: &SvgOptions<'_>,
    mut out: impl Write,
) -> io::Result<()> {
    if stacks.total() == 0 {
        // inferno writes an error SVG and fails on empty input; say what happened instead.
        log::warn!("no samples collected for flame graph {:?}", options.title);
        return write_empty_svg(options.title, &mut out);
    }
    let mut opts = flamegraph::Options::default();
    opts.title = options.title.to_string();
    opts.subtitle = options.subtitle.map(str::to_string);
    opts.count_name = options.count_name.to_string();
    opts.colors = flamegraph::Palette::Basic(match options.palette {
        Palette::OnCpu => BasicPalette::Hot,
        Palette::OffCpu => BasicPalette::Io,
    });
    // Color by function name so the same function looks the same across runs.
    opts.hash = true;
    flamegraph::from_lines(&mut opts, stacks.text().lines(), out)
}

/// A small valid SVG with the title and "No samples collected".
fn write_empty_svg(title: &str, out: &mut impl Write) -> io::Result<()> {
    write!(
        out,
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="1200" height="90" viewBox="0 0 1200 90" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="100%" height="100%" fill="#f8f8f8"/>
<text x="600" y="30" text-anchor="middle" font-family="Verdana" font-size="17">{}</text>
<text x="600" y="65" text-anchor="middle" font-family="Verdana" font-size="14">No samples collected</text>
</svg>
"##,
        xml_escape(title)
    )
}

fn xml_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FoldedStacks {
        let mut stacks = FoldedStacks::new();
        stacks.add(["main", "run_loop", "epoll_wait"], 700);
        stacks.add(["main", "gc_collect"], 120);
        stacks.add(
            vec![
                "main".to_string(),
                "run_loop".to_string(),
                "epoll_wait".to_string(),
            ],
            5,
        );
        stacks
    }

    #[test]
    fn accumulates_and_sorts() {
        let stacks = sample();
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks.total(), 825);
        assert_eq!(
            stacks.to_string(),
            "main;gc_collect 120\nmain;run_loop;epoll_wait 705\n"
        );
    }

    #[test]
    fn folder_sorts_and_sums_like_folded_text() {
        // Names that are prefixes of others, with bytes below and above `;` after them.
        let names = [
            "a",
            "a-b",
            "a;b",
            "a:b",
            "ab",
            "a b",
            "b",
            "",
            "[unknown]",
            "a 12",
        ];
        let stacks: Vec<Vec<&str>> = (0..400usize)
            .map(|i| {
                (0..i % 4 + 1)
                    .map(|depth| names[(i * 7 + depth * (i / 4)) % names.len()])
                    .collect()
            })
            .collect();
        let mut folder = StackFolder::new();
        let mut expected = FoldedStacks::new();
        for (weight, stack) in stacks.iter().enumerate() {
            let ids: Vec<FrameId> = stack.iter().map(|name| folder.frame(name)).collect();
            folder.add(&ids, weight as u64);
            expected.add(stack, weight as u64);
        }
        let mut unique: Vec<Vec<FrameId>> = folder.stacks.keys().cloned().collect();
        unique.sort_unstable_by(|a, b| text_order(&folder.names, a, b));
        let texts: Vec<String> = unique
            .iter()
            .map(|f| join_frames(&folder.names, f))
            .collect();
        assert!(texts.is_sorted(), "{texts:#?}");
        folder.add(&[], 3);
        expected.add(Vec::<&str>::new(), 3);
        assert_eq!(folder.finish(|w| w).to_string(), expected.to_string());
    }

    #[test]
    fn sanitizes_frames() {
        let mut stacks = FoldedStacks::new();
        stacks.add(["a;b", "multi\nline", "", "  padded ", "Thread 12"], 1);
        stacks.add(Vec::<&str>::new(), 2);
        let text = stacks.to_string();
        assert_eq!(
            text,
            "[unknown] 2\na:b;multi line;[unknown];padded;Thread_12 1\n"
        );
    }

    #[test]
    fn folded_round_trip_through_a_file() {
        let stacks = sample();
        let dir = std::env::temp_dir().join(format!("tracer-folded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.folded");
        write_folded(&stacks, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(FoldedStacks::parse(&text).unwrap(), stacks);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn parse_rejects_garbage() {
        let err = FoldedStacks::parse("a;b 3\nno_count_here\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(FoldedStacks::parse(" 5").is_err());
        // Frames may contain spaces; only the last field is the count.
        let parsed = FoldedStacks::parse("main;operator new(unsigned long) 9\n\n").unwrap();
        assert_eq!(
            parsed.iter().collect::<Vec<_>>(),
            [("main;operator new(unsigned long)", 9)]
        );
    }

    #[test]
    fn svg_has_title_and_frames() {
        let mut svg = Vec::new();
        let options = SvgOptions {
            title: "Off-CPU <time>",
            subtitle: Some("pid 42"),
            count_name: "us",
            palette: Palette::OffCpu,
        };
        render_flamegraph_svg(&sample(), &options, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        assert!(svg.contains("Off-CPU &lt;time&gt;"));
        assert!(svg.contains("pid 42"));
        assert!(svg.contains("epoll_wait"));
        assert!(svg.contains("705 us"), "count name shown with the weight");
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn empty_profile_gives_valid_svg() {
        let dir = std::env::temp_dir().join(format!("tracer-empty-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.svg");
        let options = SvgOptions {
            title: "Wall & clock",
            subtitle: None,
            count_name: "samples",
            palette: Palette::OnCpu,
        };
        write_flamegraph_svg(&FoldedStacks::new(), &path, &options).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("No samples collected"));
        assert!(svg.contains("Wall &amp; clock"));
        assert!(svg.trim_end().ends_with("</svg>"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A fixed folded profile's SVG, byte for byte (tracer/tests/data; regenerate with
    /// TRACER_BLESS=1): colors come from the frame names (`hash`), nothing from the clock.
    #[test]
    fn svg_render_matches_the_golden_file() {
        let options = SvgOptions {
            title: "Off-CPU time",
            subtitle: Some("pid 42"),
            count_name: "us",
            palette: Palette::OffCpu,
        };
        let render = || {
            let mut svg = Vec::new();
            render_flamegraph_svg(&sample(), &options, &mut svg).unwrap();
            String::from_utf8(svg).unwrap()
        };
        let svg = render();
        assert_eq!(svg, render(), "the render is not deterministic");
        crate::golden::assert_golden("offcpu.svg", &svg);
    }
}
