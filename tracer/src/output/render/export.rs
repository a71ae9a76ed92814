//! Profiles for other tools, from the wall-clock views: pprof (`wallclock.pb.gz`, a
//! gzipped protobuf written by a minimal encoder) and speedscope JSON.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use crate::{
    output::render::write_output,
    profile::wallclock::OFF_CPU_FRAME,
    stack::naming::{StackProfile, Weight, parse_process_frame},
};

/// What the pprof and speedscope files say about the run.
#[derive(Debug, Clone)]
pub struct ExportInfo<'a> {
    /// What was profiled, e.g. `gc-demo (pid 42)` or `all processes`.
    pub name: &'a str,
    pub frequency_hz: u64,
    /// Wall-clock time (Unix epoch) when profiling started.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    /// Each sample carries labels `process` and `pid`, from its root frame when that
    /// names a process (`name [pid]`, or the name alone).
    pub process_labels: bool,
    /// The one process profiled, whose root frame is its name alone: its PID.
    pub only_pid: Option<u32>,
}

/// A minimal protobuf writer: varints, length-delimited fields, packed repeated varints.
#[derive(Debug, Default)]
pub struct ProtoWriter {
    buf: Vec<u8>,
}

impl ProtoWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.buf.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.buf.push(value as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire_type));
    }

    /// A varint field (int64, uint64, bool); negative int64 values take ten bytes, as
    /// protobuf encodes them.
    pub fn uint(&mut self, field: u32, value: u64) {
        self.key(field, 0);
        self.varint(value);
    }

    pub fn int(&mut self, field: u32, value: i64) {
        self.uint(field, value as u64);
    }

    pub fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
    }

    pub fn message(&mut self, field: u32, build: impl FnOnce(&mut ProtoWriter)) {
        let mut inner = ProtoWriter::new();
        build(&mut inner);
        self.bytes(field, &inner.buf);
    }

    pub fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) {
        let mut inner = ProtoWriter::new();
        for value in values {
            inner.varint(value);
        }
        self.bytes(field, &inner.buf);
    }
}

/// Encodes `profile` as a pprof `Profile` message (profile.proto): sample types
/// `samples/count` (on-CPU samples plus off-CPU intervals) and `wall/microseconds` (the
/// default); one function and one location per distinct frame name; no mappings (frames
/// are named already). Frame names are exactly those of the folded files.
pub fn encode_pprof(profile: &StackProfile, info: &ExportInfo<'_>) -> Vec<u8> {
    let mut strings: Vec<String> = vec![String::new()];
    let mut string_ids: HashMap<String, u64> = HashMap::from([(String::new(), 0)]);
    let mut intern = |s: &str| -> u64 {
        if let Some(&id) = string_ids.get(s) {
            return id;
        }
        let id = strings.len() as u64;
        strings.push(s.to_string());
        string_ids.insert(s.to_string(), id);
        id
    };
    let samples_type = (intern("samples"), intern("count"));
    let wall_type = (intern("wall"), intern("microseconds"));
    let period_type = (intern("cpu"), intern("nanoseconds"));
    let comment = intern(&format!(
        "tracer profile of {}: on-CPU samples at {} Hz and off-CPU intervals (leaf frame {OFF_CPU_FRAME})",
        info.name, info.frequency_hz
    ));

    // Function and location ids are the same: the frame name's index among functions.
    let mut functions: Vec<u64> = Vec::new(); // name string id per function
    let mut function_ids: HashMap<u64, u64> = HashMap::new();
    let mut samples: Vec<EncodedSample> = Vec::new();
    let (process_key, pid_key) = (intern("process"), intern("pid"));
    for (frames, weight) in profile.iter() {
        let labels = match (info.process_labels, frames.first()) {
            (true, Some(root)) => match parse_process_frame(root) {
                Some((name, pid)) => vec![
                    (process_key, Label::Text(intern(name))),
                    (pid_key, Label::Number(pid.into())),
                ],
                None => {
                    let process = (process_key, Label::Text(intern(root)));
                    match info.only_pid {
                        Some(pid) => vec![process, (pid_key, Label::Number(pid.into()))],
                        None => vec![process],
                    }
                }
            },
            _ => Vec::new(),
        };
        let locations = frames
            .iter()
            .rev()
            .map(|frame| {
                let name = intern(frame);
                *function_ids.entry(name).or_insert_with(|| {
                    functions.push(name);
                    functions.len() as u64
                })
            })
            .collect();
        samples.push((locations, weight, labels));
    }

    let mut out = ProtoWriter::new();
    for (field, (kind, unit)) in [(1, samples_type), (1, wall_type)] {
        out.message(field, |m| {
            m.uint(1, kind);
            m.uint(2, unit);
        });
    }
    for (locations, weight, labels) in &samples {
        out.message(2, |m| {
            m.packed(1, locations.iter().copied());
            m.packed(2, [weight.events, weight.us()]);
            for &(key, value) in labels {
                m.message(3, |label| {
                    label.uint(1, key);
                    match value {
                        Label::Text(text) => label.uint(2, text),
                        Label::Number(number) => label.int(3, number),
                    }
                });
            }
        });
    }
    for id in 1..=functions.len() as u64 {
        out.message(4, |m| {
            m.uint(1, id);
            m.message(4, |line| line.uint(1, id));
        });
    }
    for (index, &name) in functions.iter().enumerate() {
        out.message(5, |m| {
            m.uint(1, index as u64 + 1);
            m.uint(2, name);
            m.uint(3, name);
        });
    }
    for s in &strings {
        out.bytes(6, s.as_bytes());
    }
    out.int(9, info.start_unix_ns as i64);
    out.int(10, info.duration_ns as i64);
    out.message(11, |m| {
        m.uint(1, period_type.0);
        m.uint(2, period_type.1);
    });
    out.int(12, (1_000_000_000 / info.frequency_hz.max(1)) as i64);
    out.packed(13, [comment]);
    out.uint(14, wall_type.0);
    out.into_bytes()
}

