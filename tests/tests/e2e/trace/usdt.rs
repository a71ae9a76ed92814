//! `tracer trace` and `tracer list` on real USDT probes: every argument form value by
//! value, several sites, several PIDs, semaphores by PID and by path, bpftrace agreeing on the same
//! process, CPython's probes, a target in another mount namespace, and bad input.

use std::{collections::HashMap, process::Command, time::Duration};

use crate::common::*;

/// What `usdt-args` documents for each probe (values as i64), site by site for `multi`.
fn expected_args() -> Vec<(&'static str, Vec<i64>)> {
    vec![
        ("noargs", vec![]),
        ("consts", vec![-5, 42, 255]),
        (
            "regs",
            vec![0xdeadbeefcafef00du64 as i64, -7, 48879, -2, 1, -1],
        ),
        (
            "mem",
            vec![-1234567890123, 0x0123456789abcdef, 4294967294, -32767, -128],
        ),
        ("indexed", vec![-123456, 0x0102030405060708, -3003, 246]),
        ("twelve", (1..=12).collect()),
        (
            "signs",
            vec![
                135,
                -121,
                34439,
                -31097,
                2223343239,
                -2071624057,
                -9186918263483431289,
                -9186918263483431289,
            ],
        ),
        ("subregs", (1..=12).collect()),
        ("fullregs", vec![-1001, -1002, -1003, -1004, -1005, -1006]),
        ("multi", vec![1, 101]),
        ("multi", vec![2, 102]),
        ("multi", vec![3, 103]),
        ("guarded", vec![7777, -1]),
    ]
}

/// Events of `tracer trace --format json` as (probe name, args as i64).
fn parse_events(stdout: &str) -> Vec<(String, Vec<i64>, u32)> {
    parse_trace_json(stdout)
        .events
        .iter()
        .map(|e| (e.name().to_owned(), e.int_args(), e.pid))
        .collect()
}

#[privileged_test]
fn every_argument_form_decodes_from_the_first_instruction() {
    require_privileged();
    let out = run_tracer(&[
        "trace",
        "--format",
        "json",
        &format!("usdt:{USDT_ARGS}:tracer_test:*"),
        "--",
        USDT_ARGS,
        "--loops",
        "2",
    ]);
    let stdout = out.stdout.as_str();
    let stderr = out.stderr.as_str();
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("none lost"), "{stderr}");
    let events = parse_events(stdout);
    let expected = expected_args();
    assert_eq!(events.len(), 2 * expected.len(), "{stdout}");
    // Each round fires the probes in the documented order.
    for (i, (name, args, _)) in events.iter().enumerate() {
        let (want_name, want_args) = &expected[i % expected.len()];
        assert_eq!((name.as_str(), args), (*want_name, want_args), "event {i}");
    }
}

#[privileged_test]
fn semaphores_fire_while_attached_by_pid_and_are_restored_even_after_sigkill() {
    require_privileged();
    for kill in [false, true] {
        // 30 rounds, 100 ms apart: the tracer leaves (stops or is killed) mid-run.
        let target = Target::start(USDT_ARGS, &["--loops", "30", "--interval-ms", "100"]);
        let pid = target.pid.to_string();
        let args = [
            "trace",
            "--format",
            "json",
            "--pid",
            &pid,
            "usdt:*:tracer_test:guarded",
            "--duration",
            "1s",
        ];
        let tracer = Tracer::start(&args);
        target.release();
        let stdout = if kill {
            std::thread::sleep(Duration::from_millis(700));
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(tracer.pid() as i32, libc::SIGKILL) };
            String::new()
        } else {
            let (ok, out, err) = tracer.finish();
            assert!(ok, "{err}");
            out
        };
        let truth = target.finish();
        assert_eq!(
            truth["guarded_semaphore_at_start"], 1,
            "attached: the kernel counted the semaphore up"
        );
        assert_eq!(
            truth["guarded_semaphore"], 0,
            "after the tracer left (killed: {kill}) the semaphore is back to 0"
        );
        let fired = truth["fired"]["guarded"].as_u64().unwrap();
        assert!(
            fired > 0 && fired < 30,
            "fired only while attached: {fired}"
        );
        if !kill {
            let events = parse_events(&stdout);
            // Every firing while the program was attached is traced. On detach the kernel
            // drops the BPF link first and unregisters the uprobe (which is what lowers the
            // semaphore) only after RCU synchronisation: under load a few hundred ms, i.e.
            // a few 100 ms rounds in which the target still fires, untraced.
            let traced = events.len() as u64;
            assert!(
                traced <= fired && fired - traced <= 4,
                "traced {traced}, fired {fired}"
            );
            assert!(
                events
                    .iter()
                    .all(|(n, a, _)| n == "guarded" && a == &[7777, -1])
            );
        }
    }
}

