//! `tracer attach --timeline FILE`: every GC of the demo runtime with its phases, task
//! runs and parks, off-CPU intervals, in microseconds; and a real viewer (speedscope in
//! headless Chromium, as `cargo xtask setup` installs them) opens the file.

use std::{path::PathBuf, process::Command};

use crate::common::*;

/// speedscope's web app, where `cargo xtask setup` unpacks it.
fn speedscope_index() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let index = home.join(".cache/tracer/speedscope-1.25.0/package/dist/release/index.html");
    assert!(
        index.is_file(),
        "{} is missing: `cargo xtask setup` installs the viewer the timeline test opens",
        index.display()
    );
    index
}

/// The complete events (`"ph":"X"`) named `name`.
fn complete<'a>(events: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == name)
        .collect()
}

fn span(event: &serde_json::Value) -> (f64, f64) {
    let ts = event["ts"].as_f64().unwrap();
    (ts, ts + event["dur"].as_f64().unwrap())
}

/// Every GC is a `gc_pause` on the collector's track, as long (in µs) as gc-demo measured
/// it, holding its stop-the-world, mark and sweep phases; every task run and park is
/// there; off-CPU intervals are at least the threshold.
#[privileged_test]
fn every_gc_is_on_the_timeline_with_its_phases() {
    require_privileged();
    let file = out_dir("timeline-gc").with_extension("json");
    let run = attach_json(
        GC_DEMO,
        &["--gcs", "8", "--pause-ms", "12", "--interval-ms", "30"],
        "timeline-gc",
        &[
            "--timeline",
            file.to_str().unwrap(),
            "--timeline-min-block",
            "2ms",
        ],
    );
    assert_eq!(run.report["timeline"]["path"], file.to_str().unwrap());
    assert_eq!(run.report["timeline"]["lost"], 0);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let pauses = complete(events, "gc_pause");
    let list = |key: &str| -> Vec<u64> {
        run.truth[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap())
            .collect()
    };
    let (truth, inner) = (list("pause_ns"), list("pause_inner_ns"));
    assert_eq!(pauses.len(), truth.len(), "{pauses:?}");
    let collector = run.truth["pid"].as_u64().unwrap();
    for ((pause, &truth_ns), &inner_ns) in pauses.iter().zip(&truth).zip(&inner) {
        assert_eq!(pause["tid"], collector, "{pause}");
        // Microseconds: a 12 ms pause is about 12000.
        let dur_us = pause["dur"].as_f64().unwrap();
        assert!(
            inside_target_span((dur_us * 1e3) as u64, truth_ns, inner_ns, 1_000),
            "pause {dur_us} µs, gc-demo measured {inner_ns} to {truth_ns} ns"
        );
        let (start, end) = span(pause);
        for phase in ["gc_stop_the_world", "gc_mark", "gc_sweep"] {
            let inside = complete(events, phase)
                .into_iter()
                .filter(|p| {
                    let (s, e) = span(p);
                    p["tid"] == collector && s >= start && e <= end
                })
                .count();
            assert_eq!(inside, 1, "{phase} in the pause at {start} µs");
        }
    }
    // Each worker's task: its runs on its thread and on its own track, and its parks.
    for worker in run.truth["tasks"].as_array().unwrap() {
        let (id, runs) = (
            worker["id"].as_u64().unwrap(),
            worker["runs"].as_u64().unwrap(),
        );
        let track = events
            .iter()
            .find(|e| {
                e["name"] == "thread_name"
                    && e["args"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with(&format!("task #{id} on ")))
            })
            .unwrap_or_else(|| panic!("no track for task {id}"));
        let on_track = |name: &str| {
            complete(events, name)
                .into_iter()
                .filter(|e| e["tid"] == track["tid"])
                .count() as u64
        };
        assert_eq!(on_track("running"), runs, "task {id}");
        // Parked between runs, and from the last run to its finish.
        assert!(on_track("parked").abs_diff(runs) <= 1, "task {id}");
    }
    let blocked = complete(events, "blocked");
    assert!(!blocked.is_empty());
    assert!(blocked.iter().all(|e| e["dur"].as_f64().unwrap() >= 2000.0));
    let _ = std::fs::remove_file(file);
}

/// The timeline of a gc-demo run opens in speedscope (headless Chromium): every track the
/// file names is listed, as many as there are; a screenshot of the first (the collector's
/// GCs and their phases) is left in the output directory.
#[privileged_test]
fn the_timeline_opens_in_a_real_viewer() {
    require_privileged();
    let index = speedscope_index();
    let dir = out_dir("timeline-viewer");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("timeline.json");
    let run = attach_json(
        GC_DEMO,
        &["--gcs", "6", "--pause-ms", "10", "--interval-ms", "20"],
        "timeline-viewer-run",
        &["--timeline", file.to_str().unwrap()],
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let tracks: Vec<String> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    // The collector and the workers, and each worker's task.
    for thread in ["gc-demo", "sleeper", "lock-holder", "lock-waiter"] {
        assert!(
            tracks.iter().any(|t| t.starts_with(&format!("{thread} ["))),
            "{tracks:?}"
        );
    }
    for worker in run.truth["tasks"].as_array().unwrap() {
        let task = format!("task #{} on ", worker["id"]);
        assert!(tracks.iter().any(|t| t.starts_with(&task)), "{tracks:?}");
    }
    // speedscope's own way in: a script that hands it the file (what its CLI writes).
    let encoded = Command::new("base64")
        .arg("-w0")
        .arg(&file)
        .output()
        .unwrap();
    assert!(encoded.status.success());
    let loader = dir.join("timeline.js");
    std::fs::write(
        &loader,
        format!(
            "speedscope.loadFileFromBase64('timeline.json', '{}')\n",
            String::from_utf8(encoded.stdout).unwrap()
        ),
    )
    .unwrap();
    let url = format!(
        "file://{}#localProfilePath={}",
        index.display(),
        loader.display()
    );
    let chromium = |extra: &str| {
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1400,900",
                "--virtual-time-budget=10000",
                extra,
            ])
            .arg(&url)
            .output()
            .expect("chromium (`cargo xtask setup` installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = chromium("--dump-dom");
    assert!(dom.contains("timeline.json - speedscope"), "{dom}");
    for track in &tracks {
        assert!(
            dom.contains(&format!("{track} (tid ")),
            "{track} not in the viewer: {dom}"
        );
    }
    assert!(dom.contains(&format!("(1/{})", tracks.len())), "{dom}");
    let shot = dir.join("timeline.png");
    chromium(&format!("--screenshot={}", shot.display()));
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    eprintln!(
        "timeline: {} tracks open in speedscope; screenshot {}",
        tracks.len(),
        shot.display()
    );
    let _ = std::fs::remove_dir_all(&run.dir);
}