/// A sample's location ids, its weight, and its labels (key string id, value).
type EncodedSample = (Vec<u64>, Weight, Vec<(u64, Label)>);

/// A pprof label's value: a string's id, or a number.
#[derive(Debug, Clone, Copy)]
enum Label {
    Text(u64),
    Number(i64),
}

/// Writes `profile` as gzip-compressed pprof to `path`.
pub fn write_pprof(profile: &StackProfile, info: &ExportInfo<'_>, path: &Path) -> io::Result<()> {
    let bytes = encode_pprof(profile, info);
    write_output(path, |out| {
        let mut gz = flate2::write::GzEncoder::new(out, Default::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    })
}

/// A speedscope file (https://www.speedscope.app/file-format-schema.json), written as it
/// is typed: no JSON tree of every sample is built. Fields in name order, as the file
/// was first written.
#[derive(Debug, serde::Serialize)]
pub struct Speedscope<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: u32,
    exporter: &'static str,
    name: String,
    profiles: Vec<SpeedscopeProfile>,
    shared: SpeedscopeFrames<'a>,
}

/// The frames every profile of a [`Speedscope`] file refers to by index.
#[derive(Debug, serde::Serialize)]
struct SpeedscopeFrames<'a> {
    frames: Vec<SpeedscopeFrame<'a>>,
}

#[derive(Debug, serde::Serialize)]
struct SpeedscopeFrame<'a> {
    name: &'a str,
}

/// One view as a "sampled" profile: each stack (frame indices, root first) and its
/// weight in microseconds.
#[derive(Debug, serde::Serialize)]
struct SpeedscopeProfile {
    #[serde(rename = "endValue")]
    end_value: u64,
    name: String,
    samples: Vec<Vec<u32>>,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "type")]
    kind: &'static str,
    unit: &'static str,
    weights: Vec<u64>,
}

/// The profiles as one speedscope file: one "sampled" profile per view, weighted in
/// microseconds, frames shared.
pub fn speedscope<'a>(views: &[(&str, &'a StackProfile)], info: &ExportInfo<'_>) -> Speedscope<'a> {
    let mut frames: Vec<SpeedscopeFrame<'a>> = Vec::new();
    let mut frame_ids: HashMap<&'a str, u32> = HashMap::new();
    let mut profiles = Vec::new();
    for (name, profile) in views {
        let mut samples = Vec::new();
        let mut weights = Vec::new();
        for (stack, weight) in profile.iter() {
            let ids: Vec<u32> = stack
                .iter()
                .map(|&frame| {
                    *frame_ids.entry(frame).or_insert_with(|| {
                        frames.push(SpeedscopeFrame { name: frame });
                        frames.len() as u32 - 1
                    })
                })
                .collect();
            samples.push(ids);
            weights.push(weight.us());
        }
        profiles.push(SpeedscopeProfile {
            kind: "sampled",
            name: format!("{name}: {}", info.name),
            unit: "microseconds",
            start_value: 0,
            end_value: profile.total_us(),
            samples,
            weights,
        });
    }
    Speedscope {
        schema: "https://www.speedscope.app/file-format-schema.json",
        name: format!("tracer profile of {}", info.name),
        exporter: concat!("tracer ", env!("CARGO_PKG_VERSION")),
        active_profile_index: 0,
        shared: SpeedscopeFrames { frames },
        profiles,
    }
}

