//! `tracer trace PROBE... [-- CMD]`: one line per probe hit with its decoded arguments,
//! or counts per probe; with `--stack`, each hit's stack after its line, or counts per
//! stack written as a flame graph.

use std::{collections::HashMap, num::NonZeroU32, path::PathBuf};

use anyhow::{Result, bail};
use serde_json::json;
use tokio::io::{Interest, unix::AsyncFd};
use tracer_common::{UsdtArg, UsdtEvent, UsdtStrHeader, counter};

use crate::{
    cli::{Format, TraceConfig},
    kernel::{Features, Loader, RecordRing, Settings, keeper},
    output::render,
    probe::late_sites::{self, LOOK_PERIOD, LateSites, Members, searches_processes},
    probe::plan::{ProbePlan, SiteInput, SiteMode},
    probe::usdt::{self, Scope},
    profile::sampling::UnwindMethod,
    stack::naming::{self, HitStack, StackProfile, StackSource, Weight},
    stack::python::Interpreters,
    stack::symbolize::{ProcessMaps, StackSymbolizer},
    stack::unwind::{DwarfUnwinder, Snapshot, StackMerger, UnwindEnd, UnwoundStack},
    system::console::{OutputError, OutputStream},
    system::privileges,
    system::procfs,
    system::stop::{self, ProcessWatch, StopReason},
    system::text::{escape_text, quote_bytes},
    target::launch::PausedChild,
    target::{self, TargetSpec, TargetTracker},
};

