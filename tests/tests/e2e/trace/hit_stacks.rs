//! `tracer trace --stack`: the stacks of USDT probe hits, counted per stack (folded file,
//! flame graph, summary) and printed per event, demangled; bpftrace's `ustack` on the same
//! target agreeing on the counts per call path.

use std::{collections::BTreeMap, process::Command};

use crate::common::*;

/// The C target, with frame pointers; a copy per test (`name`), as tests run at once and
/// a file being run cannot be rewritten.
fn c_target(name: &str) -> std::path::PathBuf {
    compile_target(
        "gcc",
        "src/hitstacks/hitstacks.c",
        name,
        &["-fno-omit-frame-pointer"],
    )
}

fn cpp_target() -> std::path::PathBuf {
    compile_target(
        "g++",
        "src/hitstacks/hitstacks.cpp",
        "hitstacks-cpp",
        &["-fno-omit-frame-pointer"],
    )
}

/// Folded lines (`frame;frame;... count`) → count.
fn folded_lines(folded: &str) -> BTreeMap<Vec<String>, u64> {
    folded
        .lines()
        .map(|line| {
            let (stack, n) = line.rsplit_once(' ').unwrap();
            (
                stack.split(';').map(str::to_string).collect(),
                n.parse().unwrap(),
            )
        })
        .collect()
}

/// Whether `frames` holds `wanted` in this order (others may come between).
fn in_order(frames: &[String], wanted: &[&str]) -> bool {
    let mut wanted = wanted.iter().peekable();
    for frame in frames {
        if wanted.peek().is_some_and(|w| frame == *w) {
            wanted.next();
        }
    }
    wanted.peek().is_none()
}

/// 30 hits from path_a and 70 from path_b: `--count --stack` writes exactly those
/// counts under the probe's root frame, each under the right call chain (root first:
/// main, run_X, path_X), with the text summary saying the same.
#[privileged_test]
fn counts_hits_per_stack_into_a_flame_graph() {
    require_privileged();
    let bin = c_target("hitstacks-count");
    let out = out_dir("hit-stacks-count");
    let probe = format!("usdt:{}:hitstacks:hit", bin.display());
    let stdout = TracerRun::trace()
        .args(["--count", "--stack"])
        .out(&out)
        .arg(&probe)
        .command(&bin, ["30", "70"])
        .run()
        .stdout;
    let folded = std::fs::read_to_string(out.join("hits.folded")).unwrap();
    let svg = std::fs::read_to_string(out.join("hits.svg")).unwrap();
    assert!(svg.contains("path_a") && svg.contains("path_b"), "{svg}");
    let lines = folded_lines(&folded);
    assert_eq!(lines.len(), 2, "two call paths, one stack each:\n{folded}");
    for (path, run, n) in [("path_a", "run_a", 30), ("path_b", "run_b", 70)] {
        let (frames, count) = lines
            .iter()
            .find(|(frames, _)| frames.last().map(String::as_str) == Some(path))
            .unwrap_or_else(|| panic!("no stack ending in {path}:\n{folded}"));
        assert_eq!(*count, n, "{folded}");
        assert_eq!(frames[0], probe, "the probe is the root frame: {folded}");
        assert!(
            in_order(frames, &["main", run, path]),
            "{path}'s stack: {frames:?}"
        );
        assert!(
            !frames.iter().any(|f| f.starts_with('[')),
            "a complete stack has no problem frame: {frames:?}"
        );
        // The summary shows the same stack, innermost first, with its count.
        let block = format!("    {path}+");
        let at = stdout
            .find(&block)
            .unwrap_or_else(|| panic!("no {path} in:\n{stdout}"));
        let rest = &stdout[at..];
        let end = rest.find("]: ").unwrap();
        let shown: Vec<&str> = rest[..end].lines().map(str::trim).collect();
        assert!(shown[1].starts_with(&format!("{run}+")), "{shown:?}");
        assert!(shown[2].starts_with("main+"), "{shown:?}");
        assert!(rest[end..].starts_with(&format!("]: {n}\n")), "{stdout}");
    }
    assert!(
        stdout.contains("]: 100\n"),
        "total hits of the probe: {stdout}"
    );
}

