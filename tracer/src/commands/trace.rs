//! `tracer trace PROBE... [-- CMD]`: one line per probe hit with its decoded arguments.

use std::num::NonZeroU32;
use std::path::PathBuf;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::io::{Interest, unix::AsyncFd};
use tracer_common::{UsdtArg, UsdtEvent, counter};

use crate::{
    cli::{Format, TraceConfig},
    console::{OutputError, OutputStream},
    launch::PausedChild,
    loader::{Features, Loader, RecordRing, Settings},
    privileges,
    probe_plan::{ProbePlan, SiteInput, SiteMode},
    procfs::{self, ProcessError},
    stop::{self, ProcessWatch, StopReason},
    targets::{self, TargetSpec, TargetTracker},
    text::escape_text,
    usdt::{self, Scope},
};

pub fn run(config: TraceConfig) -> Result<()> {
    privileges::check()?;
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
    // Now: the first uprobe waits for an RCU grace period, the longest step of a launch.
    let warm_up = Loader::warm_up_uprobes();
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
    let mode = if config.count {
        SiteMode::Count
    } else {
        SiteMode::Events
    };
    // One process's sites are attached for it alone; a set's for every process mapping
    // the files, the kernel keeping the targets' hits.
    let mut plan = ProbePlan::build(&inputs, &[], &[], mode, single)?;
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
        // Sites found later get cookies after these: room for them.
        plan_sizes: Some(match later_specs.is_empty() {
            true => plan.sizes(),
            false => plan.room_to_grow(),
        }),
        features: Features {
            events: !config.count,
            ..Features::NONE
        },
        ..Settings::default()
    })?;
    let mut tracker = TargetTracker::for_set(&spec, &loader)?;
    loader
        .attach_usdt_sites(&plan.usdt_sites(), warm_up)
        .map_err(|e| on_target(e.into()))?;
    let events = loader.take_events()?;
    if !later_specs.is_empty() && !spec.is_everything() {
        hold_at_dlopen(&mut loader, &child, &pids, spec.exe.as_deref(), single)
            .map_err(on_target)?;
    }
    let mut later = (!later_specs.is_empty()).then(|| LateSites {
        specs: later_specs,
        searched,
        mode,
        pid: single,
        ticks: 0,
        members: match (&child, spec.is_everything()) {
            (Some(child), _) if single.is_some() => Members::One(child.pid),
            (_, true) => Members::Every,
            _ => match single {
                Some(pid) => Members::One(pid),
                None => Members::Set,
            },
        },
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

    let names: Vec<String> = plan.probes.iter().map(|p| p.specifier()).collect();
    let mut printer = EventPrinter {
        format: config.format,
        names,
        types,
        started_ns: stop::monotonic_ns(),
        count: 0,
    };
    // Standard output has a writer thread of its own: a reader that stalls never keeps
    // the tracer from stopping (and detaching) when asked.
    let out = OutputStream::stdout();
    if config.format == Format::Text && !config.count {
        let header = format!("{:>12} {:>7} {:>7} PROBE ARGS\n", "TIME(s)", "PID", "TID");
        out.send_blocking(header.into_bytes(), 0);
    }
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
                pump(&mut events, &mut printer, &out, &mut |printer| {
                    if let Some(later) = later.as_mut() {
                        later.look(&mut loader, &mut plan, printer, config.format);
                    }
                }),
                targets::track(tracker.as_mut()),
            ),
        )
        .await?;
        Ok::<_, std::io::Error>((reason, events.into_inner()))
    })?;
    loader.stop_recording()?;
    if let Some(later) = later.as_mut() {
        later.release_all(&mut loader);
    }
    loader.detach_usdt()?;
    drop(tracker);
    loader.detach_targets();
    stop::restore_default_signals();
    // The target is as it was; now what is left for standard output, for as long as its
    // reader takes it.
    let mut events = events;
    if reason != StopReason::OutputClosed {
        let (bytes, count) = printer.format(&mut events);
        if count > 0 {
            out.send_blocking(bytes, count);
        }
    }
    if config.count {
        out.send_blocking(count_text(&loader, &plan, config.format)?.into_bytes(), 0);
    }
    let (written, output) = out.finish();
    let not_written = printer.count.saturating_sub(written);
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