/// Writes the speedscope file.
pub fn write_speedscope(
    views: &[(&str, &StackProfile)],
    info: &ExportInfo<'_>,
    path: &Path,
) -> io::Result<()> {
    write_output(path, |out| {
        serde_json::to_writer(out, &speedscope(views, info))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads one varint at `pos`, advancing it.
    fn varint(buf: &[u8], pos: &mut usize) -> u64 {
        let mut value = 0;
        let mut shift = 0;
        loop {
            let byte = buf[*pos];
            *pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return value;
            }
            shift += 7;
        }
    }

    /// (field, varint value or bytes) of every top-level field.
    fn fields(buf: &[u8]) -> Vec<(u32, Result<u64, Vec<u8>>)> {
        let mut pos = 0;
        let mut out = Vec::new();
        while pos < buf.len() {
            let key = varint(buf, &mut pos);
            let field = (key >> 3) as u32;
            match key & 7 {
                0 => out.push((field, Ok(varint(buf, &mut pos)))),
                2 => {
                    let len = varint(buf, &mut pos) as usize;
                    out.push((field, Err(buf[pos..pos + len].to_vec())));
                    pos += len;
                }
                other => panic!("wire type {other}"),
            }
        }
        out
    }

    #[test]
    fn varints_and_fields_encode_like_protobuf() {
        let mut w = ProtoWriter::new();
        w.uint(1, 150);
        w.bytes(2, b"testing");
        w.packed(4, [3, 270, 86942]);
        w.int(5, -1);
        let bytes = w.into_bytes();
        // The examples of the protobuf encoding guide.
        assert_eq!(&bytes[..3], &[0x08, 0x96, 0x01]);
        assert_eq!(&bytes[3..5], &[0x12, 0x07]);
        assert_eq!(&bytes[5..12], b"testing");
        assert_eq!(
            &bytes[12..20],
            &[0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05]
        );
        assert_eq!(bytes[20], 0x28);
        assert_eq!(
            &bytes[21..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    fn sample_profile() -> StackProfile {
        let mut p = StackProfile::default();
        let frames = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        p.add(
            frames(&["app", "main", "spin"]),
            Weight {
                events: 3,
                ns: 6_012_024,
            },
        );
        p.add(
            frames(&["app", "main", "sleep", OFF_CPU_FRAME]),
            Weight {
                events: 1,
                ns: 1_000_001,
            },
        );
        p
    }

    #[test]
    fn pprof_samples_add_up_to_the_folded_total() {
        let profile = sample_profile();
        let info = ExportInfo {
            name: "app (pid 1)",
            frequency_hz: 499,
            start_unix_ns: 1,
            duration_ns: 2,
            process_labels: false,
            only_pid: None,
        };
        let bytes = encode_pprof(&profile, &info);
        let top = fields(&bytes);
        let strings: Vec<String> = top
            .iter()
            .filter(|(f, _)| *f == 6)
            .map(|(_, v)| String::from_utf8(v.clone().unwrap_err()).unwrap())
            .collect();
        assert_eq!(strings[0], "");
        let mut wall_total = 0;
        let mut events_total = 0;
        let mut leaves = Vec::new();
        for (_, sample) in top.iter().filter(|(f, _)| *f == 2) {
            let sample = fields(sample.as_ref().unwrap_err());
            let packed = |field| {
                let bytes = sample
                    .iter()
                    .find(|(f, _)| *f == field)
                    .unwrap()
                    .1
                    .clone()
                    .unwrap_err();
                let mut pos = 0;
                let mut values = Vec::new();
                while pos < bytes.len() {
                    values.push(varint(&bytes, &mut pos));
                }
                values
            };
            let values = packed(2);
            events_total += values[0];
            wall_total += values[1];
            leaves.push(packed(1)[0]);
        }
        assert_eq!(
            wall_total,
            crate::output::render::flamegraph::FoldedStacks::from(&profile).total()
        );
        assert_eq!(wall_total, 6013 + 1001);
        assert_eq!(events_total, 4);
        // Functions name their frames; the first stack (sorted) is the blocked one.
        let function_names: Vec<String> = top
            .iter()
            .filter(|(f, _)| *f == 5)
            .map(|(_, v)| {
                let function = fields(v.as_ref().unwrap_err());
                let name = function.iter().find(|(f, _)| *f == 2).unwrap().1.clone();
                strings[name.unwrap() as usize].clone()
            })
            .collect();
        let leaf_names: Vec<&str> = leaves
            .iter()
            .map(|&id| function_names[id as usize - 1].as_str())
            .collect();
        assert_eq!(leaf_names, [OFF_CPU_FRAME, "spin"]);
        // default_sample_type is "wall".
        let default = top.iter().find(|(f, _)| *f == 14).unwrap().1.clone();
        assert_eq!(strings[default.unwrap() as usize], "wall");
    }

    #[test]
    fn speedscope_profiles_share_frames() {
        let profile = sample_profile();
        let info = ExportInfo {
            name: "app",
            frequency_hz: 99,
            start_unix_ns: 0,
            duration_ns: 0,
            process_labels: false,
            only_pid: None,
        };
        let json = serde_json::to_value(speedscope(
            &[("wall", &profile), ("again", &profile)],
            &info,
        ))
        .unwrap();
        assert_eq!(json["shared"]["frames"].as_array().unwrap().len(), 5);
        let first = &json["profiles"][0];
        assert_eq!(first["type"], "sampled");
        assert_eq!(first["endValue"], 6013 + 1001);
        // Stacks sorted, root first: app;main;sleep;[off-cpu], then app;main;spin.
        assert_eq!(first["samples"][0], serde_json::json!([0, 1, 2, 3]));
        assert_eq!(first["samples"][1], serde_json::json!([0, 1, 4]));
        assert_eq!(json["profiles"][1]["samples"], first["samples"]);
    }
}
