//! `bench-render`: figure 5 of `cargo xtask bench`: the time the tracer takes to turn an
//! off-CPU profile into its output files (symbolize, fold, render the SVG), against
//! inferno alone rendering the same folded stacks.
//!
//! ```text
//! bench-render [--samples N] [--stacks S] [--rounds R] [--dir DIR]
//! ```
//! Builds a synthetic profile shaped like what the kernel hands `tracer attach`: S
//! distinct (thread, user stack, kernel stack) keys (default 200 000) carrying N blocked
//! intervals in all (default 1 000 000, skewed: a few keys hold most of them). The stacks
//! are real addresses, so symbolization does real work: user frames are addresses in this
//! program's own executable mappings (itself, libc, ld.so), kernel frames are addresses of
//! kernel functions from /proc/kallsyms (needs root to see them). Stacks are random walks
//! of a fixed call graph, so they share prefixes as real ones do.
//!
//! Each round (default 3) alternates two measurements, each started with the files it
//! writes removed and the disk synced (no write-back of another round's files under way):
//! - tracer: exactly what `tracer attach` does once tracing stops, through the `tracer`
//!   library: `wallclock::build_profile` (symbolize every stack with a fresh
//!   `StackSymbolizer`, fold), then `write_folded_view` (the folded file and the SVG,
//!   written together as every view is); then, apart from the total, the SVG alone again;
//! - inferno: `inferno::flamegraph::from_lines` with the same options on the folded text the
//!   tracer wrote (read beforehand, not timed), into a file.
//!
//! Prints one JSON line: `{"samples":N,"keys":S,"folded_stacks":F,"folded_bytes":B,
//! "svg_bytes":V,"tracer_ns":[..],"symbolize_ns":[..],"files_ns":[..],
//! "render_ns":[..],"inferno_ns":[..]}` (`symbolize_ns` is `build_profile`, `files_ns`
//! `write_folded_view`, `render_ns` the tracer's SVG step alone, each per round).

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use inferno::flamegraph::{self, color::BasicPalette};
use tests::{Args, json_array, print_line};
use tracer::for_bench::{
    BuildOptions, FoldedStacks, GroupBy, Palette, Processes, RawProfile, StackSource,
    StackSymbolizer, SvgOptions, build_profile, write_flamegraph_svg, write_folded_view,
};
use tracer_common::{OffCpuKey, OffCpuTotal, StackKey};

const TITLE: &str = "Off-CPU time of bench-render";
const COUNT_NAME: &str = "us";

/// splitmix64: small, fast and reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// A call graph over a pool of addresses: node `i` calls a few fixed other nodes.
struct CallGraph {
    addrs: Vec<u64>,
    fanout: u64,
    salt: u64,
}

impl CallGraph {
    fn callee(&self, node: usize, choice: u64) -> usize {
        let mut rng = Rng(self.salt ^ (node as u64).wrapping_mul(31) ^ choice.wrapping_mul(7919));
        rng.below(self.addrs.len() as u64) as usize
    }

    /// A random walk of `depth` frames from `root`, innermost first (as the kernel stores
    /// stacks).
    fn stack(&self, rng: &mut Rng, root: usize, depth: u64) -> Vec<u64> {
        let mut node = root;
        let mut frames = vec![self.addrs[node]];
        for _ in 1..depth {
            node = self.callee(node, rng.below(self.fanout));
            frames.push(self.addrs[node]);
        }
        frames.reverse();
        frames
    }
}

/// Distinct stacks from `graph`, `count` of them, depths in `depths`.
fn distinct_stacks(
    graph: &CallGraph,
    rng: &mut Rng,
    count: usize,
    roots: usize,
    depths: (u64, u64),
) -> Vec<Vec<u64>> {
    let mut seen = HashSet::new();
    let mut stacks = Vec::with_capacity(count);
    let mut attempts = 0usize;
    while stacks.len() < count {
        attempts += 1;
        assert!(
            attempts < count * 100,
            "the call graph is too small for {count} distinct stacks"
        );
        let root = rng.below(roots as u64) as usize;
        let depth = rng.range(depths.0, depths.1);
        let stack = graph.stack(rng, root, depth);
        if seen.insert(stack.clone()) {
            stacks.push(stack);
        }
    }
    stacks
}

