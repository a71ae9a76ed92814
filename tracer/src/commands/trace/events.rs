//! One line (or JSON object) per hit: the probe's arguments decoded by type, strings
//! cut, escaped or unavailable.

use std::collections::{BTreeMap, HashMap};

use tracer_common::{StackId, UsdtArg, UsdtEvent, UsdtStrHeader};

use super::hit_stacks::{FrameJson, StackNamer, stack_json, stack_text};
use crate::{
    cli::{Format, TraceConfig},
    kernel::RecordRing,
    probe::plan::ProbePlan,
    probe::usdt::{self},
    stack::naming::{HitStack, StackSource},
    system::stop,
    system::text::{escape_text, quote_bytes},
};

/// How each argument of a probe is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArgType {
    Unsigned,
    Signed,
    /// IEEE single precision, in the low 4 bytes.
    F32,
    F64,
}

impl ArgType {
    pub(super) fn of(arg: &UsdtArg) -> ArgType {
        match (arg.float != 0, arg.size, arg.signed != 0) {
            (true, 4, _) => ArgType::F32,
            (true, _, _) => ArgType::F64,
            (false, _, true) => ArgType::Signed,
            (false, _, false) => ArgType::Unsigned,
        }
    }

    pub(super) fn json(self, value: u64) -> ArgJson {
        match self {
            ArgType::Unsigned => ArgJson::Unsigned(value),
            ArgType::Signed => ArgJson::Signed(value as i64),
            ArgType::F32 => ArgJson::Float(f64::from(f32::from_bits(value as u32))),
            ArgType::F64 => ArgJson::Float(f64::from_bits(value)),
        }
    }

    pub(super) fn text(self, value: u64) -> String {
        match self {
            ArgType::Unsigned => value.to_string(),
            ArgType::Signed => (value as i64).to_string(),
            ArgType::F32 => f32::from_bits(value as u32).to_string(),
            ArgType::F64 => f64::from_bits(value).to_string(),
        }
    }
}

/// An argument's value in the JSON: `null` when the site cannot decode it. NaN and
/// infinities have no JSON number: serde_json writes them as `null` too.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub(super) enum ArgJson {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Missing,
}

/// One event's JSON line. Fields in name order, as the line was first written (serde_json's
/// maps sort their keys); the optional ones only when asked for.
#[derive(serde::Serialize)]
struct EventJson<'a> {
    args: Vec<ArgJson>,
    pid: u32,
    probe: &'a str,
    /// A function's return value (`uretprobe:`), whose `args` are empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    retval: Option<ArgJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stack: Option<Vec<FrameJson<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stack_problems: Option<&'a [String]>,
    /// `argN`: the string read (`--str`), `null` where the read failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    strings: Option<BTreeMap<String, Option<StrJson<'a>>>>,
    tid: u32,
    time_ns: u64,
}

/// A string argument: `text` is the string, invalid UTF-8 replaced by U+FFFD; then `hex`
/// holds its exact bytes (null when it is valid UTF-8, so `text` is exact).
#[derive(Debug, PartialEq, serde::Serialize)]
pub(super) struct StrJson<'a> {
    hex: Option<String>,
    text: std::borrow::Cow<'a, str>,
    truncated: bool,
}

