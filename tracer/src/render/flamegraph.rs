//! Folded stacks (`frame;frame;frame COUNT`, the plain-text contract of flame graph
//! tools) and their rendering to an SVG flame graph with inferno.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use foldhash::HashMap;
use inferno::flamegraph::{self, color::BasicPalette};

use super::write_output;
use crate::{stacks::StackProfile, symbolize::UNKNOWN};

/// Weighted stacks in their folded form (root frame first, frames joined by `;`), as
/// the text flame graph tools read: one `STACK WEIGHT` line per distinct stack, sorted
/// by stack so output files are deterministic and inferno needs no re-sort. The text is
/// the whole store: a profile's folded text runs to hundreds of megabytes, and both the
/// folded file and inferno read it as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedStacks {
    text: String,
    /// Each line of `text`: where it starts, how long its stack is, and its weight.
    lines: Vec<FoldedLine>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FoldedLine {
    start: usize,
    stack_len: usize,
    weight: u64,
}

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

/// `profile` folded through a [`StackFolder`], from its interned frames: each distinct
/// frame name is looked up and sanitized once, not once per stack it is in.
fn fold_profile(
    profile: &StackProfile,
    weight_of: impl Fn(&crate::stacks::Weight) -> u64,
) -> FoldedStacks {
    let mut folder = StackFolder::new();
    let to_folder: Vec<FrameId> = profile
        .names()
        .iter()
        .map(|name| folder.frame(name))
        .collect();
    let unknown = folder.frame(UNKNOWN);
    // The profile's stacks are distinct already, so no map sums them here; those whose
    // names sanitize alike are summed once sorted. Their frames are all in one array,
    // each stack a slice of it: no allocation per stack.
    let mut frames = Vec::with_capacity(
        profile
            .interned()
            .map(|(stack, _)| stack.len().max(1))
            .sum(),
    );
    let mut ends = Vec::with_capacity(profile.len());
    for (stack, weight) in profile.interned() {
        match stack {
            // As in `StackFolder::add`: a stack with no frames still carries weight.
            [] => frames.push(unknown),
            stack => frames.extend(stack.iter().map(|&id| to_folder[id as usize])),
        }
        ends.push((frames.len(), weight_of(weight)));
    }
    let mut start = 0;
    let stacks = ends
        .into_iter()
        .map(|(end, weight)| {
            let stack = &frames[start..end];
            start = end;
            (stack, weight)
        })
        .collect();
    fold_interned(&folder.names, stacks)
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

    /// Stacks of frames, root (outermost caller) first, each with its weight; the
    /// weights of stacks that fold alike are summed. Frame names are sanitized so they
    /// cannot break the folded format; a stack with no frames still carries weight and
    /// stays visible, as one unknown frame.
    pub fn from_stacks<S, F>(stacks: S) -> Self
    where
        S: IntoIterator<Item = (F, u64)>,
        F: IntoIterator,
        F::Item: AsRef<str>,
    {
        let mut sorted: BTreeMap<String, u64> = BTreeMap::new();
        for (frames, weight) in stacks {
            let mut key = String::new();
            for frame in frames {
                if !key.is_empty() {
                    key.push(';');
                }
                push_sanitized(&mut key, frame.as_ref());
            }
            if key.is_empty() {
                key.push_str(UNKNOWN);
            }
            let slot = sorted.entry(key).or_default();
            *slot = slot.saturating_add(weight);
        }
        Self::from_sorted(
            sorted
                .iter()
                .map(|(stack, &weight)| (stack.as_str(), weight)),
        )
    }

    /// From stacks already folded and sorted; a stack equal to the one before it adds
    /// its weight to it.
    fn from_sorted<'s>(stacks: impl IntoIterator<Item = (&'s str, u64)>) -> Self {
        let mut folded = Self::default();
        for (stack, weight) in stacks {
            folded.push(stack, weight);
        }
        folded
    }

    /// Appends the line of `stack`, which sorts at or after the last line's stack.
    fn push(&mut self, stack: &str, weight: u64) {
        self.push_with(weight, |text| text.push_str(stack));
    }

    /// Appends a line whose stack `write_stack` appends to the text (written in place:
    /// a profile's text is hundreds of megabytes, not worth a copy).
    fn push_with(&mut self, weight: u64, write_stack: impl FnOnce(&mut String)) {
        let start = self.text.len();
        write_stack(&mut self.text);
        let stack_len = self.text.len() - start;
        if let Some(last) = self.lines.last_mut() {
            let (before, stack) = self.text.split_at(start);
            let last_stack = &before[last.start..last.start + last.stack_len];
            if last_stack == stack {
                // The last line ends the text before this stack: its weight is written
                // again, summed.
                last.weight = last.weight.saturating_add(weight);
                self.text.truncate(last.start + last.stack_len);
                push_weight(&mut self.text, last.weight);
                return;
            }
            debug_assert!(last_stack < stack, "folded stacks pushed out of order");
        }
        self.lines.push(FoldedLine {
            start,
            stack_len,
            weight,
        });
        push_weight(&mut self.text, weight);
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// True when no stack was added.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Sum of all weights.
    pub fn total(&self) -> u64 {
        self.lines
            .iter()
            .fold(0, |sum, line| sum.saturating_add(line.weight))
    }

    /// The folded stacks and their weights, sorted by stack.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.lines.iter().map(|line| {
            (
                &self.text[line.start..line.start + line.stack_len],
                line.weight,
            )
        })
    }

    /// Parses folded text as written by [`write_folded`] (or by other folded-stack
    /// tools): one `STACK COUNT` per line; blank lines are skipped.
    pub fn parse(text: &str) -> Result<Self, ParseFoldedError> {
        let mut stacks: BTreeMap<&str, u64> = BTreeMap::new();
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
            let slot = stacks.entry(stack).or_default();
            *slot = slot.saturating_add(weight);
        }
        Ok(Self::from_sorted(stacks))
    }

    /// The folded text: one `STACK COUNT` line per stack, sorted.
    pub fn text(&self) -> &str {
        &self.text
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
    /// Ids by sanitized name: names that sanitize alike share an id, so stacks fold
    /// alike exactly when their ids are equal.
    sanitized_ids: HashMap<String, FrameId>,
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
        let mut sanitized = String::with_capacity(name.len());
        push_sanitized(&mut sanitized, name);
        let id = match self.sanitized_ids.get(&sanitized) {
            Some(&id) => id,
            None => {
                let id = FrameId::try_from(self.names.len()).expect("fewer than 2^32 frame names");
                self.names.push(sanitized.clone());
                self.sanitized_ids.insert(sanitized, id);
                id
            }
        };
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
            // As in `FoldedStacks::from_stacks`: a stack with no frames still carries weight.
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
        let stacks = self
            .stacks
            .iter()
            .map(|(frames, &sum)| (frames.as_slice(), weight(sum)))
            .collect();
        fold_interned(&self.names, stacks)
    }
}