/// Addresses inside the executable file mappings of this process.
fn user_address_pool(rng: &mut Rng, count: usize) -> Result<Vec<u64>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut ranges = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let path = fields.nth(3).unwrap_or("");
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let (start, end) = range.split_once('-').context("maps range")?;
        ranges.push((
            u64::from_str_radix(start, 16)?,
            u64::from_str_radix(end, 16)?,
        ));
    }
    if ranges.is_empty() {
        bail!("no executable file mapping in /proc/self/maps");
    }
    let total: u64 = ranges.iter().map(|(s, e)| e - s).sum();
    Ok((0..count)
        .map(|_| {
            let mut at = rng.below(total);
            for &(start, end) in &ranges {
                if at < end - start {
                    return start + at;
                }
                at -= end - start;
            }
            unreachable!("the offset is below the total size")
        })
        .collect())
}

/// Addresses inside kernel text functions, from /proc/kallsyms.
fn kernel_address_pool(rng: &mut Rng, count: usize) -> Result<Vec<u64>> {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms")?;
    let functions: Vec<u64> = kallsyms
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let module = fields.nth(1);
            (addr != 0 && (kind == "t" || kind == "T") && module.is_none()).then_some(addr)
        })
        .collect();
    if functions.len() < 1000 {
        bail!("/proc/kallsyms shows no kernel addresses (run as root)");
    }
    Ok((0..count)
        .map(|_| functions[rng.below(functions.len() as u64) as usize] + rng.range(4, 64))
        .collect())
}

/// The stacks of the synthetic profile, as the kernel's stack map would return them.
struct Stacks(HashMap<i32, Vec<u64>>);

impl StackSource for Stacks {
    fn stack(&self, id: tracer_common::StackId) -> Vec<u64> {
        self.0.get(&id.raw()).cloned().unwrap_or_default()
    }
}

struct Profile {
    totals: Vec<(StackKey, OffCpuTotal)>,
    stacks: Stacks,
}

fn synthesize(samples: u64, keys: usize) -> Result<Profile> {
    let mut rng = Rng(0x5eed);
    let user_graph = CallGraph {
        addrs: user_address_pool(&mut rng, 20_000)?,
        fanout: 6,
        salt: 1,
    };
    let kernel_graph = CallGraph {
        addrs: kernel_address_pool(&mut rng, 600)?,
        fanout: 3,
        salt: 2,
    };
    // Fewer distinct user and kernel stacks than keys: keys combine them per thread.
    let user = distinct_stacks(&user_graph, &mut rng, (keys / 4).max(1), 8, (4, 16));
    let kernel = distinct_stacks(&kernel_graph, &mut rng, (keys / 200).max(1), 4, (4, 9));
    let kernel_base = user.len() as i32;
    let mut stacks = HashMap::new();
    for (id, stack) in user.into_iter().enumerate() {
        stacks.insert(id as i32, stack);
    }
    for (id, stack) in kernel.iter().enumerate() {
        stacks.insert(kernel_base + id as i32, stack.clone());
    }

    let tgid = std::process::id();
    let mut seen = HashSet::new();
    let mut chosen = Vec::with_capacity(keys);
    while chosen.len() < keys {
        let key = OffCpuKey {
            tgid,
            tid: tgid + rng.below(16) as u32,
            user_stack_id: rng.below(kernel_base as u64) as i32,
            kernel_stack_id: kernel_base + rng.below(kernel.len() as u64) as i32,
            state: 0,
        };
        if seen.insert(key) {
            chosen.push(key);
        }
    }
    // Every key blocked at least once; the rest of the samples go mostly to a few keys.
    let mut counts = vec![1u64; keys];
    let mut left = samples.saturating_sub(keys as u64);
    while left > 0 {
        // The minimum of three uniform draws: skewed towards small indices.
        let index = rng
            .below(keys as u64)
            .min(rng.below(keys as u64))
            .min(rng.below(keys as u64));
        let extra = left.min(rng.range(1, 8));
        counts[index as usize] += extra;
        left -= extra;
    }
    let totals = chosen
        .into_iter()
        .zip(counts)
        .map(|(key, count)| {
            let total_ns = (0..count.min(16))
                .map(|_| rng.range(2_000, 2_000_000))
                .sum::<u64>()
                * count.div_ceil(16);
            (StackKey::from(key), OffCpuTotal { total_ns, count })
        })
        .collect();
    Ok(Profile {
        totals,
        stacks: Stacks(stacks),
    })
}

fn svg_options(subtitle: &str) -> SvgOptions<'_> {
    SvgOptions {
        title: TITLE,
        subtitle: Some(subtitle),
        count_name: COUNT_NAME,
        palette: Palette::OffCpu,
    }
}

/// inferno alone, with the options `render::flamegraph` gives it.
fn inferno_render(folded: &str, subtitle: &str, path: &Path) -> Result<()> {
    let mut opts = flamegraph::Options::default();
    opts.title = TITLE.to_string();
    opts.subtitle = Some(subtitle.to_string());
    opts.count_name = COUNT_NAME.to_string();
    opts.colors = flamegraph::Palette::Basic(BasicPalette::Io);
    opts.hash = true;
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    flamegraph::from_lines(&mut opts, folded.lines(), &mut out)?;
    out.flush()?;
    Ok(())
}