/// bpftrace's `@[ustack] = count()` on the same target: the same counts per call path,
/// as many frames in each stack (bpftrace prints bare addresses, as the process exited
/// before it named them; the tracer names them while it runs).
#[privileged_test]
fn agrees_with_bpftrace_ustack_counts() {
    require_privileged();
    let bin = c_target("hitstacks-bpftrace");
    let command = format!("{} 30 70", bin.display());
    let script = format!(
        "BEGIN {{ printf(\"Tracing\\n\") }} usdt:{}:hitstacks:hit {{ @[ustack] = count(); }}",
        bin.display()
    );
    let output = Command::new("bpftrace")
        .args(["-e", &script, "-c", &command])
        .output()
        .expect("bpftrace is installed by `cargo xtask setup`");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    // `@[\n    frame\n    ...\n]: N` blocks.
    let mut bpftrace_counts: Vec<u64> = text
        .split("@[")
        .skip(1)
        .map(|block| {
            let (_, n) = block.rsplit_once("]: ").unwrap();
            n.trim().parse().unwrap()
        })
        .collect();
    bpftrace_counts.sort_unstable();
    assert_eq!(bpftrace_counts, [30, 70], "{text}");

    let out = out_dir("hit-stacks-bpftrace");
    let probe = format!("usdt:{}:hitstacks:hit", bin.display());
    let run = TracerRun::trace()
        .args(["--count", "--stack"])
        .json()
        .out(&out)
        .arg(&probe)
        .command(&bin, ["30", "70"])
        .run();
    let summary = run.json_line_with("stacks");
    let mut ours: Vec<(u64, String)> = summary["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let innermost = s["stack"][0]["function"].as_str().unwrap().to_string();
            (s["count"].as_u64().unwrap(), innermost)
        })
        .collect();
    ours.sort();
    assert_eq!(
        ours,
        [(30, "path_a".to_string()), (70, "path_b".to_string())],
        "{summary}"
    );
    // As many frames as bpftrace walked, per path.
    for s in summary["stacks"].as_array().unwrap() {
        let n = s["count"].as_u64().unwrap();
        let block = text
            .split("@[")
            .skip(1)
            .find(|b| b.trim_end().ends_with(&format!("]: {n}")))
            .unwrap();
        let bpftrace_frames = block.lines().filter(|l| l.starts_with("    ")).count();
        assert_eq!(
            s["stack"].as_array().unwrap().len(),
            bpftrace_frames,
            "{s}\nvs bpftrace:\n{block}"
        );
    }
}

/// `trace --stack`: each event's line, then its stack a frame a line, innermost first,
/// the C++ function demangled with its namespace, template argument and parameter
/// types; in JSON a `stack` array.
#[privileged_test]
fn prints_each_hits_demangled_stack() {
    require_privileged();
    let bin = cpp_target();
    let probe = format!("usdt:{}:hitstacks:record", bin.display());
    let stdout = TracerRun::trace()
        .arg("--stack")
        .arg(&probe)
        .command(&bin, ["3"])
        .run()
        .stdout;
    let events: Vec<&str> = stdout
        .split('\n')
        .filter(|l| l.contains("hitstacks:record"))
        .collect();
    assert_eq!(events.len(), 3, "{stdout}");
    let module = bin.file_name().unwrap().to_str().unwrap();
    let first = stdout.find("hitstacks:record 0\n").expect("arg 0");
    let frames: Vec<&str> = stdout[first..]
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(
        frames[0].starts_with("        demo::Recorder<int>::record(int)+")
            && frames[0].ends_with(&format!("({module})")),
        "{frames:?}"
    );
    assert!(frames[1].trim().starts_with("main+"), "{frames:?}");
    assert!(
        !frames.iter().any(|f| f.contains('[') && !f.contains('<')),
        "no problems: {frames:?}"
    );

    let run = TracerRun::trace()
        .arg("--stack")
        .json()
        .arg(&probe)
        .command(&bin, ["2"])
        .run();
    let events = hit_events(&run);
    assert_eq!(events.len(), 2, "{}", run.stdout);
    for event in &events {
        let stack = event["stack"].as_array().unwrap();
        assert_eq!(
            stack[0]["function"], "demo::Recorder<int>::record(int)",
            "{event}"
        );
        assert_eq!(stack[0]["module"], module, "{event}");
        assert_eq!(stack[0]["kernel"], false, "{event}");
        assert_eq!(stack[1]["function"], "main", "{event}");
        assert_eq!(event["stack_problems"], serde_json::json!([]), "{event}");
    }
}

/// Without frame pointers the kernel's walk stops early: the stack shows the frames it
/// has and says it is incomplete, never a short stack passed off as whole.
#[privileged_test]
fn says_when_a_stack_is_incomplete() {
    require_privileged();
    let bin = compile_target(
        "gcc",
        "src/hitstacks/hitstacks.c",
        "hitstacks-nofp",
        &["-fomit-frame-pointer"],
    );
    let probe = format!("usdt:{}:hitstacks:hit", bin.display());
    let run = TracerRun::trace()
        .arg("--stack")
        .json()
        .arg(&probe)
        .command(&bin, ["2", "2"])
        .run();
    let stdout = &run.stdout;
    let events = hit_events(&run);
    assert_eq!(events.len(), 4, "{stdout}");
    for event in &events {
        let stack = event["stack"].as_array().unwrap();
        let names: Vec<&str> = stack
            .iter()
            .map(|f| f["function"].as_str().unwrap())
            .collect();
        let problems = event["stack_problems"].as_array().unwrap();
        // What the walk found first is still shown.
        assert!(names[0].starts_with("path_"), "{event}");
        let whole = in_order(
            &names
                .iter()
                .rev()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>(),
            &["main", "run_a"],
        ) || in_order(
            &names
                .iter()
                .rev()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>(),
            &["main", "run_b"],
        );
        assert!(
            whole
                || problems
                    .iter()
                    .any(|p| p.as_str().unwrap().contains("incomplete")),
            "a stack without its callers must say so: {event}"
        );
    }
}