pub fn run(config: TraceConfig) -> Result<()> {
    privileges::check()?;
    let writes_stacks = config.count && config.stack;
    if writes_stacks {
        // Now rather than after the trace: a directory we cannot write fails the run
        // before the target runs.
        render::prepare_output_dir(&config.output_dir)?;
    }
    let specs = config
        .probes
        .iter()
        .map(|p| usdt::parse_specifier(p))
        .collect::<Result<Vec<_>, _>>()?;
    // Fork before any other thread exists; the child waits until the probes are attached.
    let mut child = match &config.command {
        Some(argv) => Some(PausedChild::spawn(argv)?),
        None => None,
    };
    // Now, before the other threads of the launch take the CPUs: the first uprobe waits
    // for an RCU grace period, the longest step of a launch.
    let warm_up = Loader::warm_up_uprobes();
    Loader::start_keeper();
    // Whose hits: the command (and with --children its forks), the targets, or every
    // process running the probes' files.
    let spec = match &child {
        Some(child) => TargetSpec {
            pids: NonZeroU32::new(child.pid).into_iter().collect(),
            ..config.targets.clone()
        },
        None => config.targets.clone(),
    };
    let single = spec.single_pid();
    // Kernel types only for a set of processes (each hit's process is checked against
    // the set, start time included) or a PID namespace of its own.
    // And to find a thread's Python frames.
    let python_frames = config.stack && config.unwind == UnwindMethod::Dwarf;
    Loader::prepare((!spec.is_everything() && single.is_none()) || python_frames);
    let targets = match spec.is_everything() {
        true => None,
        false => Some(spec.find()?),
    };
    let pids: Vec<u32> = targets
        .iter()
        .flat_map(|t| &t.members)
        .map(|m| m.pid)
        .collect();
    let scope = match (&child, single) {
        (Some(child), _) => Scope::Files {
            exe: Some(&child.exe),
        },
        (None, Some(pid)) => Scope::Process(pid),
        (None, None) if targets.is_some() => Scope::Processes {
            pids: &pids,
            exe: spec.exe.as_deref(),
        },
        // `usdt:*` (or no path) with no process named: every process running now, and
        // (below) those that start later.
        (None, None) if specs.iter().any(searches_processes) => Scope::Everything,
        (None, None) => Scope::Files { exe: None },
    };
    let watch = single.map(ProcessWatch::target).transpose()?;
    // A target watched is known to have existed: missing, it exited.
    let on_target = |e: anyhow::Error| match single {
        Some(pid) => procfs::target_error(pid, e),
        None => e,
    };
    // What may match objects not mapped yet: specifiers that search a process's objects
    // (no path, `*`, a file name), looked for again in what the processes map later.
    let later_specs: Vec<_> = specs
        .iter()
        .filter(|spec| {
            searches_processes(spec) || spec.path.as_deref().is_some_and(|p| !p.contains('/'))
        })
        .cloned()
        .collect();
    let resolved = match usdt::resolve(&specs, scope) {
        // None yet: they may be in a library loaded later.
        Err(usdt::UsdtError::NoProbes { wanted, .. }) if !later_specs.is_empty() => {
            crate::status!(
                "No probes match {wanted} yet: looking for them in what is loaded later."
            );
            usdt::Resolved::default()
        }
        result => result.map_err(|e| match single {
            Some(pid) => procfs::target_error(pid, e.of_target()),
            None => e.into(),
        })?,
    };
    for skipped in &resolved.skipped {
        log::warn!("skipped a probe site: {skipped}");
    }
    let inputs = resolved
        .sites
        .iter()
        .map(SiteInput::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let dwarf = config.stack && config.unwind == UnwindMethod::Dwarf;
    // Stacks unwound here come one per hit, so DWARF counts are made from events.
    let mode = if config.count && !dwarf {
        SiteMode::Count
    } else {
        SiteMode::Events
    };
    // One process's sites are attached for it alone; a set's for every process mapping
    // the files, the kernel keeping the targets' hits.
    let mut plan = ProbePlan::build(&inputs, &[], &[], mode, single)?;
    plan.show_strings(&config.strings)?;
    if dwarf {
        plan.take_stack_snapshots();
    } else if config.stack {
        plan.take_stacks();
    }
    warn_unavailable(&plan.unavailable_args, &plan, config.format);
    let types = probe_arg_types(&plan);
    let searched = usdt::Searched::of_resolved(
        &resolved.sites,
        &match scope {
            Scope::Everything => procfs::all_processes(),
            Scope::Process(pid) => vec![pid],
            _ => pids.clone(),
        },
    );

    let mut loader = Loader::load(&Settings {
        targets: targets.clone(),
        ring_buffer_bytes: config.ring_buffer_bytes,
        unwind_ring_bytes: match dwarf {
            true => UNWIND_RING_BYTES,
            false => Settings::default().unwind_ring_bytes,
        },
        // Sites found later get cookies after these: room for them.
        plan_sizes: Some(match later_specs.is_empty() {
            true => plan.sizes(),
            false => plan.room_to_grow(),
        }),
        features: Features {
            // Counting by stack announces each new stack through the event ring.
            events: !config.count || config.stack,
            hit_stacks: config.stack,
            python_frames,
            ..Features::NONE
        },
        ..Settings::default()
    })?;
    let mut tracker = TargetTracker::for_set(&spec, &loader)?;
    loader
        .attach_usdt_sites(&plan.usdt_sites(), warm_up)
        .map_err(|e| on_target(e.into()))?;
    let probe_names: Vec<String> = plan.probes.iter().map(|p| p.specifier()).collect();
    let _diagnostics = loader.start_diagnostics(&probe_names);
    let events = loader.take_events()?;
    let snapshots = match dwarf {
        true => Some(loader.take_unwind_samples()?),
        false => None,
    };
    // Stacks of hits in a CPython process carry its Python frames (those of processes
    // running when the trace starts).
    let mut interpreters = match python_frames {
        true => Interpreters::default(),
        false => Interpreters::disabled(),
    };
    for &pid in pids
        .iter()
        .filter(|&&pid| Some(pid) != child.as_ref().map(|c| c.pid))
    {
        interpreters.find(pid, ProcessMaps::capture(pid).ok().as_ref());
    }
    for (tgid, process) in interpreters.ready_for_kernel() {
        loader.add_python_process(tgid, &process)?;
    }
    if !later_specs.is_empty() && !spec.is_everything() {
        let exes = match &child {
            Some(child) => vec![(child.exe.clone(), PathBuf::from("/"))],
            None => late_sites::executables_of(&pids, spec.exe.as_deref()),
        };
        late_sites::hold_at_dlopen(&mut loader, exes, single, config.hold_at_dlopen)
            .map_err(on_target)?;
    }
    let mut later = (!later_specs.is_empty()).then(|| {
        let members = match (&child, spec.is_everything()) {
            (Some(child), _) if single.is_some() => Members::One(child.pid),
            (_, true) => Members::Every,
            _ => match single {
                Some(pid) => Members::One(pid),
                None => Members::Set,
            },
        };
        LateSites::new(later_specs, searched, mode, Vec::new(), single, members)
            .holding(config.hold_at_dlopen)
    });
    // Ctrl-C from the moment the line below is printed (and the command runs) must stop
    // the trace, not kill us.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = stop::StopSignals::catch(&runtime)?;
    crate::status!(
        "Attached {} probes ({} sites){}. Ctrl-C to stop.",
        plan.probes.len(),
        loader.usdt_site_count(),
        match (single, &targets) {
            (Some(pid), _) => format!(" in process {pid}"),
            (None, Some(_)) => format!(" in {spec}"),
            (None, None) => " in every process running them".into(),
        }
    );
    if let Some(child) = child.as_mut() {
        child.resume()?;
    }

    let names = probe_names;
    let mut printer = EventPrinter {
        format: config.format,
        names,
        kinds: plan.probes.iter().map(|p| p.kind).collect(),
        types,
        started_ns: stop::monotonic_ns(),
        count: 0,
        stacks: config
            .stack
            .then(|| StackNamer::new(snapshots, interpreters)),
        counting: config.count,
        counted: HashMap::new(),
    };
    // Standard output has a writer thread of its own: a reader that stalls never keeps
    // the tracer from stopping (and detaching) when asked.
    let out = OutputStream::stdout();
    if config.format == Format::Text && !config.count {
        let header = format!("{:>12} {:>7} {:>7} PROBE ARGS\n", "TIME(s)", "PID", "TID");
        out.send_blocking(header.into_bytes(), 0);
    }
    let keeper_pid = loader.keeper_pid();
    let (reason, events) = runtime.block_on(async {
        // SAFETY: the ring buffer owns its map fd, which stays open (and the same) until the
        // AsyncFd gives the ring buffer back.
        let mut events = unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let reason = stop::run_until_stopped_with(
            signals,
            watch,
            config.duration,
            stop::either(
                pump(
                    &mut events,
                    &mut printer,
                    &mut Pumped {
                        loader: &mut loader,
                        later: later.as_mut(),
                        plan: &mut plan,
                        format: config.format,
                    },
                    &out,
                ),
                stop::either(target::track(tracker.as_mut()), keeper::watch(keeper_pid)),
            ),
        )
        .await?;
        Ok::<_, std::io::Error>((reason, events.into_inner()))
    })?;
    loader.stop_recording()?;
    // A second Ctrl-C ends the tracer at once: the keeper releases what is left.
    stop::restore_default_signals();
    if let Some(later) = later.as_mut() {
        later.release_all(&mut loader);
    }
    loader.detach_usdt()?;
    drop(tracker);
    loader.detach_targets();
    // The target is as it was; now what is left for standard output, for as long as its
    // reader takes it.
    let mut events = events;
    if reason != StopReason::OutputClosed {
        let (bytes, count) = printer.format(&mut events, &loader);
        if count > 0 {
            out.send_blocking(bytes, count);
        }
    }
    if config.count {
        let by_stack = match printer.stacks.as_mut() {
            Some(namer) => {
                let counts = match dwarf {
                    true => std::mem::take(&mut printer.counted).into_iter().collect(),
                    false => kernel_stack_counts(&loader, namer)?,
                };
                Some(stack_counts(&loader, &plan, counts, &config)?)
            }
            None => None,
        };
        let text = count_text(&loader, &plan, config.format, by_stack.as_ref())?;
        out.send_blocking(text.into_bytes(), 0);
    }
    let (written, output) = out.finish();
    // The events of a count (stack announcements, or hits to unwind) are not printed.
    let (written, printed) = match config.count {
        true => (0, 0),
        false => (written, printer.count),
    };
    let not_written = printed.saturating_sub(written);
    let lost = loader.counters()?[counter::EVENTS_LOST as usize];
    // Tracing has ended: so does the command.
    let exit = child.as_ref().and_then(|c| c.finish());
    crate::status!(
        "Stopped: {reason}. {written} events{}{}{}.",
        if lost > 0 {
            format!(", {lost} LOST (ring buffer full; raise --ring-buffer)")
        } else {
            ", none lost".into()
        },
        if not_written > 0 {
            format!(", {not_written} collected but not written to standard output")
        } else {
            String::new()
        },
        exit.map(|end| format!("; {end}")).unwrap_or_default()
    );
    match output {
        // The reader went away: it wanted no more (like `| head`).
        Ok(()) | Err(OutputError::Closed) => {}
        Err(e) => return Err(e.into()),
    }
    if lost > 0 {
        bail!("{lost} events were lost");
    }
    Ok(())
}

/// Hits per probe, as bpftrace prints `@[probe] = count()` (or one JSON object); with
/// `by_stack`, then the most frequent stacks as bpftrace prints `@[ustack] = count()`
/// (in JSON, `{"probes": {...}, "stacks": [...]}`).
fn count_text(
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
            let map: serde_json::Map<String, serde_json::Value> =
                counts.into_iter().map(|(k, v)| (k, json!(v))).collect();
            let value = match by_stack {
                None => serde_json::Value::Object(map),
                Some(by_stack) => json!({
                    "probes": map,
                    "stacks": by_stack.stacks.iter().map(|s| json!({
                        "probe": plan.probes[s.probe_id as usize].specifier(),
                        "count": s.count,
                        "stack": stack_json(&s.stack),
                        "stack_problems": s.stack.problems,
                    })).collect::<Vec<_>>(),
                    "not_counted_by_stack": by_stack.not_counted,
                    "folded": by_stack.files.folded,
                    "svg": by_stack.files.svg,
                }),
            };
            text = value.to_string() + "\n";
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

/// Size of the ring of stack snapshots (16 KiB each) with `--unwind dwarf`.
const UNWIND_RING_BYTES: u32 = 32 << 20;

/// How many of the most frequent stacks the text summary shows.
const TOP_STACKS: usize = 10;

/// Hits counted by stack (`--count --stack`): most frequent first, with the files
/// written.
struct StackCounts {
    stacks: Vec<CountedStack>,
    /// Hits of the probe the stack map had no room to count by stack, per probe name.
    not_counted: Vec<(String, u64)>,
    files: render::ViewFiles,
}

struct CountedStack {
    probe_id: u32,
    count: u64,
    stack: HitStack,
}

impl StackCounts {
    fn text(&self, plan: &ProbePlan) -> String {
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
fn kernel_stack_counts(
    loader: &Loader,
    namer: &mut StackNamer,
) -> Result<Vec<((u32, HitStack), u64)>> {
    let mut counts = Vec::new();
    for (key, count) in loader.hit_stacks()? {
        let stack = namer.name(loader, key.tgid, key.user_stack_id, key.kernel_stack_id);
        counts.push(((key.probe_id, stack), count));
    }
    Ok(counts)
}

/// Hits by probe and named stack, folded with the probe as the root frame and written
/// as `hits.folded` and `hits.svg` into the output directory.
fn stack_counts(
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
fn folded_frames(probe: &str, stack: &HitStack) -> Vec<String> {
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

/// A stack a frame a line, innermost first, each line after `indent`, then its
/// problems in brackets.
fn stack_text(stack: &HitStack, indent: &str) -> String {
    let mut text = String::new();
    for frame in &stack.frames {
        text += &format!("{indent}{}\n", escape_text(&frame.text()));
    }
    for problem in &stack.problems {
        text += &format!("{indent}[{}]\n", escape_text(problem));
    }
    text
}

fn stack_json(stack: &HitStack) -> serde_json::Value {
    stack
        .frames
        .iter()
        .map(|f| {
            json!({
                "function": f.name,
                "offset": f.offset,
                "module": f.module,
                "kernel": f.kernel,
                "inlined": f.inlined,
            })
        })
        .collect()
}

/// Names the stacks of hits, each distinct one once, in the mappings of its process as
/// they were when it was first seen (read then: a process that exits is still named).
struct StackNamer {
    symbolizer: StackSymbolizer,
    /// `None`: could not be read (the process exited).
    maps: HashMap<u32, Option<ProcessMaps>>,
    named: HashMap<(u32, i32, i32), HitStack>,
    /// `--unwind dwarf`: the snapshot ring, and the stacks unwound from it by snapshot
    /// id until their events take them.
    snapshots: Option<RecordRing>,
    unwinder: DwarfUnwinder,
    /// The CPython interpreters whose frames snapshots carry.
    interpreters: Interpreters,
    unwound: HashMap<i32, (UnwoundStack, UnwindEnd)>,
    /// Unwound stacks named, by process, addresses and kernel stack: hits repeat stacks.
    named_unwound: HashMap<(u32, UnwoundStack, i32), HitStack>,
}

/// One unwound user stack as a stack source, for [`naming::hit_stack`].
struct OneStack<'a> {
    id: i32,
    unwound: &'a UnwoundStack,
    others: &'a dyn StackSource,
}

impl StackSource for OneStack<'_> {
    fn stack(&self, id: i32) -> Vec<u64> {
        match id == self.id {
            true => self.unwound.addrs.clone(),
            false => self.others.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: i32) -> Vec<bool> {
        match id == self.id {
            true => self.unwound.by_frame_pointer.clone(),
            false => Vec::new(),
        }
    }
}

impl StackNamer {
    fn new(snapshots: Option<RecordRing>, interpreters: Interpreters) -> Self {
        Self {
            symbolizer: StackSymbolizer::new(),
            maps: HashMap::new(),
            named: HashMap::new(),
            snapshots,
            unwinder: DwarfUnwinder::new(),
            interpreters,
            unwound: HashMap::new(),
            named_unwound: HashMap::new(),
        }
    }

    /// Reads the mappings of process `tgid` unless already read.
    fn observe(&mut self, tgid: u32) {
        self.maps.entry(tgid).or_insert_with(|| {
            // An exited process not yet reaped still has a maps file, empty.
            ProcessMaps::capture(tgid)
                .ok()
                .filter(|maps| maps.mapped_files().next().is_some())
        });
    }

    /// Unwinds the snapshots waiting: each is sent before its event, so an event finds
    /// its snapshot unwound here.
    fn unwind_snapshots(&mut self) {
        let Some(mut ring) = self.snapshots.take() else {
            return;
        };
        ring.drain(|record| {
            let Some(snapshot) = Snapshot::parse(record) else {
                return;
            };
            self.observe(snapshot.tgid);
            let unwound = match self.maps.get(&snapshot.tgid).and_then(Option::as_ref) {
                Some(maps) => {
                    let (stack, end) = self.unwinder.unwind_one(&snapshot, maps);
                    let merger = self.interpreters.find(snapshot.tgid, Some(maps));
                    match (merger, &snapshot.python) {
                        (Some(merger), Some(python)) => (merger.merge_python(stack, python), end),
                        _ => (stack, end),
                    }
                }
                // Named later as the address of a process gone, and said so.
                None => (
                    UnwoundStack {
                        addrs: vec![snapshot.ip],
                        by_frame_pointer: vec![false],
                    },
                    UnwindEnd::Complete,
                ),
            };
            self.unwound.insert(snapshot.snapshot_id as i32, unwound);
        });
        self.snapshots = Some(ring);
    }

    /// The stacks of a hit of process `tgid`, ids in `stacks` (or a snapshot's).
    fn name(
        &mut self,
        stacks: &dyn StackSource,
        tgid: u32,
        user_id: i32,
        kernel_id: i32,
    ) -> HitStack {
        if user_id >= tracer_common::FIRST_SNAPSHOT_ID {
            return self.name_unwound(stacks, tgid, user_id, kernel_id);
        }
        if let Some(stack) = self.named.get(&(tgid, user_id, kernel_id)) {
            return stack.clone();
        }
        self.observe(tgid);
        let mut stack = naming::hit_stack(
            user_id,
            kernel_id,
            stacks,
            &mut self.symbolizer,
            self.maps.get(&tgid).and_then(Option::as_ref),
            "a caller without frame pointers?",
        );
        if self.snapshots.is_some() && user_id >= 0 {
            stack
                .problems
                .push("walked by frame pointers: the snapshot ring buffer was full".into());
        }
        self.named.insert((tgid, user_id, kernel_id), stack.clone());
        stack
    }

    /// The stacks of a hit whose user stack is snapshot `id`, unwound. Not kept: each
    /// snapshot is one hit's.
    fn name_unwound(
        &mut self,
        stacks: &dyn StackSource,
        tgid: u32,
        id: i32,
        kernel_id: i32,
    ) -> HitStack {
        if !self.unwound.contains_key(&id) {
            // Sent after the ring was last drained, before its event was read.
            self.unwind_snapshots();
        }
        let Some((unwound, end)) = self.unwound.remove(&id) else {
            let not_taken = tracer_common::STACK_NOT_TAKEN;
            let mut stack = self.name(stacks, tgid, not_taken, kernel_id);
            stack
                .problems
                .push("user stack snapshot lost before it was unwound".into());
            return stack;
        };
        let key = (tgid, unwound, kernel_id);
        if let Some(stack) = self.named_unwound.get(&key) {
            return stack.clone();
        }
        let one = OneStack {
            id,
            unwound: &key.1,
            others: stacks,
        };
        self.observe(tgid);
        let mut stack = naming::hit_stack(
            id,
            kernel_id,
            &one,
            &mut self.symbolizer,
            self.maps.get(&tgid).and_then(Option::as_ref),
            "no unwind information or frame pointer there",
        );
        if end == UnwindEnd::OutOfStack {
            stack.problems.push(format!(
                "user stack deeper than the {} KiB copied",
                tracer_common::UNWIND_STACK_BYTES / 1024
            ));
        }
        self.named_unwound.insert(key, stack.clone());
        stack
    }
}

/// How each argument of a probe is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArgType {
    Unsigned,
    Signed,
    /// IEEE single precision, in the low 4 bytes.
    F32,
    F64,
}

impl ArgType {
    fn of(arg: &UsdtArg) -> ArgType {
        match (arg.float != 0, arg.size, arg.signed != 0) {
            (true, 4, _) => ArgType::F32,
            (true, _, _) => ArgType::F64,
            (false, _, true) => ArgType::Signed,
            (false, _, false) => ArgType::Unsigned,
        }
    }

    fn json(self, value: u64) -> serde_json::Value {
        match self {
            ArgType::Unsigned => json!(value),
            ArgType::Signed => json!(value as i64),
            // NaN and infinities have no JSON number: null.
            ArgType::F32 => json!(f32::from_bits(value as u32)),
            ArgType::F64 => json!(f64::from_bits(value)),
        }
    }

    fn text(self, value: u64) -> String {
        match self {
            ArgType::Unsigned => value.to_string(),
            ArgType::Signed => (value as i64).to_string(),
            ArgType::F32 => f32::from_bits(value as u32).to_string(),
            ArgType::F64 => f64::from_bits(value).to_string(),
        }
    }
}

/// How each argument of each probe is shown, from its first site's spec.
fn probe_arg_types(plan: &ProbePlan) -> Vec<Vec<ArgType>> {
    let mut types = vec![Vec::new(); plan.probes.len()];
    for planned in &plan.sites {
        let slot = &mut types[planned.site.probe_id as usize];
        if slot.is_empty() {
            *slot = planned.site.args[..planned.site.arg_count as usize]
                .iter()
                .map(ArgType::of)
                .collect();
        }
    }
    types
}

/// Hands the events to standard output's writer as they arrive, until that fails. While
/// the writer's queue is full (a reader that stalls), the ring buffer is not drained: its
/// overflow is counted by the kernel, and stop signals are still seen meanwhile.
async fn pump(
    events: &mut AsyncFd<RecordRing>,
    printer: &mut EventPrinter,
    pumped: &mut Pumped<'_>,
    out: &OutputStream,
) -> std::io::Result<StopReason> {
    let mut ticker = tokio::time::interval(LOOK_PERIOD);
    loop {
        tokio::select! {
            _ = ticker.tick() => pumped.look(printer),
            guard = events.readable_mut() => {
                let mut guard = guard?;
                // Clear before draining: the kernel only wakes a reader that has caught
                // up, so a wakeup arriving during the drain must not be cleared afterwards.
                guard.clear_ready();
                // The events are taken off the ring only once the queue has room: a stop
                // arriving meanwhile finds them there, to write them out itself.
                let ring = guard.get_inner_mut();
                let loader = &*pumped.loader;
                if !out.send_made(|| printer.format(ring, loader)).await {
                    return Ok(StopReason::OutputClosed);
                }
            }
            () = out.failed() => return Ok(StopReason::OutputClosed),
        }
    }
}

/// What [`pump`] works with besides the events: the loader (whose stacks events name)
/// and the look for objects mapped since the start.
struct Pumped<'a> {
    loader: &'a mut Loader,
    later: Option<&'a mut LateSites>,
    plan: &'a mut ProbePlan,
    format: Format,
}

impl Pumped<'_> {
    fn look(&mut self, printer: &mut EventPrinter) {
        let Some(later) = self.later.as_deref_mut() else {
            return;
        };
        let added = later.look(self.loader, self.plan);
        if added.is_empty() {
            return;
        }
        warn_unavailable(
            &self.plan.unavailable_args[added.unavailable_args],
            self.plan,
            self.format,
        );
        printer.names = self.plan.probes.iter().map(|p| p.specifier()).collect();
        printer.kinds = self.plan.probes.iter().map(|p| p.kind).collect();
        printer.types = probe_arg_types(self.plan);
        // Mappings read before the new objects were mapped would not name their frames.
        if let Some(namer) = printer.stacks.as_mut() {
            namer.maps.clear();
        }
    }
}

/// One warning per argument events cannot show.
fn warn_unavailable(args: &[crate::probe::plan::UnavailableArg], plan: &ProbePlan, format: Format) {
    for arg in args {
        log::warn!(
            "{}: arg{} {}: unavailable, shown as {}",
            escape_text(&plan.probes[arg.probe_id as usize].specifier()),
            arg.index,
            escape_text(&arg.reason),
            match format {
                Format::Text => "?",
                Format::Json => "null",
            }
        );
    }
}

struct EventPrinter {
    format: Format,
    names: Vec<String>,
    /// Each probe's kind: a function probe's arguments are labelled (`arg0=`,
    /// `retval=`).
    kinds: Vec<usdt::ProbeKind>,
    types: Vec<Vec<ArgType>>,
    started_ns: u64,
    count: u64,
    /// With `--stack`: names each event's stacks.
    stacks: Option<StackNamer>,
    /// Counting (`--count --stack`): events are not printed. They announce new stacks
    /// to name now (frame pointers), or are hits, counted here by stack (DWARF).
    counting: bool,
    /// Hits by probe and stack, from events (`--count --stack --unwind dwarf`).
    counted: HashMap<(u32, HitStack), u64>,
}

impl EventPrinter {
    /// Formats every event waiting in the ring buffer: the text, and how many events.
    fn format(&mut self, ring: &mut RecordRing, stacks: &dyn StackSource) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut count = 0;
        if let Some(namer) = self.stacks.as_mut() {
            namer.unwind_snapshots();
        }
        ring.drain(|item| {
            if item.len() < std::mem::size_of::<UsdtEvent>() {
                return;
            }
            // SAFETY: the kernel wrote a whole UsdtEvent (checked length); read_unaligned
            // copes with the ring buffer's 8-byte alignment guarantee either way.
            let event: UsdtEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let stack = self.stacks.as_mut().map(|namer| {
                namer.name(
                    stacks,
                    event.pid,
                    event.user_stack_id,
                    event.kernel_stack_id,
                )
            });
            if self.counting {
                // Frame-pointer counts are the kernel's, an event there only announced; with
                // snapshots every event is a hit (walked by frame pointers when the
                // snapshot ring was full).
                let unwinds = self.stacks.as_ref().is_some_and(|n| n.snapshots.is_some());
                if let Some(stack) = stack
                    && unwinds
                {
                    *self.counted.entry((event.probe_id, stack)).or_default() += 1;
                }
                return;
            }
            let strings = event_strings(&item[std::mem::size_of::<UsdtEvent>()..]);
            // Writing into a Vec cannot fail.
            let _ = self.print(&mut out, &event, &strings, stack.as_ref());
            count += 1;
        });
        self.count += count;
        (out, count)
    }

    /// One event's line, then (with `--stack`) its stack a frame a line, as bpftrace
    /// prints `ustack` (JSON: `stack` and `stack_problems`).
    fn print(
        &self,
        out: &mut impl std::io::Write,
        event: &UsdtEvent,
        strings: &[(usize, Option<ShownStr>)],
        stack: Option<&HitStack>,
    ) -> std::io::Result<()> {
        let id = event.probe_id as usize;
        let name = self.names.get(id).map(String::as_str).unwrap_or("?");
        let kind = self.kinds.get(id).copied().unwrap_or_default();
        let types = self.types.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let args = &event.args[..(event.arg_count as usize).min(event.args.len())];
        // An argument the site cannot decode has no value, not 0.
        let value = |i: usize| -> Option<(ArgType, u64)> {
            let ty = types.get(i).copied().unwrap_or(ArgType::Unsigned);
            (event.unavailable & (1 << i) == 0).then(|| (ty, args[i]))
        };
        match self.format {
            Format::Json => {
                let values: Vec<serde_json::Value> = (0..args.len())
                    .map(|i| value(i).map_or(serde_json::Value::Null, |(ty, v)| ty.json(v)))
                    .collect();
                let mut line = json!({
                    "time_ns": event.ts_ns,
                    "pid": event.pid,
                    "tid": event.tid,
                    "probe": name,
                    "args": values,
                });
                if kind == usdt::ProbeKind::Uretprobe {
                    line["args"] = json!([]);
                    line["retval"] = values.first().cloned().unwrap_or_default();
                }
                if !strings.is_empty() {
                    let shown: serde_json::Map<String, serde_json::Value> = strings
                        .iter()
                        .map(|(i, s)| {
                            let value = match (value(*i), s) {
                                (Some(_), Some(s)) => s.json(),
                                _ => serde_json::Value::Null,
                            };
                            (format!("arg{i}"), value)
                        })
                        .collect();
                    line["strings"] = shown.into();
                }
                if let Some(stack) = stack {
                    line["stack"] = stack_json(stack);
                    line["stack_problems"] = json!(stack.problems);
                }
                writeln!(out, "{line}")
            }
            Format::Text => {
                let secs = event.ts_ns.saturating_sub(self.started_ns) as f64 / 1e9;
                // Probe names come from the target's notes and paths.
                let name = escape_text(name);
                write!(out, "{secs:>12.6} {:>7} {:>7} {name}", event.pid, event.tid)?;
                for i in 0..args.len() {
                    match kind {
                        usdt::ProbeKind::Usdt => {}
                        usdt::ProbeKind::Uprobe => write!(out, " arg{i}=")?,
                        usdt::ProbeKind::Uretprobe => write!(out, " retval=")?,
                    }
                    let string = strings.iter().find(|(arg, _)| *arg == i);
                    let space = if kind.is_function() { "" } else { " " };
                    match (value(i), string) {
                        (Some(_), Some((_, Some(s)))) => write!(out, "{space}{}", s.text())?,
                        // No string where one was asked for: the pointer was NULL or
                        // unmapped.
                        (None, _) | (_, Some((_, None))) => write!(out, "{space}?")?,
                        (Some((ty, v)), None) => write!(out, "{space}{}", ty.text(v))?,
                    }
                }
                writeln!(out)?;
                if let Some(stack) = stack {
                    write!(out, "{}", stack_text(stack, "        "))?;
                    writeln!(out)?;
                }
                Ok(())
            }
        }
    }
}

/// A string argument as read at the hit, cut to its maximum length.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ShownStr {
    bytes: Vec<u8>,
    /// The string had more bytes than shown.
    truncated: bool,
}

