//! `tracer trace` on the argument forms compilers emit beyond registers and stack slots:
//! globals read `%rip`-relative (`-1@4+t1(%rip)`), floats, 16-byte values, sizeless
//! operands, and an SSE register that a uprobe cannot read. `usdt-forms.c` is built at
//! -O0 and -O2, PIE and not; each probe's values must be the program's own, and
//! bpftrace's where bpftrace can decode the probe.

use std::path::PathBuf;

use crate::common::*;
use serde_json::Value;

/// `usdt-forms` built with `opt` and `pie` (`-pie` or `-no-pie`), once per test run:
/// tests run in parallel, and one rebuilding the file while another's bpftrace reads it
/// made bpftrace fail to parse its notes.
fn build(opt: &str, pie: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let name = format!("usdt-forms{opt}{pie}");
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, bin)) = built.iter().find(|(n, _)| *n == name) {
        return bin.clone();
    }
    let flags = [opt, pie, if pie == "-pie" { "-fPIE" } else { "-fno-PIE" }];
    let bin = compile_target("gcc", "src/usdt-forms/usdt-forms.c", &name, &flags);
    built.push((name, bin.clone()));
    bin
}

const VARIANTS: [(&str, &str); 4] = [
    ("-O0", "-pie"),
    ("-O0", "-no-pie"),
    ("-O2", "-pie"),
    ("-O2", "-no-pie"),
];

/// Runs `tracer trace --format json` on every probe of `bin` for a run of it with
/// `--loops 2`: the events as (probe name, args), the program's truth line and stderr.
fn trace(bin: &str) -> (Vec<(String, Vec<Value>)>, Value, String) {
    let run = trace_json(&[&format!("usdt:{bin}:tt:*"), "--", bin, "--loops", "2"]);
    let truth = run
        .printed
        .other_json
        .first()
        .unwrap_or_else(|| panic!("no truth line: {:?}", run.printed))
        .clone();
    let events = run
        .printed
        .events
        .iter()
        .map(|e| (e.name().to_owned(), e.args.clone()))
        .collect();
    (events, truth, run.stderr)
}

