//! Profiles for other tools, from the wall-clock views: pprof (`wallclock.pb.gz`, a
//! gzipped protobuf of the `pprof` module's messages) and speedscope JSON.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use super::pprof;
use crate::{
    output::render::write_output,
    profile::wallclock::OFF_CPU_FRAME,
    stack::naming::{StackProfile, parse_process_frame},
};

/// What the pprof and speedscope files say about the run.
#[derive(Debug, Clone)]
pub(crate) struct ExportInfo<'a> {
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

/// Encodes `profile` as a pprof `Profile` message (profile.proto): sample types
/// `samples/count` (on-CPU samples plus off-CPU intervals) and `wall/microseconds` (the
/// default); one function and one location per distinct frame name; no mappings (frames
/// are named already). Frame names are exactly those of the folded files.
pub(crate) fn encode_pprof(profile: &StackProfile, info: &ExportInfo<'_>) -> Vec<u8> {
    let mut strings = StringTable::default();
    let value_type = |strings: &mut StringTable, kind: &str, unit: &str| pprof::ValueType {
        r#type: strings.index(kind),
        unit: strings.index(unit),
    };
    let samples_type = value_type(&mut strings, "samples", "count");
    let wall_type = value_type(&mut strings, "wall", "microseconds");
    let period_type = value_type(&mut strings, "cpu", "nanoseconds");
    let comment = strings.index(&format!(
        "tracer profile of {}: on-CPU samples at {} Hz and off-CPU intervals (leaf frame {OFF_CPU_FRAME})",
        info.name, info.frequency_hz
    ));

    // Function and location ids are the same: the frame name's index among functions.
    let mut functions: Vec<i64> = Vec::new(); // name string index per function
    let mut function_ids: HashMap<i64, u64> = HashMap::new();
    // Each sample is encoded as it is made, so that only one is held at a time: a profile
    // has as many samples as distinct stacks. Protobuf reads fields in any order, and
    // repeated fields split across a message as one list.
    let mut encoded = Vec::new();
    let (process_key, pid_key) = (strings.index("process"), strings.index("pid"));
    for (frames, weight) in profile.iter() {
        let text = |key, value| pprof::Label {
            key,
            str: value,
            num: 0,
        };
        let number = |key, value| pprof::Label {
            key,
            str: 0,
            num: value,
        };
        let label = match (info.process_labels, frames.first()) {
            (true, Some(root)) => {
                if let Some((name, pid)) = parse_process_frame(root) {
                    vec![
                        text(process_key, strings.index(name)),
                        number(pid_key, pid.into()),
                    ]
                } else {
                    let process = text(process_key, strings.index(root));
                    match info.only_pid {
                        Some(pid) => vec![process, number(pid_key, pid.into())],
                        None => vec![process],
                    }
                }
            }
            _ => Vec::new(),
        };
        let location_id = frames
            .iter()
            .rev()
            .map(|frame| {
                let name = strings.index(frame);
                *function_ids.entry(name).or_insert_with(|| {
                    functions.push(name);
                    functions.len() as u64
                })
            })
            .collect();
        let sample = pprof::Sample {
            location_id,
            value: vec![weight.events as i64, weight.us() as i64],
            label,
        };
        prost::encoding::message::encode(SAMPLE_FIELD, &sample, &mut encoded);
    }
    let ids = 1..=functions.len() as u64;
    let profile = pprof::Profile {
        sample_type: vec![samples_type, wall_type],
        sample: Vec::new(),
        location: ids
            .clone()
            .map(|id| pprof::Location {
                id,
                line: vec![pprof::Line { function_id: id }],
            })
            .collect(),
        function: ids
            .zip(functions)
            .map(|(id, name)| pprof::Function {
                id,
                name,
                system_name: name,
            })
            .collect(),
        string_table: strings.strings,
        time_nanos: info.start_unix_ns as i64,
        duration_nanos: info.duration_ns as i64,
        period_type: Some(period_type),
        period: (1_000_000_000 / info.frequency_hz.max(1)) as i64,
        comment: vec![comment],
        default_sample_type: wall_type.r#type,
    };
    prost::Message::encode(&profile, &mut encoded).expect("a Vec grows as needed");
    encoded
}

/// `Profile.sample`'s field number.
const SAMPLE_FIELD: u32 = 2;

/// pprof's string table: each distinct string once, by index; the first is empty.
struct StringTable {
    strings: Vec<String>,
    indices: HashMap<String, i64>,
}

impl Default for StringTable {
    fn default() -> Self {
        StringTable {
            strings: vec![String::new()],
            indices: HashMap::from([(String::new(), 0)]),
        }
    }
}

impl StringTable {
    fn index(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.indices.get(text) {
            return index;
        }
        let index = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.indices.insert(text.to_string(), index);
        index
    }
}

/// Writes `profile` as gzip-compressed pprof to `path`.
pub(crate) fn write_pprof(
    profile: &StackProfile,
    info: &ExportInfo<'_>,
    path: &Path,
) -> io::Result<()> {
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
pub(crate) struct Speedscope<'a> {
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
pub(crate) fn speedscope<'a>(
    views: &[(&str, &'a StackProfile)],
    info: &ExportInfo<'_>,
) -> Speedscope<'a> {
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
pub(crate) fn write_speedscope(
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
    use crate::stack::naming::Weight;

    fn sample_profile() -> StackProfile {
        let mut p = StackProfile::default();
        let frames = |v: &[&str]| {
            v.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
        };
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
        let decoded = <pprof::Profile as prost::Message>::decode(bytes.as_slice()).unwrap();
        let strings = &decoded.string_table;
        assert_eq!(strings[0], "");
        let wall_total: i64 = decoded.sample.iter().map(|s| s.value[1]).sum();
        let events_total: i64 = decoded.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(
            wall_total as u64,
            crate::output::render::flamegraph::FoldedStacks::from(&profile).total()
        );
        assert_eq!(wall_total, 6013 + 1001);
        assert_eq!(events_total, 4);
        // Functions name their frames; the first stack (sorted) is the blocked one.
        let function_name = |id: u64| {
            let function = decoded.function.iter().find(|f| f.id == id).unwrap();
            strings[function.name as usize].as_str()
        };
        let leaf_names: Vec<&str> = decoded
            .sample
            .iter()
            .map(|s| function_name(s.location_id[0]))
            .collect();
        assert_eq!(leaf_names, [OFF_CPU_FRAME, "spin"]);
        // Each location is its function's one line.
        for location in &decoded.location {
            assert_eq!(
                location.line,
                [pprof::Line {
                    function_id: location.id
                }]
            );
        }
        assert_eq!(strings[decoded.default_sample_type as usize], "wall");
        assert_eq!(decoded.period, 1_000_000_000 / 499);
        assert!(strings[decoded.comment[0] as usize].starts_with("tracer profile of app"));
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
