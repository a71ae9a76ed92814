//! `tracer trace PROBE... [-- CMD]`: one line per probe hit with its decoded arguments.

use std::num::NonZeroU32;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::io::{Interest, unix::AsyncFd};
use tracer_common::{UsdtArg, UsdtEvent, UsdtStrHeader, counter};

use crate::{
    cli::{Format, TraceConfig},
    console::{OutputError, OutputStream},
    launch::PausedChild,
    loader::{Features, Loader, RecordRing, Settings},
    privileges,
    probe_plan::{ProbePlan, SiteInput, SiteMode},
    procfs,
    stop::{self, ProcessWatch, StopReason},
    targets::{self, TargetSpec, TargetTracker},
    text::{escape_text, quote_bytes},
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
        (None, None) => Scope::Files { exe: None },
    };
    let watch = single.map(ProcessWatch::target).transpose()?;
    // A target watched is known to have existed: missing, it exited.
    let on_target = |e: anyhow::Error| match single {
        Some(pid) => procfs::target_error(pid, e),
        None => e,
    };
    let resolved = usdt::resolve(&specs, scope).map_err(|e| match single {
        Some(pid) => procfs::target_error(pid, e.of_target()),
        None => e.into(),
    })?;
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
    plan.show_strings(&config.strings)?;
    for arg in &plan.unavailable_args {
        log::warn!(
            "{}: arg{} {}: unavailable, shown as {}",
            escape_text(&plan.probes[arg.probe_id as usize].specifier()),
            arg.index,
            escape_text(&arg.reason),
            match config.format {
                Format::Text => "?",
                Format::Json => "null",
            }
        );
    }
    let types = probe_arg_types(&plan);

    let mut loader = Loader::load(&Settings {
        targets: targets.clone(),
        ring_buffer_bytes: config.ring_buffer_bytes,
        plan_sizes: Some(plan.sizes()),
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
    let probe_names: Vec<String> = plan.probes.iter().map(|p| p.specifier()).collect();
    let _diagnostics = loader.start_diagnostics(&probe_names);
    let events = loader.take_events()?;
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
                pump(&mut events, &mut printer, &out),
                targets::track(tracker.as_mut()),
            ),
        )
        .await?;
        Ok::<_, std::io::Error>((reason, events.into_inner()))
    })?;
    loader.stop_recording()?;
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
) -> std::io::Result<StopReason> {
    loop {
        tokio::select! {
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
            let strings = event_strings(&item[std::mem::size_of::<UsdtEvent>()..]);
            // Writing into a Vec cannot fail.
            let _ = self.print(&mut out, &event, &strings);
            count += 1;
        });
        self.count += count;
        (out, count)
    }

    fn print(
        &self,
        out: &mut impl std::io::Write,
        event: &UsdtEvent,
        strings: &[(usize, Option<ShownStr>)],
    ) -> std::io::Result<()> {
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
                let mut line = json!({
                    "time_ns": event.ts_ns,
                    "pid": event.pid,
                    "tid": event.tid,
                    "probe": name,
                    "args": values,
                });
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
                writeln!(out, "{line}")
            }
            Format::Text => {
                let secs = event.ts_ns.saturating_sub(self.started_ns) as f64 / 1e9;
                // Probe names come from the target's notes and paths.
                let name = escape_text(name);
                write!(out, "{secs:>12.6} {:>7} {:>7} {name}", event.pid, event.tid)?;
                for i in 0..args.len() {
                    let string = strings.iter().find(|(arg, _)| *arg == i);
                    match (value(i), string) {
                        (Some(_), Some((_, Some(s)))) => write!(out, " {}", s.text())?,
                        // No string where one was asked for: the pointer was NULL or
                        // unmapped.
                        (None, _) | (_, Some((_, None))) => write!(out, " ?")?,
                        (Some((ty, v)), None) => write!(out, " {}", ty.text(v))?,
                    }
                }
                writeln!(out)
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
        printer.print(&mut out, &event, &[]).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "    1.500000       7       8 usdt:/tmp/a\\x07:p\\x1b[31m:n\\x0d -3\n"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[]).unwrap();
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
        printer.print(&mut out, &event, &[]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(" usdt:/a:p:n 18446744073709551615 -2 -1.25 2.5 ?\n"),
            "{text}"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &[]).unwrap();
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
            names: vec!["usdt:/a:p:n".into()],
            types: vec![vec![ArgType::Unsigned; 6]],
            started_ns: 0,
            count: 0,
        };
        // SAFETY: UsdtEvent is plain old data; all zeroes is a valid value.
        let mut event: UsdtEvent = unsafe { std::mem::zeroed() };
        event.arg_count = 6;
        event.args[..6].copy_from_slice(&[0x1000, 0x2000, 0x3000, 0x4000, 0, 9]);
        let mut out = Vec::new();
        printer.print(&mut out, &event, &strings).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(" usdt:/a:p:n \"ab\\\"c\" \"abcd\" \"abcd\"... \"\\xff\\x0a\" ? 9\n"),
            "{text}"
        );
        printer.format = Format::Json;
        let mut out = Vec::new();
        printer.print(&mut out, &event, &strings).unwrap();
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
        printer.print(&mut out, &event, &[]).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(line.get("strings").is_none());
    }
}