impl ShownStr {
    /// Quoted and escaped (see [`quote_bytes`]), followed by `...` when cut, as strace
    /// shows strings.
    fn text(&self) -> String {
        let dots = if self.truncated { "..." } else { "" };
        format!("{}{dots}", quote_bytes(&self.bytes))
    }

    /// `text` is the string, invalid UTF-8 replaced by U+FFFD; then `hex` holds its exact
    /// bytes (null when it is valid UTF-8, so `text` is exact).
    fn json(&self) -> serde_json::Value {
        let hex = std::str::from_utf8(&self.bytes).is_err().then(|| {
            self.bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        });
        json!({
            "text": String::from_utf8_lossy(&self.bytes),
            "truncated": self.truncated,
            "hex": hex,
        })
    }
}

/// The strings after an event's fixed part (see [`UsdtStrHeader`]), by argument index:
/// `None` where the read failed.
fn event_strings(mut area: &[u8]) -> Vec<(usize, Option<ShownStr>)> {
    let header_size = std::mem::size_of::<UsdtStrHeader>();
    let mut strings = Vec::new();
    while area.len() >= header_size {
        // SAFETY: the length is checked and UsdtStrHeader is plain integers;
        // read_unaligned because strings before it have any length.
        let header: UsdtStrHeader = unsafe { std::ptr::read_unaligned(area.as_ptr().cast()) };
        area = &area[header_size..];
        let copied = usize::try_from(header.result).unwrap_or(0).min(area.len());
        let (raw, rest) = area.split_at(copied);
        area = rest;
        if header.result <= 0 {
            strings.push((header.arg as usize, None));
            continue;
        }
        let content = raw.strip_suffix(&[0]).unwrap_or(raw);
        let max = header.max as usize;
        strings.push((
            header.arg as usize,
            Some(ShownStr {
                bytes: content[..content.len().min(max)].to_vec(),
                truncated: content.len() > max,
            }),
        ));
    }
    strings
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Probe names (provider, name, path: the target's) reach the terminal with their
    /// control characters escaped in text lines, as JSON escapes them in JSON lines.
    #[test]
    fn probe_names_are_escaped_in_text_lines() {
        let mut printer = EventPrinter {
            format: Format::Text,
            kinds: Vec::new(),
            names: vec!["usdt:/tmp/a\x07:p\x1b[31m:n\r".into()],
            types: vec![vec![ArgType::Signed]],
            started_ns: 0,
            count: 0,
            stacks: None,
            counting: false,
            counted: HashMap::new(),
        };
        // SAFETY: UsdtEvent is plain old data; all zeroes is a valid value.
        let mut event: UsdtEvent = unsafe { std::mem::zeroed() };
        event.ts_ns = 1_500_000_000;
        event.pid = 7;
        event.tid = 8;
        event.arg_count = 1;
        event.args[0] = -3i64 as u64;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[], None).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "    1.500000       7       8 usdt:/tmp/a\\x07:p\\x1b[31m:n\\x0d -3\n"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[], None).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert!(
            line.contains(r#""probe":"usdt:/tmp/a\u0007:p\u001b[31m:n\r""#),
            "{line}"
        );
    }

    /// Each argument as its spec types it; one the site cannot decode is `?` in text and
    /// `null` in JSON, whatever the kernel wrote for it.
    #[test]
    fn arguments_print_as_typed_and_unavailable_ones_as_such() {
        let mut printer = EventPrinter {
            format: Format::Text,
            kinds: Vec::new(),
            names: vec!["usdt:/a:p:n".into()],
            types: vec![vec![
                ArgType::Unsigned,
                ArgType::Signed,
                ArgType::F32,
                ArgType::F64,
                ArgType::Signed,
            ]],
            started_ns: 0,
            count: 0,
            stacks: None,
            counting: false,
            counted: HashMap::new(),
        };
        // SAFETY: UsdtEvent is plain old data; all zeroes is a valid value.
        let mut event: UsdtEvent = unsafe { std::mem::zeroed() };
        event.arg_count = 5;
        event.args[..5].copy_from_slice(&[
            u64::MAX,
            -2i64 as u64,
            (-1.25f32).to_bits() as u64,
            2.5f64.to_bits(),
            77,
        ]);
        event.unavailable = 0b10000;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[], None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(" usdt:/a:p:n 18446744073709551615 -2 -1.25 2.5 ?\n"),
            "{text}"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[], None).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            line["args"],
            json!([18446744073709551615u64, -2, -1.25, 2.5, null])
        );
    }
    /// The string area as the kernel writes it: a header per string, then the bytes
    /// copied with their NUL.
    /// What the kernel read for one argument: (index, limit, bytes or errno).
    type Read<'a> = (u8, u16, Result<&'a [u8], i32>);

    fn string_area(strings: &[Read<'_>]) -> Vec<u8> {
        let mut area = Vec::new();
        for &(arg, max, ref read) in strings {
            let result = match read {
                Ok(bytes) => bytes.len() as i32 + 1,
                Err(errno) => -errno,
            };
            let header = UsdtStrHeader {
                result,
                arg,
                _pad: 0,
                max,
            };
            // SAFETY: UsdtStrHeader is plain integers without implicit padding.
            area.extend_from_slice(unsafe {
                std::slice::from_raw_parts(
                    (&header as *const UsdtStrHeader).cast::<u8>(),
                    std::mem::size_of::<UsdtStrHeader>(),
                )
            });
            if let Ok(bytes) = read {
                area.extend_from_slice(bytes);
                area.push(0);
            }
        }
        area
    }

    /// Strings show quoted and escaped in text, `...` when longer than their limit (the
    /// kernel reads one byte more than it), `?` when the read failed; in JSON as
    /// `strings.argN`, invalid UTF-8 also as hex, a failed read as null.
    #[test]
    fn string_arguments_show_cut_escaped_and_unavailable() {
        // Four bytes at most: "abcd" exactly fits, "abcde" (read as such) is cut.
        let area = string_area(&[
            (0, 4, Ok(b"ab\"c")),
            (1, 4, Ok(b"abcd")),
            (2, 4, Ok(b"abcde")),
            (3, 4, Ok(b"\xff\n")),
            (4, 4, Err(14)),
        ]);
        let strings = event_strings(&area);
        assert_eq!(strings.len(), 5);
        assert_eq!(
            strings[2],
            (
                2,
                Some(ShownStr {
                    bytes: b"abcd".to_vec(),
                    truncated: true
                })
            )
        );
        assert_eq!(strings[4], (4, None));
        let mut printer = EventPrinter {
            format: Format::Text,
            kinds: Vec::new(),
            names: vec!["usdt:/a:p:n".into()],
            types: vec![vec![ArgType::Unsigned; 6]],
            started_ns: 0,
            count: 0,
            stacks: None,
            counting: false,
            counted: HashMap::new(),
        };
        // SAFETY: UsdtEvent is plain old data; all zeroes is a valid value.
        let mut event: UsdtEvent = unsafe { std::mem::zeroed() };
        event.arg_count = 6;
        event.args[..6].copy_from_slice(&[0x1000, 0x2000, 0x3000, 0x4000, 0, 9]);
        let mut out = Vec::new();
        printer.print(&mut out, &event, &strings, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(" usdt:/a:p:n \"ab\\\"c\" \"abcd\" \"abcd\"... \"\\xff\\x0a\" ? 9\n"),
            "{text}"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &strings, None).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line["args"], json!([0x1000, 0x2000, 0x3000, 0x4000, 0, 9]));
        assert_eq!(
            line["strings"],
            json!({
                "arg0": {"text": "ab\"c", "truncated": false, "hex": null},
                "arg1": {"text": "abcd", "truncated": false, "hex": null},
                "arg2": {"text": "abcd", "truncated": true, "hex": null},
                "arg3": {"text": "\u{fffd}\n", "truncated": false, "hex": "ff0a"},
                "arg4": null,
            })
        );
        // Without strings the JSON line has no `strings` member, as before.
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[], None).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(line.get("strings").is_none());
    }
}