/// How each argument of each probe is shown, from its first site's spec.
pub(super) fn probe_arg_types(plan: &ProbePlan) -> Vec<Vec<ArgType>> {
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

pub(super) struct EventPrinter {
    pub(super) format: Format,
    pub(super) names: Vec<String>,
    /// Each probe's kind: a function probe's arguments are labelled (`arg0=`,
    /// `retval=`).
    pub(super) kinds: Vec<usdt::ProbeKind>,
    pub(super) types: Vec<Vec<ArgType>>,
    pub(super) started_ns: u64,
    pub(super) count: u64,
    /// With `--stack`: names each event's stacks.
    pub(super) stacks: Option<StackNamer>,
    /// Counting (`--count --stack`): events are not printed. They announce new stacks
    /// to name now (frame pointers), or are hits, counted here by stack (DWARF).
    pub(super) counting: bool,
    /// Hits by probe and stack, from events (`--count --stack --unwind dwarf`).
    pub(super) counted: HashMap<(u32, HitStack), u64>,
}

impl EventPrinter {
    pub(super) fn new(
        config: &TraceConfig,
        plan: &ProbePlan,
        names: Vec<String>,
        types: Vec<Vec<ArgType>>,
        stacks: Option<StackNamer>,
    ) -> Self {
        EventPrinter {
            format: config.format,
            names,
            kinds: plan.probes.iter().map(|p| p.kind).collect(),
            types,
            started_ns: stop::monotonic_ns(),
            count: 0,
            stacks,
            counting: config.count,
            counted: HashMap::new(),
        }
    }

    /// Formats every event waiting in the ring buffer: the text, and how many events.
    pub(super) fn format(
        &mut self,
        ring: &mut RecordRing,
        stacks: &dyn StackSource,
    ) -> (Vec<u8>, u64) {
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
                    StackId::decode(event.user_stack_id),
                    StackId::decode(event.kernel_stack_id),
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
    pub(super) fn print(
        &self,
        out: &mut impl std::io::Write,
        event: &UsdtEvent,
        strings: &[(usize, Option<ShownStr>)],
        stack: Option<&HitStack>,
    ) -> std::io::Result<()> {
        let id = event.probe_id as usize;
        let name = self.names.get(id).map_or("?", String::as_str);
        let kind = self.kinds.get(id).copied().unwrap_or_default();
        let types = self.types.get(id).map_or(&[][..], Vec::as_slice);
        let args = &event.args[..(event.arg_count as usize).min(event.args.len())];
        // An argument the site cannot decode has no value, not 0.
        let value = |i: usize| -> Option<(ArgType, u64)> {
            let ty = types.get(i).copied().unwrap_or(ArgType::Unsigned);
            (event.unavailable & (1 << i) == 0).then(|| (ty, args[i]))
        };
        match self.format {
            Format::Json => {
                let mut values: Vec<ArgJson> = (0..args.len())
                    .map(|i| value(i).map_or(ArgJson::Missing, |(ty, v)| ty.json(v)))
                    .collect();
                let retval = (kind == usdt::ProbeKind::Uretprobe).then(|| {
                    std::mem::take(&mut values)
                        .first()
                        .copied()
                        .unwrap_or(ArgJson::Missing)
                });
                let strings = (!strings.is_empty()).then(|| {
                    strings
                        .iter()
                        .map(|(i, s)| {
                            let shown = match (value(*i), s) {
                                (Some(_), Some(s)) => Some(s.json()),
                                _ => None,
                            };
                            (format!("arg{i}"), shown)
                        })
                        .collect()
                });
                let line = EventJson {
                    args: values,
                    pid: event.pid,
                    probe: name,
                    retval,
                    stack: stack.map(stack_json),
                    stack_problems: stack.map(|s| s.problems.as_slice()),
                    strings,
                    tid: event.tid,
                    time_ns: event.ts_ns,
                };
                serde_json::to_writer(&mut *out, &line)?;
                writeln!(out)
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
pub(super) struct ShownStr {
    pub(super) bytes: Vec<u8>,
    /// The string had more bytes than shown.
    pub(super) truncated: bool,
}

impl ShownStr {
    /// Quoted and escaped (see [`quote_bytes`]), followed by `...` when cut, as strace
    /// shows strings.
    pub(super) fn text(&self) -> String {
        let dots = if self.truncated { "..." } else { "" };
        format!("{}{dots}", quote_bytes(&self.bytes))
    }

    /// The string for the JSON (see [`StrJson`]).
    pub(super) fn json(&self) -> StrJson<'_> {
        let hex = std::str::from_utf8(&self.bytes).is_err().then(|| {
            self.bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        });
        StrJson {
            hex,
            text: String::from_utf8_lossy(&self.bytes),
            truncated: self.truncated,
        }
    }
}

/// The strings after an event's fixed part (see [`UsdtStrHeader`]), by argument index:
/// `None` where the read failed.
pub(super) fn event_strings(mut area: &[u8]) -> Vec<(usize, Option<ShownStr>)> {
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
    use serde_json::json;

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
            u64::from((-1.25f32).to_bits()),
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
                    (&raw const header).cast::<u8>(),
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
