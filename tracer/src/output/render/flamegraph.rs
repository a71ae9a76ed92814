//! Folded stacks (`frame;frame;frame COUNT`, the plain-text contract of flame graph
//! tools) and their rendering to an SVG flame graph with inferno.

use std::cmp::Ordering;
use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use foldhash::HashMap;
use inferno::flamegraph::{self, color::BasicPalette};

use super::write_output;
use crate::{stack::naming::StackProfile, stack::symbolize::UNKNOWN};

/// Weighted stacks in their folded form (root frame first, frames joined by `;`), as
/// the text flame graph tools read: one `STACK WEIGHT` line per distinct stack, sorted
/// by stack so output files are deterministic. Held as interned frames, not as text: a
/// profile's folded text runs to hundreds of megabytes, made only while it is written
/// out, a piece at a time; the flame graph needs only the frames wide enough to draw.
#[derive(Clone, Debug, Default)]
pub struct FoldedStacks {
    /// Frame names by id, sanitized and distinct: stacks fold alike exactly when their
    /// ids are equal.
    names: Vec<String>,
    /// The frames of every line, one line after another, root first.
    frames: Vec<FrameId>,
    lines: Vec<FoldedLine>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FoldedLine {
    /// Where its frames start in `frames`.
    first: usize,
    /// How many frames its stack has, and how many leading ones it shares with the line
    /// before it: the shape of the flame graph.
    frames: u32,
    shared: u32,
    weight: u64,
}

/// Equal when the text is.
impl PartialEq for FoldedStacks {
    fn eq(&self, other: &Self) -> bool {
        fn names<'a>(stacks: &'a FoldedStacks, line: &FoldedLine) -> Vec<&'a str> {
            stacks
                .stack(line)
                .iter()
                .map(|&id| stacks.names[id as usize].as_str())
                .collect()
        }
        self.lines.len() == other.lines.len()
            && self.lines.iter().zip(&other.lines).all(|(a, b)| {
                a.weight == b.weight && a.frames == b.frames && names(self, a) == names(other, b)
            })
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
/// rounded up, as [`crate::stack::naming::Weight::us`]).
impl From<&StackProfile> for FoldedStacks {
    fn from(profile: &StackProfile) -> Self {
        fold_profile(profile, crate::stack::naming::Weight::us)
    }
}

/// `profile` folded through a [`StackFolder`], from its interned frames: each distinct
/// frame name is looked up and sanitized once, not once per stack it is in.
fn fold_profile(
    profile: &StackProfile,
    weight_of: impl Fn(&crate::stack::naming::Weight) -> u64,
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
    fold_interned(std::mem::take(&mut folder.names), stacks)
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
        let mut folder = StackFolder::new();
        let mut ids = Vec::new();
        for (frames, weight) in stacks {
            ids.clear();
            ids.extend(frames.into_iter().map(|frame| folder.frame(frame.as_ref())));
            folder.add(&ids, weight);
        }
        folder.finish(|weight| weight)
    }

    /// The frame ids of line `line`, root first.
    fn stack(&self, line: &FoldedLine) -> &[FrameId] {
        &self.frames[line.first..line.first + line.frames as usize]
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
    pub fn iter(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.lines.iter().map(|line| {
            let mut text = Vec::new();
            self.push_stack(self.stack(line), &mut text);
            (Self::utf8(text), line.weight)
        })
    }

    /// Parses folded text as written by [`write_folded`] (or by other folded-stack
    /// tools): one `STACK COUNT` per line; blank lines are skipped. Frames are kept as
    /// they are written.
    pub fn parse(text: &str) -> Result<Self, ParseFoldedError> {
        let mut ids: HashMap<&str, FrameId> = HashMap::default();
        let mut names: Vec<String> = Vec::new();
        let mut stacks: HashMap<Vec<FrameId>, u64> = HashMap::default();
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
            let frames = stack
                .split(';')
                .map(|name| {
                    *ids.entry(name).or_insert_with(|| {
                        names.push(name.to_string());
                        count_u32(names.len() - 1)
                    })
                })
                .collect();
            let slot = stacks.entry(frames).or_default();
            *slot = slot.saturating_add(weight);
        }
        let stacks = stacks
            .iter()
            .map(|(frames, &weight)| (frames.as_slice(), weight))
            .collect();
        Ok(fold_interned(names, stacks))
    }