/// Before a timed step: its output files of an earlier round removed and everything
/// written so far on disk, so that no step pays for deleting another round's hundreds of
/// megabytes or for their write-back, and each writes into the directory as a first run
/// does.
fn settle(outputs: &[&Path]) {
    for path in outputs {
        let _ = std::fs::remove_file(path);
    }
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut samples: u64 = 1_000_000;
    let mut keys: usize = 200_000;
    let mut rounds: usize = 3;
    let mut dir: Option<PathBuf> = None;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--samples" => samples = args.value(&flag)?,
            "--stacks" => keys = args.value(&flag)?,
            "--rounds" => rounds = args.value(&flag)?,
            "--dir" => dir = Some(args.value(&flag)?),
            _ => bail!("unknown flag {flag}"),
        }
    }
    if keys == 0 || samples < keys as u64 {
        bail!("need at least one stack and at least as many samples as stacks");
    }
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("tracer-bench-render"));
    std::fs::create_dir_all(&dir)?;
    let folded_path = dir.join("tracer.folded");
    let svg_path = dir.join("tracer.svg");
    let inferno_path = dir.join("inferno.svg");
    let render_path = dir.join("render-alone.svg");

    let profile = synthesize(samples, keys)?;
    let mut processes = Processes::default();
    processes.observe(std::process::id());
    let raw = RawProfile {
        offcpu: profile.totals.clone(),
        ..RawProfile::default()
    };
    let subtitle = format!("{samples} blocked intervals");

    let mut tracer_ns = Vec::new();
    let mut symbolize_ns = Vec::new();
    let mut files_ns = Vec::new();
    let mut render_ns = Vec::new();
    let mut inferno_ns = Vec::new();
    let mut folded_stacks = 0;
    for round in 0..rounds {
        let mut tracer_round = || -> Result<()> {
            settle(&[&folded_path, &svg_path]);
            let start = Instant::now();
            let mut symbolizer = StackSymbolizer::new();
            let built = build_profile(
                &raw,
                BuildOptions {
                    frequency_hz: 99,
                    per_thread: false,
                    group_by: GroupBy::Process,
                },
                &profile.stacks,
                &mut symbolizer,
                &processes,
            );
            let built_folded = FoldedStacks::from(&built.offcpu);
            let symbolized = Instant::now();
            // As a view is written: the folded file and the SVG together.
            write_folded_view(&built_folded, &dir, "tracer", &svg_options(&subtitle))?;
            let end = Instant::now();
            tracer_ns.push((end - start).as_nanos());
            symbolize_ns.push((symbolized - start).as_nanos());
            files_ns.push((end - symbolized).as_nanos());
            // The render step alone, against inferno's: not part of the total.
            let render = Instant::now();
            write_flamegraph_svg(&built_folded, &render_path, &svg_options(&subtitle))?;
            render_ns.push(render.elapsed().as_nanos());
            folded_stacks = built_folded.len();
            Ok(())
        };
        // The first round needs the tracer's folded file; later ones alternate the order.
        if round % 2 == 0 {
            tracer_round()?;
        }
        let text = std::fs::read_to_string(&folded_path)?;
        settle(&[&inferno_path]);
        let start = Instant::now();
        inferno_render(&text, &subtitle, &inferno_path)?;
        inferno_ns.push(start.elapsed().as_nanos());
        drop(text);
        if round % 2 == 1 {
            tracer_round()?;
        }
    }

    let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
    // The tracer hands inferno its lines as sorted (no re-sort): the picture must be the
    // one inferno draws after sorting them itself.
    let same_svg = std::fs::read(&svg_path)? == std::fs::read(&inferno_path)?;
    print_line(&format!(
        r#"{{"samples":{samples},"keys":{keys},"folded_stacks":{folded_stacks},"folded_bytes":{},"svg_bytes":{},"inferno_svg_bytes":{},"same_svg":{same_svg},"tracer_ns":{},"symbolize_ns":{},"files_ns":{},"render_ns":{},"inferno_ns":{}}}"#,
        size(&folded_path),
        size(&svg_path),
        size(&inferno_path),
        json_array(&tracer_ns),
        json_array(&symbolize_ns),
        json_array(&files_ns),
        json_array(&render_ns),
        json_array(&inferno_ns),
    ))?;
    for path in [&folded_path, &svg_path, &inferno_path, &render_path] {
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}