/// Hits per probe, as bpftrace prints `@[probe] = count()` (or one JSON object).
fn count_text(loader: &Loader, plan: &ProbePlan, format: Format) -> Result<String> {
    let mut counts = Vec::new();
    for (id, probe) in plan.probes.iter().enumerate() {
        counts.push((probe.specifier(), loader.probe_hits(id as u32)?.count));
    }
    let mut text = String::new();
    match format {
        Format::Json => {
            let map: serde_json::Map<String, serde_json::Value> =
                counts.into_iter().map(|(k, v)| (k, json!(v))).collect();
            text = serde_json::Value::Object(map).to_string() + "\n";
        }
        Format::Text => {
            counts.sort_by_key(|&(_, n)| n);
            for (probe, n) in counts {
                text += &format!("@[{}]: {n}\n", escape_text(&probe));
            }
        }
    }
    Ok(text)
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
    out: &OutputStream,
    look: &mut dyn FnMut(&mut EventPrinter),
) -> std::io::Result<StopReason> {
    let mut ticker = tokio::time::interval(LOOK_PERIOD);
    loop {
        tokio::select! {
            _ = ticker.tick() => look(printer),
            guard = events.readable_mut() => {
                let mut guard = guard?;
                // Clear before draining: the kernel only wakes a reader that has caught
                // up, so a wakeup arriving during the drain must not be cleared afterwards.
                guard.clear_ready();
                let (bytes, count) = printer.format(guard.get_inner_mut());
                if count > 0 && !out.send(bytes, count).await {
                    return Ok(StopReason::OutputClosed);
                }
            }
            () = out.failed() => return Ok(StopReason::OutputClosed),
        }
    }
}

/// How often held processes are looked for; every [`LOOK_EVERY`] times, the processes'
/// maps are looked at for objects mapped since.
/// A held process waits for this at most (each `dlopen` and `dlclose` holds it twice):
/// one map lookup per period.
const LOOK_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);
const LOOK_EVERY: u32 = 100;

/// Whether `spec` searches the objects of processes (no path, or `*`) rather than files.
fn searches_processes(spec: &usdt::UsdtSpecifier) -> bool {
    spec.path.as_deref().is_none_or(|path| path == "*")
}

/// Whose maps are looked at for objects mapped later.
enum Members {
    One(u32),
    /// The kernel's set of targets.
    Set,
    /// Every process.
    Every,
}

/// Sites in objects mapped after the first attach (a library `dlopen`ed, a process
/// started later), found and attached while tracing.
struct LateSites {
    specs: Vec<usdt::UsdtSpecifier>,
    searched: usdt::Searched,
    mode: SiteMode,
    pid: Option<u32>,
    members: Members,
    ticks: u32,
}

impl LateSites {
    /// Continues the processes the kernel held, once their new objects' probes are
    /// attached; every [`LOOK_EVERY`] calls, looks at every process's objects too. A
    /// failure is a warning: tracing what is attached goes on.
    fn look(
        &mut self,
        loader: &mut Loader,
        plan: &mut ProbePlan,
        printer: &mut EventPrinter,
        format: Format,
    ) {
        for pid in loader.held() {
            // Continued before its SIGSTOP took effect, it would stay stopped.
            if !procfs::is_stopped(pid) && ProcessError::check(pid).is_none() {
                continue;
            }
            self.look_at(pid, loader, plan, printer, format);
            loader.release_held(pid);
            continue_process(pid);
        }
        self.ticks += 1;
        if self.ticks % LOOK_EVERY != 1 {
            return;
        }
        let pids = match self.members {
            Members::One(pid) => vec![pid],
            Members::Set => loader.targets_map().map(|t| t.pids()).unwrap_or_default(),
            Members::Every => procfs::all_processes(),
        };
        for pid in pids {
            self.look_at(pid, loader, plan, printer, format);
        }
    }

    fn look_at(
        &mut self,
        pid: u32,
        loader: &mut Loader,
        plan: &mut ProbePlan,
        printer: &mut EventPrinter,
        format: Format,
    ) {
        let (sites, skipped) = usdt::find_new(&self.specs, pid, &mut self.searched);
        for skipped in &skipped {
            log::warn!("skipped a probe site: {skipped}");
        }
        if sites.is_empty() {
            return;
        }
        if let Err(e) = self.attach(&sites, loader, plan, printer, format) {
            log::warn!("cannot attach the probes found later in process {pid}: {e:#}");
        }
    }

    /// Continues every process still held, once the kernel holds no more (recording
    /// stopped), waiting up to a second in all for them to have stopped.
    fn release_all(&mut self, loader: &mut Loader) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        for pid in loader.held() {
            while !procfs::is_stopped(pid)
                && ProcessError::check(pid).is_none()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            loader.release_held(pid);
            continue_process(pid);
        }
    }

    fn attach(
        &mut self,
        sites: &[usdt::ProbeSite],
        loader: &mut Loader,
        plan: &mut ProbePlan,
        printer: &mut EventPrinter,
        format: Format,
    ) -> Result<()> {
        let inputs = sites
            .iter()
            .map(SiteInput::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let known_unavailable = plan.unavailable_args.len();
        let added = plan.add(&inputs, &[], self.mode, self.pid)?;
        warn_unavailable(&plan.unavailable_args[known_unavailable..], plan, format);
        loader.attach_more_usdt_sites(&plan.usdt_sites_in(added.clone()))?;
        printer.names = plan.probes.iter().map(|p| p.specifier()).collect();
        printer.types = probe_arg_types(plan);
        log::info!("attached {} more sites", added.len());
        Ok(())
    }
}