    /// The lines inferno draws the same flame graph from as from all of them, given that
    /// it leaves out every frame narrower than `min_time` (its `min_width`, in weight).
    ///
    /// A frame's width is the summed weight of the run of lines whose stacks pass
    /// through it, and a frame is never wider than its parent: so each stack is cut
    /// after its last frame wide enough to be drawn (its root frame is always kept),
    /// and neighbours cut alike are summed. Every drawn frame keeps its place and width
    /// and ends at the same line change as before, so the SVG is the same byte for byte;
    /// inferno merges a few thousand lines instead of hundreds of thousands.
    fn drawn_lines(&self, min_time: f64) -> String {
        let lines = &self.lines;
        // Frames of each line that are drawn, found as each frame's run of lines ends.
        let mut drawn = vec![1u32; lines.len()];
        // The open frames, by depth: the first line of each and the weight before it.
        let mut open: Vec<(usize, u64)> = Vec::new();
        let mut before = 0u64;
        let mut close = |open: &mut Vec<(usize, u64)>, depth: usize, end: usize, at: u64| {
            while open.len() > depth {
                let (start, from) = open.pop().expect("an open frame");
                // As inferno: `(end_time - start_time) as f64 < minwidth_time` is left out.
                if (at - from) as f64 >= min_time {
                    let frames = count_u32(open.len() + 1);
                    for kept in &mut drawn[start..end] {
                        *kept = (*kept).max(frames);
                    }
                }
            }
        };
        for (index, line) in lines.iter().enumerate() {
            let shared = if index == 0 { 0 } else { line.shared as usize };
            close(&mut open, shared, index, before);
            while open.len() < line.frames as usize {
                open.push((index, before));
            }
            before += line.weight;
        }
        close(&mut open, 0, lines.len(), before);

        // Each line cut to its drawn frames; neighbours cut alike (as many frames kept,
        // all of them shared) summed.
        let mut cut: Vec<(&[FrameId], u64)> = Vec::new();
        let mut last_kept = 0;
        for (index, line) in lines.iter().enumerate() {
            let kept = drawn[index].min(line.frames);
            let same = index > 0 && kept == last_kept && line.shared >= kept;
            last_kept = kept;
            match cut.last_mut() {
                Some((_, weight)) if same => *weight += line.weight,
                _ => cut.push((&self.stack(line)[..kept as usize], line.weight)),
            }
        }
        let mut text = Vec::new();
        for (stack, weight) in cut {
            self.push_stack(stack, &mut text);
            push_weight(&mut text, weight);
        }
        Self::utf8(text)
    }

    /// Appends the text of the stack of `frames`: their names joined by `;`.
    fn push_stack(&self, frames: &[FrameId], out: &mut Vec<u8>) {
        for (index, &id) in frames.iter().enumerate() {
            if index > 0 {
                out.push(b';');
            }
            out.extend_from_slice(self.names[id as usize].as_bytes());
        }
    }

    /// Appends the folded lines of `lines`.
    fn push_lines(&self, lines: &[FoldedLine], out: &mut Vec<u8>) {
        for line in lines {
            self.push_stack(self.stack(line), out);
            push_weight(out, line.weight);
        }
    }

    /// Text made of names (each a whole `&str`), `;`, spaces, digits and newlines.
    fn utf8(text: Vec<u8>) -> String {
        String::from_utf8(text).expect("folded text is made of whole names and ASCII")
    }

    /// Writes the folded lines, sorted. A big profile's text is made a piece at a time on
    /// another thread while this one writes the piece before: never all of it in memory,
    /// and the copy into the file overlaps the making.
    pub fn write_to(&self, mut out: impl Write) -> io::Result<()> {
        if self.lines.len() <= 2 * WRITE_CHUNK_LINES {
            let mut text = Vec::new();
            self.push_lines(&self.lines, &mut text);
            return out.write_all(&text);
        }
        let (made, to_write) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
        let (written, to_reuse) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for lines in self.lines.chunks(WRITE_CHUNK_LINES) {
                    let mut text = to_reuse.try_recv().unwrap_or_default();
                    text.clear();
                    self.push_lines(lines, &mut text);
                    if made.send(text).is_err() {
                        // The writer stopped at an error.
                        break;
                    }
                }
            });
            for text in to_write {
                out.write_all(&text)?;
                let _ = written.send(text);
            }
            Ok(())
        })
    }
}