/// Profiles with more stacks than this are sorted and written in two halves, on two
/// threads: a big profile's folded text runs to hundreds of megabytes.
const FOLD_IN_HALVES_STACKS: usize = 20_000;

/// A stack of interned frames, root first, and its weight.
type IdStack<'s> = (&'s [FrameId], u64);

/// The folded stacks of `stacks`, frames of sanitized `names` by id (distinct names:
/// stacks fold alike exactly when their ids are equal): sorted by frame ids in the order
/// of their text (texts share long prefixes, so sorting them compares far more bytes),
/// equal stacks summed, then each stack's text built once, in that order.
fn fold_interned(names: &[String], mut stacks: Vec<IdStack>) -> FoldedStacks {
    let ranks = TextRanks::new(names);
    let order = |a: &IdStack, b: &IdStack| ranks.order(a.0, b.0);
    if stacks.len() <= FOLD_IN_HALVES_STACKS {
        stacks.sort_unstable_by(order);
        return fold_sorted(names, &summed(stacks.iter().copied()));
    }
    let half = stacks.len() / 2;
    let (left, right) = stacks.split_at_mut(half);
    std::thread::scope(|scope| {
        let sorting = scope.spawn(|| left.sort_unstable_by(order));
        right.sort_unstable_by(order);
        sorting
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
    let sorted = summed(merge_sorted(left, right, |a, b| order(a, b).is_le()).copied());
    fold_sorted(names, &sorted)
}

/// The stacks of `sorted`, with equal neighbours summed into one.
fn summed<'s>(sorted: impl Iterator<Item = IdStack<'s>>) -> Vec<IdStack<'s>> {
    let mut summed: Vec<IdStack> = Vec::new();
    for (frames, weight) in sorted {
        match summed.last_mut() {
            Some((last, sum)) if *last == frames => *sum = sum.saturating_add(weight),
            _ => summed.push((frames, weight)),
        }
    }
    summed
}

