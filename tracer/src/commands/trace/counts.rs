//! `trace --count`: hits per probe as bpftrace prints them, and with `--stack` the most
//! frequent stacks, written as a flame graph too.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Result;
use tracer_common::StackId;

use super::hit_stacks::{FrameJson, StackNamer, stack_json, stack_text};
use crate::{
    cli::{Format, TraceConfig},
    kernel::Loader,
    output::render,
    probe::plan::ProbePlan,
    stack::naming::{self, HitStack, StackProfile, Weight},
    system::text::escape_text,
};

/// `trace --count --stack --format json`. Fields in name order, as the document was first
/// written (serde_json's maps sort their keys).
#[derive(serde::Serialize)]
struct CountsByStackJson<'a> {
    folded: &'a Path,
    /// Hits counted by probe but not by stack, as `[probe, hits]` pairs.
    not_counted_by_stack: &'a [(String, u64)],
    /// Hits by probe.
    probes: BTreeMap<String, u64>,
    stacks: Vec<StackCountJson<'a>>,
    svg: &'a Path,
}

#[derive(serde::Serialize)]
struct StackCountJson<'a> {
    count: u64,
    probe: String,
    stack: Vec<FrameJson<'a>>,
    stack_problems: &'a [String],
}

/// Hits per probe, as bpftrace prints `@[probe] = count()` (or one JSON object); with
/// `by_stack`, then the most frequent stacks as bpftrace prints `@[ustack] = count()`
/// (in JSON, `{"probes": {...}, "stacks": [...]}`).
pub(super) fn count_text(
    loader: &Loader,
    plan: &ProbePlan,
    format: Format,
    by_stack: Option<&StackCounts>,
) -> Result<String> {
    let mut counts = Vec::new();
    for (id, probe) in plan.probes.iter().enumerate() {
        counts.push((probe.specifier(), loader.probe_hits(id as u32)?.count));
    }
    let mut text = String::new();
    match format {
        Format::Json => {
            let probes: BTreeMap<String, u64> = counts.into_iter().collect();
            text = match by_stack {
                None => serde_json::to_string(&probes)?,
                Some(by_stack) => serde_json::to_string(&CountsByStackJson {
                    folded: &by_stack.files.folded,
                    not_counted_by_stack: &by_stack.not_counted,
                    probes,
                    stacks: by_stack
                        .stacks
                        .iter()
                        .map(|s| StackCountJson {
                            count: s.count,
                            probe: plan.probes[s.probe_id as usize].specifier(),
                            stack: stack_json(&s.stack),
                            stack_problems: &s.stack.problems,
                        })
                        .collect(),
                    svg: &by_stack.files.svg,
                })?,
            } + "\n";
        }
        Format::Text => {
            counts.sort_by_key(|&(_, n)| n);
            for (probe, n) in counts {
                text += &format!("@[{}]: {n}\n", escape_text(&probe));
            }
            if let Some(by_stack) = by_stack {
                text += &by_stack.text(plan);
            }
        }
    }
    Ok(text)
}

/// How many of the most frequent stacks the text summary shows.
pub(super) const TOP_STACKS: usize = 10;

/// Hits counted by stack (`--count --stack`): most frequent first, with the files
/// written.
pub(super) struct StackCounts {
    pub(super) stacks: Vec<CountedStack>,
    /// Hits of the probe the stack map had no room to count by stack, per probe name.
    pub(super) not_counted: Vec<(String, u64)>,
    pub(super) files: render::ViewFiles,
}

pub(super) struct CountedStack {
    pub(super) probe_id: u32,
    pub(super) count: u64,
    pub(super) stack: HitStack,
}