/// Lines of folded text made at a time while a big profile is written (about a megabyte).
const WRITE_CHUNK_LINES: usize = 2048;

impl fmt::Display for FoldedStacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = Vec::new();
        self.push_lines(&self.lines, &mut text);
        f.write_str(&Self::utf8(text))
    }
}

/// A count of frames, which no stack has 2^32 of.
fn count_u32(count: usize) -> u32 {
    u32::try_from(count).expect("fewer than 2^32 frames in a stack")
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
pub(crate) type FrameId = u32;

/// Builds [`FoldedStacks`] from stacks of interned frames. Profiles hold many stacks over
/// few distinct frames: each distinct name is sanitized once, stacks are summed by their
/// frame ids, and each distinct stack's text is built once at the end, instead of
/// allocating and copying every frame of every stack.
#[derive(Debug, Default)]
pub(crate) struct StackFolder {
    ids: HashMap<String, FrameId>,
    /// Ids by sanitized name: names that sanitize alike share an id, so stacks fold
    /// alike exactly when their ids are equal.
    sanitized_ids: HashMap<String, FrameId>,
    /// Sanitized names, by id.
    names: Vec<String>,
    stacks: HashMap<Vec<FrameId>, u64>,
}

impl StackFolder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The id of the frame named `name`.
    pub(crate) fn frame(&mut self, name: &str) -> FrameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let mut sanitized = String::with_capacity(name.len());
        push_sanitized(&mut sanitized, name);
        let id = if let Some(&id) = self.sanitized_ids.get(&sanitized) {
            id
        } else {
            let id = FrameId::try_from(self.names.len()).expect("fewer than 2^32 frame names");
            self.names.push(sanitized.clone());
            self.sanitized_ids.insert(sanitized, id);
            id
        };
        self.ids.insert(name.to_string(), id);
        id
    }

    /// The ids of `names`, in order.
    #[cfg(test)]
    pub(crate) fn frames<S: AsRef<str>>(&mut self, names: &[S]) -> Vec<FrameId> {
        names.iter().map(|name| self.frame(name.as_ref())).collect()
    }

    /// Adds `weight` to the stack of `frames`, root first.
    pub(crate) fn add(&mut self, frames: &[FrameId], weight: u64) {
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
    pub(crate) fn finish(self, weight: impl Fn(u64) -> u64) -> FoldedStacks {
        let Self { names, stacks, .. } = self;
        let stacks = stacks
            .iter()
            .map(|(frames, &sum)| (frames.as_slice(), weight(sum)))
            .collect();
        fold_interned(names, stacks)
    }
}

/// Profiles with more stacks than this are sorted in two halves, on two threads.
const FOLD_IN_HALVES_STACKS: usize = 20_000;

/// A stack of interned frames, root first, and its weight.
type IdStack<'s> = (&'s [FrameId], u64);

/// The folded stacks of `stacks`, frames of sanitized `names` by id (distinct names:
/// stacks fold alike exactly when their ids are equal): sorted by frame ids in the order
/// of their text (texts share long prefixes, so sorting them compares far more bytes),
/// equal stacks summed.
fn fold_interned(names: Vec<String>, mut stacks: Vec<IdStack>) -> FoldedStacks {
    let ranks = TextRanks::new(&names);
    let order = |a: &IdStack, b: &IdStack| ranks.order(a.0, b.0);
    if stacks.len() <= FOLD_IN_HALVES_STACKS {
        stacks.sort_unstable_by(order);
        return from_sorted(names, &summed(stacks.iter().copied()));
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
    from_sorted(names, &sorted)
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

/// The folded stacks of distinct `sorted` stacks, frames of `names` by id.
fn from_sorted(names: Vec<String>, sorted: &[IdStack]) -> FoldedStacks {
    let mut frames = Vec::with_capacity(sorted.iter().map(|(stack, _)| stack.len()).sum());
    let mut lines = Vec::with_capacity(sorted.len());
    let mut last: &[FrameId] = &[];
    for &(stack, weight) in sorted {
        let shared = last.iter().zip(stack).take_while(|(a, b)| a == b).count();
        last = stack;
        lines.push(FoldedLine {
            first: frames.len(),
            frames: count_u32(stack.len()),
            shared: count_u32(shared),
            weight,
        });
        frames.extend_from_slice(stack);
    }
    FoldedStacks {
        names,
        frames,
        lines,
    }
}

/// Appends ` WEIGHT` and the end of the line.
fn push_weight(text: &mut Vec<u8>, weight: u64) {
    text.push(b' ');
    text.extend_from_slice(itoa_u64(weight, &mut [0; 20]).as_bytes());
    text.push(b'\n');
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
            out.replace_range((start + space)..=(start + space), "_");
        }
    }
}