/// The items of sorted `a` and `b` in one sorted sequence.
fn merge_sorted<'t, T>(
    a: &'t [T],
    b: &'t [T],
    le: impl Fn(&T, &T) -> bool,
) -> impl Iterator<Item = &'t T> {
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if le(x, y) => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

/// The folded stacks of distinct `sorted` stacks. Each line's place is known from the
/// names' lengths, so the text is allocated once and, when large, written in two halves
/// on two threads.
fn fold_sorted(names: &[String], sorted: &[IdStack]) -> FoldedStacks {
    let mut lines = Vec::with_capacity(sorted.len());
    let mut len = 0;
    for &(frames, weight) in sorted {
        let stack_len = stack_len(names, frames);
        lines.push(FoldedLine {
            start: len,
            stack_len,
            weight,
        });
        // `STACK WEIGHT\n`
        len += stack_len + weight.checked_ilog10().map_or(1, |log| log as usize + 1) + 2;
    }
    // Zeroed memory this large comes untouched from the kernel: it is written only once.
    let mut text = vec![0u8; len];
    if sorted.len() <= FOLD_IN_HALVES_STACKS {
        write_lines(names, sorted, &mut text);
    } else {
        let half = sorted.len() / 2;
        let (first, second) = text.split_at_mut(lines[half].start);
        std::thread::scope(|scope| {
            let writing = scope.spawn(|| write_lines(names, &sorted[..half], first));
            write_lines(names, &sorted[half..], second);
            writing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        });
    }
    // SAFETY: every byte is zero or part of a whole `&str` or ASCII copied in: UTF-8
    // (checking the hundreds of megabytes again would cost a tenth of the fold).
    let text = unsafe { String::from_utf8_unchecked(text) };
    FoldedStacks { text, lines }
}

/// Writes the lines of `stacks` into `out`, exactly as long as they are.
fn write_lines(names: &[String], stacks: &[IdStack], out: &mut [u8]) {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    for &(frames, weight) in stacks {
        for (index, &id) in frames.iter().enumerate() {
            if index > 0 {
                put(b";");
            }
            put(names[id as usize].as_bytes());
        }
        put(b" ");
        put(itoa_u64(weight, &mut [0; 20]).as_bytes());
        put(b"\n");
    }
    debug_assert_eq!(at, out.len(), "folded line lengths miscounted");
}

/// Appends ` WEIGHT` and the end of the line.
fn push_weight(text: &mut String, weight: u64) {
    text.push(' ');
    text.push_str(itoa_u64(weight, &mut [0; 20]));
    text.push('\n');
}

/// The length of the folded text of `frames`.
fn stack_len(names: &[String], frames: &[FrameId]) -> usize {
    frames
        .iter()
        .map(|&id| names[id as usize].len() + 1)
        .sum::<usize>()
        - 1
}

/// Where each frame name sorts in folded text, so that stacks are ordered as their texts
/// are by comparing one number at the first frame where they differ, not the names'
/// bytes (they share long prefixes). A frame stands in its text as `NAME;` when another
/// follows it and as `NAME` when it ends the stack; names hold no `;` (sanitized), so no
/// `NAME;` is a prefix of another piece, and the first differing pieces of two stacks
/// compare as their texts do. Both pieces of every name are ranked: `inner` for `NAME;`,
/// `last` for `NAME`.
struct TextRanks {
    inner: Vec<u32>,
    last: Vec<u32>,
}