/// `--unwind dwarf` on the target built without frame pointers: each hit's stack is
/// unwound from a copy of its stack with the binary's call frame information, so the
/// counts come under whole stacks (main, run_X, path_X), which frame pointers could not
/// walk, and the per-event stacks reach the thread's start.
#[privileged_test]
fn dwarf_unwinding_gives_whole_stacks_without_frame_pointers() {
    require_privileged();
    let bin = compile_target(
        "gcc",
        "src/hitstacks/hitstacks.c",
        "hitstacks-dwarf",
        &["-fomit-frame-pointer"],
    );
    let out = out_dir("hit-stacks-dwarf");
    let probe = format!("usdt:{}:hitstacks:hit", bin.display());
    let stdout = TracerRun::trace()
        .args(["--count", "--stack", "--unwind", "dwarf"])
        .out(&out)
        .arg(&probe)
        .command(&bin, ["30", "70"])
        .run()
        .stdout;
    let folded = std::fs::read_to_string(out.join("hits.folded")).unwrap();
    let lines = folded_lines(&folded);
    assert_eq!(lines.len(), 2, "{folded}");
    for (path, run, n) in [("path_a", "run_a", 30), ("path_b", "run_b", 70)] {
        let (frames, count) = lines
            .iter()
            .find(|(frames, _)| frames.last().map(String::as_str) == Some(path))
            .unwrap_or_else(|| panic!("no stack ending in {path}:\n{folded}"));
        assert_eq!(*count, n, "{folded}");
        assert!(
            in_order(frames, &[&probe, "_start", "main", run, path]),
            "{frames:?}"
        );
        assert!(!frames.iter().any(|f| f.starts_with('[')), "{frames:?}");
    }
    assert!(stdout.contains("]: 100\n"), "{stdout}");

    let run = TracerRun::trace()
        .args(["--stack", "--unwind", "dwarf"])
        .json()
        .arg(&probe)
        .command(&bin, ["1", "1"])
        .run();
    let events = hit_events(&run);
    assert_eq!(events.len(), 2, "{}", run.stdout);
    for event in &events {
        let names: Vec<&str> = event["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap())
            .collect();
        assert!(names[0].starts_with("path_"), "{event}");
        assert!(names[1].starts_with("run_"), "{event}");
        assert_eq!(names[2], "main", "{event}");
        assert_eq!(names.last(), Some(&"_start"), "{event}");
        assert_eq!(event["stack_problems"], serde_json::json!([]), "{event}");
    }
}

/// A Rust runtime's GC probe: `gc-demo` starts each collection (`tracer:gc__begin`) in
/// `gc_demo::run_collections`, called from `gc_demo::main` inside a thread scope: every
/// hit is counted under that stack, Rust names demangled (paths, generics).
#[privileged_test]
fn counts_a_rust_runtimes_gc_starts_by_stack() {
    require_privileged();
    let out = out_dir("hit-stacks-gc");
    let probe = format!("usdt:{GC_DEMO}:tracer:gc__begin");
    TracerRun::trace()
        .args(["--count", "--stack"])
        .out(&out)
        .arg(&probe)
        .command(
            GC_DEMO,
            ["--gcs", "5", "--pause-ms", "2", "--interval-ms", "2"],
        )
        .run();
    let folded = std::fs::read_to_string(out.join("hits.folded")).unwrap();
    let lines = folded_lines(&folded);
    assert_eq!(lines.values().sum::<u64>(), 5, "{folded}");
    for frames in lines.keys() {
        assert!(
            in_order(
                frames,
                &[&probe, "main", "gc_demo::main", "gc_demo::run_collections"]
            ),
            "{frames:?}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.starts_with("std::thread::scoped::scope::<")),
            "generic Rust functions demangled: {frames:?}"
        );
    }
}

/// The hit events (JSON lines with a `probe`) that `trace --stack --format json` printed.
fn hit_events(run: &Finished) -> Vec<serde_json::Value> {
    run.stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("probe").is_some())
        .collect()
}