/// Writes `stacks` as folded text to `path` (created like every output file, see
/// [`write_output`]).
pub(crate) fn write_folded(stacks: &FoldedStacks, path: &Path) -> io::Result<()> {
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
    if stacks.total() == 0 {
        log::warn!(
            "{}: no samples, so the flame graph \"{}\" is empty",
            path.display(),
            options.title
        );
    }
    write_output(path, |out| render_flamegraph_svg(stacks, options, out))
}

/// Renders `stacks` as an SVG flame graph into `out`; see [`write_flamegraph_svg`].
pub(crate) fn render_flamegraph_svg(
    stacks: &FoldedStacks,
    options: &SvgOptions<'_>,
    mut out: impl Write,
) -> io::Result<()> {
    if stacks.total() == 0 {
        // inferno writes an error SVG and fails on empty input; an empty graph says why.
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
    // inferno's own threshold (`minwidth_time`), computed as it does.
    let min_time = opts.min_width / (100.0 / stacks.total() as f64);
    let drawn = stacks.drawn_lines(min_time);
    // Cut stacks are in the order of the whole ones, which is not always the order of
    // their own text (`a;b;c` sorts after `a;b-c`, `a;b` before it): inferno is told to
    // draw the lines in the order given (a flame chart, which it reads last line first),
    // with its frames merged as a flame graph's, since the order is the sorted one.
    opts.flame_chart = true;
    let mut lines: Vec<&str> = drawn.lines().collect();
    lines.reverse();
    flamegraph::from_lines(&mut opts, lines, out)
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
                (0..=(i % 4))
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
        assert_eq!(folded.to_string(), expected.to_string());
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
            [("main;operator new(unsigned long)".to_string(), 9)]
        );
    }

    /// The lines the flame graph is drawn from are cut to the frames inferno draws:
    /// the SVG is the one inferno draws from all the lines itself, byte for byte, with
    /// names whose order as text differs from their order as pieces of a stack (`-`,
    /// `:`, `.` and digits sort below `;`), weights from 1 to thousands, and widths
    /// around inferno's threshold.
    #[test]
    fn drawn_lines_draw_what_all_lines_draw() {
        let names = ["a", "a-b", "a:b", "a.1", "ab", "b", "a0", "c", "c;d", "zz"];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..6 {
            let stacks: Vec<(Vec<&str>, u64)> = (0..3000)
                .map(|_| {
                    let depth = next() % 9 + 1;
                    let frames = (0..depth)
                        .map(|_| names[(next() % names.len() as u64) as usize])
                        .collect();
                    // Mostly tiny weights, a few big: many frames near the threshold.
                    let weight = match next() % 50 {
                        0 => next() % 5000 + 1,
                        _ => next() % (4 << round) + 1,
                    };
                    (frames, weight)
                })
                .collect();
            let folded = FoldedStacks::from_stacks(stacks);
            let options = SvgOptions {
                title: "t",
                subtitle: None,
                count_name: "us",
                palette: Palette::OnCpu,
            };
            let mut ours = Vec::new();
            render_flamegraph_svg(&folded, &options, &mut ours).unwrap();
            let mut opts = flamegraph::Options::default();
            opts.title = "t".to_string();
            opts.count_name = "us".to_string();
            opts.colors = flamegraph::Palette::Basic(BasicPalette::Hot);
            opts.hash = true;
            let text = folded.to_string();
            let mut inferno = Vec::new();
            flamegraph::from_lines(&mut opts, text.lines(), &mut inferno).unwrap();
            let min_time = opts.min_width / (100.0 / folded.total() as f64);
            let drawn = folded.drawn_lines(min_time);
            assert!(
                drawn.lines().count() < folded.len(),
                "round {round}: nothing was cut"
            );
            assert!(
                ours == inferno,
                "round {round}: the SVGs differ ({} and {} bytes)",
                ours.len(),
                inferno.len()
            );
        }
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
        crate::output::golden::assert_golden("offcpu.svg", &svg);
    }
}