impl TextRanks {
    fn new(names: &[String]) -> Self {
        let piece = |&(id, inner): &(usize, bool)| names[id].bytes().chain(inner.then_some(b';'));
        let mut pieces: Vec<(usize, bool)> = (0..names.len())
            .flat_map(|id| [(id, false), (id, true)])
            .collect();
        pieces.sort_unstable_by(|a, b| piece(a).cmp(piece(b)));
        let mut ranks = Self {
            inner: vec![0; names.len()],
            last: vec![0; names.len()],
        };
        for (rank, (id, inner)) in pieces.into_iter().enumerate() {
            let rank = u32::try_from(rank).expect("fewer than 2^31 frame names");
            match inner {
                true => ranks.inner[id] = rank,
                false => ranks.last[id] = rank,
            }
        }
        ranks
    }

    /// How the folded texts of stacks `a` and `b` compare.
    fn order(&self, a: &[FrameId], b: &[FrameId]) -> Ordering {
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        if common == a.len().min(b.len()) {
            // One is the other followed by more frames (`P` before `P;...`), or equal.
            return a.len().cmp(&b.len());
        }
        let rank = |stack: &[FrameId]| {
            let id = stack[common] as usize;
            match common + 1 < stack.len() {
                true => self.inner[id],
                false => self.last[id],
            }
        };
        rank(a).cmp(&rank(b))
    }
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
    // The lines are sorted by stack already (see [`FoldedStacks`]): inferno's own sort of
    // the text, hundreds of megabytes of long shared prefixes, would only redo it.
    opts.no_sort = true;
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
        FoldedStacks::from_stacks([
            (vec!["main", "run_loop", "epoll_wait"], 700),
            (vec!["main", "gc_collect"], 120),
            (vec!["main", "run_loop", "epoll_wait"], 5),
        ])
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
        for (weight, stack) in stacks.iter().enumerate() {
            let ids: Vec<FrameId> = stack.iter().map(|name| folder.frame(name)).collect();
            folder.add(&ids, weight as u64);
        }
        let mut unique: Vec<Vec<FrameId>> = folder.stacks.keys().cloned().collect();
        let ranks = TextRanks::new(&folder.names);
        unique.sort_unstable_by(|a, b| ranks.order(a, b));
        let texts: Vec<String> = unique
            .iter()
            .map(|f| {
                let names: Vec<&str> = f
                    .iter()
                    .map(|&id| folder.names[id as usize].as_str())
                    .collect();
                names.join(";")
            })
            .collect();
        assert!(texts.is_sorted(), "{texts:#?}");
        folder.add(&[], 3);
        let expected = FoldedStacks::from_stacks(
            stacks
                .iter()
                .enumerate()
                .map(|(weight, stack)| (stack.clone(), weight as u64))
                .chain([(Vec::new(), 3)]),
        );
        assert_eq!(folder.finish(|w| w).to_string(), expected.to_string());
    }

    /// A profile big enough to be folded in two halves folds as one folded stack at a
    /// time would, with stacks that sanitize alike summed across the halves.
    #[test]
    fn big_profiles_fold_in_halves_alike() {
        let names = ["a", "a b", "a;b", "a:b", "a 1", "b", "ab", "", "\tb", "b\n"];
        let stacks: Vec<(Vec<&str>, u64)> = (0..FOLD_IN_HALVES_STACKS * 3)
            .map(|i| {
                let mut state = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as usize
                };
                let depth = next() % 8 + 1;
                let frames = (0..depth).map(|_| names[next() % names.len()]).collect();
                (frames, i as u64 % 13)
            })
            .collect();
        let mut folder = StackFolder::new();
        for (frames, weight) in &stacks {
            let ids = folder.frames(frames);
            folder.add(&ids, *weight);
        }
        let folded = folder.finish(|w| w);
        let expected = FoldedStacks::from_stacks(stacks);
        assert!(folded.len() > FOLD_IN_HALVES_STACKS, "{}", folded.len());
        assert_eq!(folded.text(), expected.text());
        assert_eq!(folded, expected);
    }

    #[test]
    fn sanitizes_frames() {
        let stacks = FoldedStacks::from_stacks([
            (vec!["a;b", "multi\nline", "", "  padded ", "Thread 12"], 1),
            (Vec::new(), 2),
        ]);
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