impl StackCounts {
    pub(super) fn text(&self, plan: &ProbePlan) -> String {
        let mut text = format!(
            "\n{} distinct stacks; flame graph {}, folded stacks {}\n",
            self.stacks.len(),
            self.files.svg.display(),
            self.files.folded.display()
        );
        if self.stacks.len() > TOP_STACKS {
            text += &format!("The {TOP_STACKS} most frequent:\n");
        }
        // Least frequent first, as bpftrace prints maps: the top one is nearest the prompt.
        for counted in self.stacks.iter().take(TOP_STACKS).rev() {
            let probe = plan.probes[counted.probe_id as usize].specifier();
            text += &format!("@[{},\n", escape_text(&probe));
            text += &stack_text(&counted.stack, "    ");
            text += &format!("]: {}\n", counted.count);
        }
        for (probe, n) in &self.not_counted {
            text += &format!(
                "{n} hits of {} not counted by stack: no room in the kernel's stack count map \
                 (or, with --unwind dwarf, its event ring)\n",
                escape_text(probe)
            );
        }
        text
    }
}

/// Hits by probe and named stack as the kernel counted them (frame pointers).
pub(super) fn kernel_stack_counts(
    loader: &Loader,
    namer: &mut StackNamer,
) -> Result<Vec<((u32, HitStack), u64)>> {
    let mut counts = Vec::new();
    for (key, count) in loader.hit_stacks()? {
        let (user, kernel) = (
            StackId::decode(key.user_stack_id),
            StackId::decode(key.kernel_stack_id),
        );
        let stack = namer.name(loader, key.tgid, user, kernel);
        counts.push(((key.probe_id, stack), count));
    }
    Ok(counts)
}

/// Hits by probe and named stack, folded with the probe as the root frame and written
/// as `hits.folded` and `hits.svg` into the output directory.
pub(super) fn stack_counts(
    loader: &Loader,
    plan: &ProbePlan,
    counts: Vec<((u32, HitStack), u64)>,
    config: &TraceConfig,
) -> Result<StackCounts> {
    let mut by_stack: HashMap<(u32, HitStack), u64> = HashMap::new();
    let mut counted_by_probe = vec![0u64; plan.probes.len()];
    for ((probe_id, stack), count) in counts {
        *by_stack.entry((probe_id, stack)).or_default() += count;
        if let Some(n) = counted_by_probe.get_mut(probe_id as usize) {
            *n += count;
        }
    }
    let mut not_counted = Vec::new();
    for (id, probe) in plan.probes.iter().enumerate() {
        let hits = loader.probe_hits(id as u32)?.count;
        if hits > counted_by_probe[id] {
            not_counted.push((probe.specifier(), hits - counted_by_probe[id]));
        }
    }
    let mut profile = StackProfile::default();
    for ((probe_id, stack), &count) in &by_stack {
        profile.add(
            folded_frames(&plan.probes[*probe_id as usize].specifier(), stack),
            Weight {
                events: count,
                ns: 0,
            },
        );
    }
    let folded = render::flamegraph::FoldedStacks::of_events(&profile);
    let files = render::write_folded_view(
        &folded,
        &config.output_dir,
        "hits",
        &render::flamegraph::SvgOptions {
            title: "Probe hits by stack",
            subtitle: None,
            count_name: "hits",
            palette: render::flamegraph::Palette::OnCpu,
        },
    )?;
    let mut stacks: Vec<CountedStack> = by_stack
        .into_iter()
        .map(|((probe_id, stack), count)| CountedStack {
            probe_id,
            count,
            stack,
        })
        .collect();
    stacks.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(a.probe_id.cmp(&b.probe_id))
            .then_with(|| a.stack.frames.len().cmp(&b.stack.frames.len()))
    });
    Ok(StackCounts {
        stacks,
        not_counted,
        files,
    })
}

/// A hit's frames root first under the probe's name; a stack with problems has a frame
/// saying so right under the root, so the flame graph shows it too.
pub(super) fn folded_frames(probe: &str, stack: &HitStack) -> Vec<String> {
    let mut frames = vec![probe.to_string()];
    if !stack.problems.is_empty() {
        frames.push(format!("[{}]", stack.problems.join("; ")));
    }
    frames.extend(
        stack
            .frames
            .iter()
            .rev()
            .map(naming::FrameLine::folded_name),
    );
    frames
}