/// Sends SIGCONT to a process the kernel stopped for us.
fn continue_process(pid: u32) {
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// Has the kernel hold the traced processes each time their dynamic loader has mapped a
/// library (`dlopen`), so that its probes are attached before it runs: the loaders of
/// the command, of the processes traced and of the `--exe` file.
fn hold_at_dlopen(
    loader: &mut Loader,
    child: &Option<PausedChild>,
    pids: &[u32],
    exe: Option<&std::path::Path>,
    single: Option<u32>,
) -> anyhow::Result<()> {
    // (executable, the root its loader's path is under)
    let exes: Vec<(PathBuf, PathBuf)> = match child {
        Some(child) => vec![(child.exe.clone(), PathBuf::from("/"))],
        None => pids
            .iter()
            .map(|pid| {
                (
                    PathBuf::from(format!("/proc/{pid}/exe")),
                    PathBuf::from(format!("/proc/{pid}/root")),
                )
            })
            .chain(exe.map(|e| (e.to_path_buf(), PathBuf::from("/"))))
            .collect(),
    };
    let mut loaders: Vec<PathBuf> = Vec::new();
    for (exe, root) in exes {
        let Some(interp) = usdt::interpreter(&exe) else {
            continue;
        };
        let path = root.join(interp.strip_prefix("/").unwrap_or(&interp));
        if let Ok(path) = std::fs::canonicalize(&path)
            && !loaders.contains(&path)
        {
            loaders.push(path);
        }
    }
    for path in loaders {
        match usdt::dl_debug_state_offset(&path) {
            Some(offset) => loader.hold_at_dlopen(&path, offset, single)?,
            None => log::warn!(
                "{}: no _dl_debug_state: a library loaded later is found within {} ms, \
                 and its first hits may be missed",
                path.display(),
                LOOK_EVERY * LOOK_PERIOD.as_millis() as u32
            ),
        }
    }
    Ok(())
}

/// One warning per argument events cannot show.
fn warn_unavailable(args: &[crate::probe_plan::UnavailableArg], plan: &ProbePlan, format: Format) {
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
    types: Vec<Vec<ArgType>>,
    started_ns: u64,
    count: u64,
}

impl EventPrinter {
    /// Formats every event waiting in the ring buffer: the text, and how many events.
    fn format(&mut self, ring: &mut RecordRing) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut count = 0;
        ring.drain(|item| {
            if item.len() < std::mem::size_of::<UsdtEvent>() {
                return;
            }
            // SAFETY: the kernel wrote a whole UsdtEvent (checked length); read_unaligned
            // copes with the ring buffer's 8-byte alignment guarantee either way.
            let event: UsdtEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            // Writing into a Vec cannot fail.
            let _ = self.print(&mut out, &event);
            count += 1;
        });
        self.count += count;
        (out, count)
    }

    fn print(&self, out: &mut impl std::io::Write, event: &UsdtEvent) -> std::io::Result<()> {
        let id = event.probe_id as usize;
        let name = self.names.get(id).map(String::as_str).unwrap_or("?");
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
                let line = json!({
                    "time_ns": event.ts_ns,
                    "pid": event.pid,
                    "tid": event.tid,
                    "probe": name,
                    "args": values,
                });
                writeln!(out, "{line}")
            }
            Format::Text => {
                let secs = event.ts_ns.saturating_sub(self.started_ns) as f64 / 1e9;
                // Probe names come from the target's notes and paths.
                let name = escape_text(name);
                write!(out, "{secs:>12.6} {:>7} {:>7} {name}", event.pid, event.tid)?;
                for i in 0..args.len() {
                    match value(i) {
                        Some((ty, v)) => write!(out, " {}", ty.text(v))?,
                        None => write!(out, " ?")?,
                    }
                }
                writeln!(out)
            }
        }
    }
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
            names: vec!["usdt:/tmp/a\x07:p\x1b[31m:n\r".into()],
            types: vec![vec![ArgType::Signed]],
            started_ns: 0,
            count: 0,
        };
        // SAFETY: UsdtEvent is plain old data; all zeroes is a valid value.
        let mut event: UsdtEvent = unsafe { std::mem::zeroed() };
        event.ts_ns = 1_500_000_000;
        event.pid = 7;
        event.tid = 8;
        event.arg_count = 1;
        event.args[0] = -3i64 as u64;
        let mut out = Vec::new();
        printer.print(&mut out, &event).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "    1.500000       7       8 usdt:/tmp/a\\x07:p\\x1b[31m:n\\x0d -3\n"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event).unwrap();
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
        printer.print(&mut out, &event).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(" usdt:/a:p:n 18446744073709551615 -2 -1.25 2.5 ?\n"),
            "{text}"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            line["args"],
            json!([18446744073709551615u64, -2, -1.25, 2.5, null])
        );
    }
}