#[privileged_test]
fn a_process_started_after_the_tracer_is_traced_by_path() {
    require_privileged();
    // A copy of its own: a tracer by path raises the semaphores of every process that runs
    // the file, other tests' targets included.
    let program = executable_copy(USDT_ARGS, &out_dir("by-path"));
    let program = program.to_str().unwrap();
    let spec = format!("usdt:{program}:tracer_test:guarded");
    let tracer = TracerRun::trace().json().arg(&spec).duration("3s").start();
    let target = Target::start(program, &["--loops", "3"]);
    let pid = target.pid;
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    assert_eq!(truth["guarded_semaphore_at_start"], 1, "{truth}");
    assert_eq!(truth["fired"]["guarded"], 3);
    let events = parse_events(&out);
    assert_eq!(
        events
            .iter()
            .filter(|(n, _, p)| n == "guarded" && *p == pid)
            .count(),
        3,
        "{out}"
    );
}

#[privileged_test]
fn bpftrace_and_tracer_agree_on_the_same_process() {
    require_privileged();
    let target = Target::start(USDT_ARGS, &["--loops", "3"]);
    let pid = target.pid.to_string();
    let tracer = TracerRun::trace()
        .json()
        .pid(target.pid)
        .args(["usdt:*:tracer_test:regs", "usdt:*:tracer_test:mem"])
        .start();
    // bpftrace reads at most six arguments on x86-64; these probes have six and five.
    // BEGIN runs once every probe is attached, so its line says bpftrace is ready.
    let script = format!(
        "BEGIN {{ printf(\"ready\\n\"); }}
         usdt:{USDT_ARGS}:tracer_test:regs {{ printf(\"regs %ld %ld %ld %ld %ld %ld\\n\", arg0, arg1, arg2, arg3, arg4, arg5); }}
         usdt:{USDT_ARGS}:tracer_test:mem {{ printf(\"mem %ld %ld %ld %ld %ld\\n\", arg0, arg1, arg2, arg3, arg4); }}"
    );
    let mut bpftrace = Command::new("bpftrace")
        .args(["-p", &pid, "-e", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bpftrace is installed by `cargo xtask setup`");
    let mut bt_out = std::io::BufReader::new(bpftrace.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut bt_out, &mut line).unwrap() > 0,
            "bpftrace exited"
        );
    }
    target.release();
    let _truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut bt_out, &mut rest).unwrap();
    let _ = bpftrace.wait();
    let theirs: Vec<Vec<i64>> = rest
        .lines()
        .filter(|l| l.starts_with("regs ") || l.starts_with("mem "))
        .map(|l| l.split(' ').skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    let ours: Vec<Vec<i64>> = parse_events(&out).into_iter().map(|(_, a, _)| a).collect();
    assert_eq!(ours.len(), 6, "{out}");
    assert_eq!(
        ours, theirs,
        "two tracers on one process see the same events and values"
    );
}

#[privileged_test]
fn cpython_gc_probes_are_counted_exactly() {
    require_privileged();
    let python = "/usr/bin/python3.11";
    // Automatic collections off and no interpreter shutdown, so exactly N collections run.
    let script = "import gc, os, signal, sys\n\
        gc.disable()\n\
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n\
        print(f'ready pid={os.getpid()}', flush=True)\n\
        signal.sigwait({signal.SIGUSR1})\n\
        for _ in range(7): gc.collect()\n\
        print('{\"collections\": 7}', flush=True)\n\
        os._exit(0)\n";
    let target = Target::start(python, &["-c", script]);
    let tracer = TracerRun::trace()
        .json()
        .pid(target.pid)
        .args(["usdt:*:python:gc__start", "usdt:*:python:gc__done"])
        .start();
    target.release();
    target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let events = parse_events(&out);
    let count = |name: &str| events.iter().filter(|(n, _, _)| n == name).count();
    assert_eq!((count("gc__start"), count("gc__done")), (7, 7), "{out}");
    assert!(
        events
            .iter()
            .filter(|(n, _, _)| n == "gc__start")
            .all(|(_, a, _)| a == &[2]),
        "gc.collect() collects generation 2"
    );
}

#[privileged_test]
fn a_target_in_another_mount_namespace_is_found_through_proc_root() {
    require_privileged();
    // The binary exists only inside the target's private mount namespace.
    let dir = out_dir("mntns");
    let inner = "/mnt/tracer-private";
    let script = format!(
        "mkdir -p {inner} && mount -t tmpfs none {inner} && cp {USDT_ARGS} {inner}/usdt-args && exec {inner}/usdt-args --wait-for-signal --loops 2"
    );
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare (util-linux)");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let pid: u32 = line
        .trim()
        .strip_prefix("ready pid=")
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    assert!(
        !std::path::Path::new(&format!("{inner}/usdt-args")).exists(),
        "not visible from the host"
    );
    let list = run_tracer(&["list", "--pid", &pid.to_string(), "tracer_test:consts"]);
    assert_eq!(
        list.stdout.as_str().trim(),
        format!("usdt:{inner}/usdt-args:tracer_test:consts")
    );
    let tracer = TracerRun::trace()
        .json()
        .pid(pid)
        .args(["usdt:*:tracer_test:consts"])
        .start();
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let _ = child.wait();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let events = parse_events(&out);
    assert_eq!(events.len(), 2, "{out}");
    assert!(events.iter().all(|(_, a, _)| a == &[-5, 42, 255]));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn list_shows_probes_sites_and_specs() {
    let out = run_tracer(&["list", USDT_ARGS]);
    assert!(out.status.success());
    let text = out.stdout.as_str();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.rsplit(':').next().unwrap())
        .collect();
    for probe in [
        "noargs", "consts", "regs", "mem", "indexed", "twelve", "signs", "multi", "guarded",
    ] {
        assert!(names.contains(&probe), "{probe} missing from {text}");
    }
    let verbose = run_tracer(&["list", "-v", &format!("usdt:{USDT_ARGS}:tracer_test:multi")]);
    let text = verbose.stdout.as_str();
    assert_eq!(text.matches("  site ").count(), 3, "{text}");
    let guarded = run_tracer(&[
        "list",
        "-v",
        &format!("usdt:{USDT_ARGS}:tracer_test:guard*"),
    ]);
    assert!(guarded.stdout.as_str().contains("semaphore 0x"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let cases: HashMap<&str, Vec<String>> = HashMap::from([
        (
            "not an ELF file: /etc/passwd",
            vec!["list".into(), "/etc/passwd".into()],
        ),
        (
            "no probes match",
            vec!["list".into(), format!("usdt:{USDT_ARGS}:tracer_test:nope")],
        ),
        (
            "No such file",
            vec!["list".into(), "/no/such/binary".into()],
        ),
        ("expected usdt:PATH", vec!["list".into(), "usdt:".into()]),
        (
            "no USDT probes in /usr/bin/true: its build has no SystemTap SDT notes",
            vec!["list".into(), "/usr/bin/true".into()],
        ),
    ]);
    for (message, args) in cases {
        let out = run_tracer(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = out.stderr.as_str();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[privileged_test]
fn bad_trace_targets_get_a_clear_error() {
    require_privileged();
    let out = run_tracer(&["trace", "--pid", "4194304", "usdt:*:p:n"]);
    assert!(out.stderr.as_str().contains("no such process: 4194304"));
    let out = run_tracer(&[
        "trace",
        &format!("usdt:{USDT_ARGS}:tracer_test:nope"),
        "--",
        USDT_ARGS,
    ]);
    assert!(!out.status.success());
    assert!(out.stderr.as_str().contains("no probes match"));
}

#[privileged_test]
fn count_mode_counts_every_hit_in_the_kernel() {
    require_privileged();
    let out = run_tracer(&[
        "trace",
        "--count",
        "--format",
        "json",
        &format!("usdt:{USDT_ARGS}:tracer_test:*"),
        "--",
        USDT_ARGS,
        "--loops",
        "250",
    ]);
    assert!(out.status.success(), "{}", out.stderr.as_str());
    let stdout = out.stdout.as_str();
    let counts: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v.as_object()
                .is_some_and(|o| o.keys().any(|k| k.starts_with("usdt:")))
        })
        .unwrap_or_else(|| panic!("{stdout}"));
    let count = |name: &str| {
        counts[format!("usdt:{USDT_ARGS}:tracer_test:{name}")]
            .as_u64()
            .unwrap()
    };
    assert_eq!(count("regs"), 250);
    assert_eq!(count("noargs"), 250);
    assert_eq!(count("multi"), 750, "three sites, one probe");
    assert_eq!(count("guarded"), 250);
}

#[privileged_test]
fn several_pids_count_each_of_theirs_and_no_other() {
    require_privileged();
    let targets: Vec<Target> = (0..3)
        .map(|_| Target::start(USDT_ARGS, &["--loops", "200"]))
        .collect();
    let [first, second] = [targets[0].pid.to_string(), targets[1].pid.to_string()];
    let probe = "usdt:*:tracer_test:noargs";
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .args(["--pid", &first, "--pid", &second, probe])
        .duration("60s")
        .start();
    for target in &targets {
        target.release();
    }
    let fired: Vec<u64> = targets
        .into_iter()
        .map(|target| target.finish()["fired"]["noargs"].as_u64().unwrap())
        .collect();
    assert_eq!(fired, [200, 200, 200]);
    let (ok, stdout, stderr) = tracer.finish();
    assert!(ok, "{stderr}");
    // The third process runs the same sites, attached for the two alone: none of its
    // hits count.
    assert_eq!(
        trace_counts(&stdout).get("tracer_test:noargs"),
        Some(&400),
        "{stdout}"
    );
}