/// What bpftrace prints for `probe` of `bin` (run with `-c`), `arity` arguments as
/// `%ld`, one line per hit.
fn bpftrace_values(bin: &str, probe: &str, arity: usize) -> Vec<Vec<i64>> {
    let format = vec!["%ld"; arity].join(" ");
    let args: Vec<String> = (0..arity).map(|i| format!("arg{i}")).collect();
    let script = format!(
        "BEGIN {{ printf(\"Tracing\\n\"); }}
         usdt:{bin}:tt:{probe} {{ printf(\"hit {format}\\n\", {}); }}",
        args.join(", ")
    );
    let maps = Bpftrace::start(&["-e", &script, "-c", &format!("{bin} --loops 2")]).finish();
    maps.text
        .lines()
        .filter_map(|l| l.strip_prefix("hit "))
        .map(|l| l.split(' ').map(|v| v.parse().unwrap()).collect())
        .collect()
}

fn as_i64(values: &[Value]) -> Vec<i64> {
    values
        .iter()
        .map(|v| v.as_i64().unwrap_or_else(|| v.as_u64().unwrap() as i64))
        .collect()
}

#[privileged_test]
fn every_form_decodes_as_the_program_passes_it_at_o0_and_o2_pie_or_not() {
    require_privileged();
    for (opt, pie) in VARIANTS {
        let bin = build(opt, pie);
        let bin = bin.to_str().unwrap();
        let (events, truth, stderr) = trace(bin);
        let probes = [
            "globals",
            "floats",
            "float_globals",
            "wide",
            "sizeless",
            "handwritten",
        ];
        assert_eq!(events.len(), 2 * probes.len(), "{opt} {pie}: {events:?}");
        for (name, args) in &events {
            assert_eq!(
                Value::Array(args.clone()),
                truth[name.as_str()],
                "{opt} {pie}: tt:{name}"
            );
        }
        // The one argument no uprobe can read: one warning that names it, whatever the
        // number of hits, and nothing else refused.
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("unavailable"))
            .collect();
        assert_eq!(warnings.len(), 1, "{opt} {pie}: {stderr}");
        assert!(
            warnings[0].contains(":tt:handwritten: arg3 \"8f@%xmm0\": floating-point register %xmm0 is not readable at a uprobe"),
            "{stderr}"
        );
    }
}

#[privileged_test]
fn bpftrace_agrees_on_the_forms_it_decodes() {
    require_privileged();
    // bpftrace 0.17 decodes register and stack operands and sizeless ones; it refuses
    // `sym(%rip)` ("deref ident is not handled yet" with -p; by path it reads other
    // memory), floats (a parse error), 16-byte values (an assertion) and so every probe
    // here that has one of them. What it can do, it must do as we do.
    for (opt, pie) in VARIANTS {
        let bin = build(opt, pie);
        let bin = bin.to_str().unwrap();
        let (events, _, _) = trace(bin);
        let ours = |probe: &str| -> Vec<Vec<i64>> {
            events
                .iter()
                .filter(|(n, _)| n == probe)
                .map(|(_, a)| as_i64(a))
                .collect()
        };
        let sizeless = bpftrace_values(bin, "sizeless", 2);
        assert_eq!(sizeless.len(), 2, "{opt} {pie}");
        assert_eq!(ours("sizeless"), sizeless, "{opt} {pie}: tt:sizeless");
        if opt == "-O0" {
            // Registers at -O0 (`-1@%al -8@%rdx 4@%ecx -2@%si`); `sym(%rip)` at -O2.
            let globals = bpftrace_values(bin, "globals", 4);
            assert_eq!(globals.len(), 2, "{opt} {pie}");
            assert_eq!(ours("globals"), globals, "{opt} {pie}: tt:globals");
        }
    }
}

#[privileged_test]
fn without_a_symbol_table_only_the_globals_are_unavailable() {
    require_privileged();
    let built = build("-O2", "-pie");
    let dir = out_dir("usdt-forms-stripped");
    let bin = dir.join("usdt-forms-stripped");
    std::fs::copy(&built, &bin).unwrap();
    let status = std::process::Command::new("strip")
        .arg(&bin)
        .status()
        .expect("strip (binutils)");
    assert!(status.success());
    let bin = bin.to_str().unwrap();
    let (events, truth, stderr) = trace(bin);
    let globals: Vec<&Vec<Value>> = events
        .iter()
        .filter(|(n, _)| n == "globals")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(globals.len(), 2, "the probe still fires: {events:?}");
    assert!(
        globals.iter().all(|a| a == &&vec![Value::Null; 4]),
        "{globals:?}"
    );
    for (name, args) in events
        .iter()
        .filter(|(n, _)| n == "sizeless" || n == "wide")
    {
        assert_eq!(&Value::Array(args.clone()), &truth[name.as_str()], "{name}");
    }
    assert!(
        stderr.contains(
            ":tt:globals: arg0 \"-1@4+t1(%rip)\": no symbol t1 in the object's symbol tables (stripped?)"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn text_output_shows_an_unavailable_argument_as_a_question_mark() {
    require_privileged();
    let bin = build("-O2", "-no-pie");
    let bin = bin.to_str().unwrap();
    let out = run_tracer(&["trace", &format!("usdt:{bin}:tt:handwritten"), "--", bin]);
    assert!(out.status.success(), "{}", out.stderr.as_str());
    let stdout = out.stdout.as_str();
    let line = stdout
        .lines()
        .find(|l| l.contains(":tt:handwritten "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.ends_with(":tt:handwritten 16 -17 18369614221190020847 ? -300"),
        "{line}"
    );
}

#[test]
fn list_shows_globals_from_the_probe_and_why_an_argument_is_unavailable() {
    let bin = build("-O2", "-pie");
    let out = run_tracer(&[
        "list",
        "-v",
        &format!("usdt:{}:tt:handwritten", bin.display()),
    ]);
    let text = out.stdout.as_str();
    assert!(out.status.success(), "{text}");
    assert!(text.contains(": s8 *(pc+0x"), "{text}");
    assert!(
        text.contains(
            "u64 %rdi, unavailable (\"8f@%xmm0\": floating-point register %xmm0 is not readable"
        ),
        "{text}"
    );
}

/// `--bpf-debug` shows the kernel's own diagnostics: a failed argument read names the
/// probe and the error (EFAULT), once per failing hit; without it, nothing of the kind.
#[privileged_test]
fn bpf_debug_names_the_probe_whose_argument_read_failed() {
    require_privileged();
    let bin = compile_target("gcc", "src/diagnostics/bad-pointer.c", "bad-pointer", &[]);
    let bin = bin.to_str().unwrap();
    let probes = format!("usdt:{bin}:diag:*");
    let run = |debug: bool| {
        let mut args = vec!["trace"];
        if debug {
            args.push("--bpf-debug");
        }
        args.extend([probes.as_str(), "--", bin, "20"]);
        let out = run_tracer(&args);
        let err = out.stderr.clone();
        assert!(out.status.success(), "{err}");
        let hits = out
            .stdout
            .as_str()
            .lines()
            .filter(|l| l.contains(":diag:"))
            .count();
        assert_eq!(hits, 40, "every hit of both probes is printed: {err}");
        err
    };
    let quiet = run(false);
    assert!(!quiet.contains("tracer: bpf:"), "{quiet}");
    let debug = run(true);
    let failed: Vec<&str> = debug
        .lines()
        .filter(|l| l.starts_with("tracer: bpf: "))
        .collect();
    assert_eq!(failed.len(), 20, "one record per failing hit: {debug}");
    for line in failed {
        assert!(
            line.contains(&format!("usdt:{bin}:diag:bad"))
                && line.contains("reading an argument failed: error -14"),
            "{line}"
        );
    }
}
