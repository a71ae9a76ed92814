//! `tracer trace --str`: string arguments read at the hit, on a C target whose strings
//! are known (short, exactly the limit, longer, not UTF-8, empty, NULL, unmapped, two in
//! one event), in text and JSON; and the bad requests that must fail.

use std::path::PathBuf;

use crate::common::*;

/// The target, compiled as `name`: one per test, as tests run at once.
fn target(name: &str) -> PathBuf {
    compile_target("gcc", "src/strings/usdt-strings.c", name, &[])
}

/// `tracer trace ARGS usdt:TARGET:strs:* -- TARGET`: (success, stdout, stderr).
fn trace(bin: &str, args: &[&str]) -> (bool, String, String) {
    let probes = format!("usdt:{bin}:strs:*");
    let mut all = vec!["trace"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[&probes, "--", bin]);
    let out = run_tracer(&all);
    (out.status.success(), out.stdout.clone(), out.stderr.clone())
}

const STRINGS: &[&str] = &[
    "--str",
    "text:arg0:8",
    "--str",
    "wide:arg0",
    "--str",
    "strs:pair:arg0:4",
    "--str",
    "pair:arg1",
];

#[privileged_test]
fn strings_show_as_sent_cut_at_their_limit_and_unavailable_when_unreadable() {
    require_privileged();
    let bin = target("usdt-strings-text");
    let bin = bin.to_str().unwrap();
    let (ok, stdout, stderr) = trace(bin, STRINGS);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("none lost"), "{stderr}");
    // What follows the probe name on each line.
    let shown: Vec<String> = stdout
        .lines()
        .skip(1)
        .map(|line| {
            let (_, rest) = line
                .split_once(":strs:")
                .unwrap_or_else(|| panic!("{line}"));
            rest.to_string()
        })
        .collect();
    let a64 = "a".repeat(64);
    let b64 = "b".repeat(64);
    let expected = [
        r#"text "hi" 0"#.to_string(),
        r#"text "12345678" 1"#.into(),
        r#"text "12345678"... 2"#.into(),
        r#"text "\xff\xfe ok" 3"#.into(),
        r#"text "" 4"#.into(),
        "text ? 5".into(),
        "text ? 6".into(),
        r#"text "tab\x09here"... 7"#.into(),
        format!(r#"wide "{a64}""#),
        format!(r#"wide "{b64}"..."#),
        r#"pair "left" "right side""#.into(),
        // Not asked for as a string: its value.
        "number 42".into(),
    ];
    assert_eq!(shown, expected, "{stdout}");
}

#[privileged_test]
fn strings_in_json_keep_the_pointer_and_say_what_was_read() {
    require_privileged();
    let bin = target("usdt-strings-json");
    let bin = bin.to_str().unwrap();
    let mut args = vec!["--format", "json"];
    args.extend_from_slice(STRINGS);
    let (ok, stdout, stderr) = trace(bin, &args);
    assert!(ok, "{stderr}");
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), 12, "{stdout}");
    let text = |i: usize| &events[i]["strings"]["arg0"];
    let shown = |s: &str, truncated: bool| serde_json::json!({"text": s, "truncated": truncated, "hex": null});
    assert_eq!(*text(0), shown("hi", false));
    assert_eq!(*text(1), shown("12345678", false));
    assert_eq!(*text(2), shown("12345678", true));
    assert_eq!(
        *text(3),
        serde_json::json!({"text": "\u{fffd}\u{fffd} ok", "truncated": false, "hex": "fffe206f6b"})
    );
    assert_eq!(*text(4), shown("", false), "empty is not unavailable");
    assert!(text(5).is_null() && text(6).is_null(), "{stdout}");
    // The pointer itself is still in args: NULL and 1.
    assert_eq!(events[5]["args"], serde_json::json!([0, 5]));
    assert_eq!(events[6]["args"], serde_json::json!([1, 6]));
    assert_eq!(*text(7), shown("tab\there", true));
    assert_eq!(*text(9), shown(&"b".repeat(64), true));
    assert_eq!(
        events[10]["strings"],
        serde_json::json!({"arg0": shown("left", false), "arg1": shown("right side", false)})
    );
    assert!(events[11].get("strings").is_none(), "{}", events[11]);
}

#[privileged_test]
fn a_request_that_names_nothing_or_a_missing_or_integer_argument_fails() {
    require_privileged();
    let bin = target("usdt-strings-errors");
    let bin = bin.to_str().unwrap();
    for (args, says) in [
        (
            &["--str", "nosuch:arg0"][..],
            "--str nosuch:arg0: no probe traced is named so",
        ),
        (
            &["--str", "other:text:arg0"][..],
            "--str other:text:arg0: no probe traced",
        ),
        (&["--str", "text:arg2"][..], "text has 2 arguments, no arg2"),
        // Every probe traced: `wide` has one argument.
        (&["--str", "arg1"][..], "wide has 1 argument, no arg1"),
        (&["--str", "number:arg0"][..], "arg0 of usdt:"),
        (
            &["--str", "text:arg0:0"][..],
            "the length must be 1 to 4096 bytes",
        ),
        (
            &["--str", "text:arg0:4097"][..],
            "the length must be 1 to 4096 bytes",
        ),
        (&["--str", "text:arg12"][..], "at most 12 arguments"),
        (
            &["--str", "text:0"][..],
            "expected [[PROVIDER:]NAME:]argN[:LEN]",
        ),
        (
            &["--count", "--str", "text:arg0"][..],
            "--count prints only counts",
        ),
    ] {
        let (ok, stdout, stderr) = trace(bin, args);
        assert!(!ok, "{args:?} succeeded: {stdout}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("Attached"),
            "{args:?} failed before attaching: {stderr}"
        );
    }
    let (_, _, stderr) = trace(bin, &["--str", "number:arg0"]);
    assert!(
        stderr.contains("is a 4-byte integer, not a pointer"),
        "{stderr}"
    );
}

/// Threads hitting a string probe at once on every CPU: each event carries its own hit's
/// string, never another's; an event dropped (the ring buffer full, or a hit while a
/// preempted one held its CPU's buffer) is counted as lost, never shown wrong.
#[privileged_test]
fn concurrent_hits_each_carry_their_own_string() {
    require_privileged();
    const HITS: u64 = 4 * 5000;
    let bin = compile_target(
        "gcc",
        "src/strings/string-storm.c",
        "string-storm",
        &["-pthread"],
    );
    let bin = bin.to_str().unwrap();
    let probe = format!("usdt:{bin}:strs:storm");
    let out = run_tracer(&[
        "trace",
        "--format",
        "json",
        "--ring-buffer",
        "64M",
        "--str",
        "storm:arg0",
        &probe,
        "--",
        bin,
    ]);
    let stdout = out.stdout.as_str();
    let stderr = out.stderr.as_str();
    let mut shown = 0;
    for line in stdout.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let (thread, round) = (&event["args"][1], &event["args"][2]);
        assert_eq!(
            event["strings"]["arg0"]["text"],
            format!("thread {thread} round {round}"),
            "{event}"
        );
        shown += 1;
    }
    // "N events, none lost" or "N events, M LOST (...)".
    let lost = match stderr.split_once(" LOST") {
        None => {
            assert!(
                out.status.success() && stderr.contains("none lost"),
                "{stderr}"
            );
            0
        }
        Some((before, _)) => before.rsplit(' ').next().unwrap().parse::<u64>().unwrap(),
    };
    assert_eq!(shown + lost, HITS, "{stderr}");
}
