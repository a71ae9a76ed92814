//! `tracer profile` against `wallclock-demo`, whose three threads spend the same wall time
//! spinning, sleeping and blocked on a lock.

use std::path::Path;

use crate::common::*;

const WALLCLOCK_DEMO: &str = env!("CARGO_BIN_EXE_wallclock-demo");

const SPIN: &str = "wallclock_demo::spin_on_cpu";
const SLEEP: &str = "wallclock_demo::sleep_off_cpu";
const WAIT: &str = "wallclock_demo::wait_on_lock";

/// Profiles one wallclock-demo run; returns (tracer's stdout, target's truth, output dir).
fn profile_demo(name: &str, extra: &[&str]) -> (String, serde_json::Value, std::path::PathBuf) {
    profile_target(WALLCLOCK_DEMO, &["--ms", "1500"], name, extra)
}

/// Profiles `program` from its start to its exit; returns (tracer's stdout, target's
/// truth, output dir).
fn profile_target(
    program: &str,
    target_args: &[&str],
    name: &str,
    extra: &[&str],
) -> (String, serde_json::Value, std::path::PathBuf) {
    let dir = out_dir(name);
    let target = Target::start(program, target_args);
    let pid = target.pid.to_string();
    let mut args = vec![
        "profile",
        "--pid",
        &pid,
        "--frequency",
        "499",
        "-o",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let tracer = Tracer::start(&args);
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    assert!(err.contains("target exited"), "{err}");
    (out, truth, dir)
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn folded_total(folded: &str) -> u64 {
    folded_weight_where(folded, |_| true)
}

#[privileged_test]
fn wall_clock_shares_match_the_three_threads() {
    require_privileged();
    let (out, truth, dir) = profile_demo("profile-shares", &[]);
    let wall = read(&dir, "wallclock.folded");
    let weights = [SPIN, SLEEP, WAIT].map(|f| folded_weight(&wall, f));
    let sum: u64 = weights.iter().sum();
    let truths = ["spin_on_cpu_ns", "sleep_off_cpu_ns", "wait_on_lock_ns"]
        .map(|field| truth[field].as_u64().unwrap() / 1000);
    eprintln!("measured us {weights:?} (sum {sum}), target's own us {truths:?}\n{out}");
    for (frame, weight) in [SPIN, SLEEP, WAIT].iter().zip(weights) {
        let share = weight as f64 / sum as f64;
        assert!(
            (share - 1.0 / 3.0).abs() <= 0.2 / 3.0,
            "{frame}: {weight} us of {sum} ({:.1}%)\n{wall}",
            share * 100.0
        );
    }
    for (frame, (weight, truth_us)) in [SPIN, SLEEP, WAIT].iter().zip(weights.iter().zip(truths)) {
        let error = (*weight as f64 - truth_us as f64).abs() / truth_us as f64;
        assert!(
            error <= 0.2,
            "{frame}: {weight} us, target says {truth_us} us"
        );
    }

    // The spinner's on-CPU samples add up to the CPU time it got (less than its wall
    // time on a busy machine: the rest is preemption, under [runnable]).
    let oncpu = read(&dir, "oncpu.folded");
    let spin_cpu_us = truth["spin_cpu_ns"].as_u64().unwrap() / 1000;
    let sampled_us = folded_weight(&oncpu, SPIN);
    eprintln!("spinner on CPU: sampled {sampled_us} us, thread CPU clock {spin_cpu_us} us");
    assert!(
        (sampled_us as f64 - spin_cpu_us as f64).abs() <= 0.2 * spin_cpu_us as f64,
        "spinner: sampled {sampled_us} us on CPU, its CPU clock says {spin_cpu_us} us\n{oncpu}"
    );
    // Blocked stacks go down into the kernel (to where it put the thread to sleep: the
    // scheduler's own functions are left out), and end in [off-cpu] in the wall-clock
    // view.
    let offcpu = read(&dir, "offcpu.folded");
    for frame in [SLEEP, WAIT] {
        assert!(
            offcpu.lines().any(|l| l.contains(frame)
                && l.contains(";do_syscall_64_[k]")
                && l.rsplit_once(' ').unwrap().0.ends_with("_[k]")),
            "{frame}\n{offcpu}"
        );
        assert!(
            wall.lines()
                .any(|l| l.contains(frame) && l.rsplit_once(' ').unwrap().0.ends_with(";[off-cpu]")),
            "{frame}\n{wall}"
        );
    }
    // On CPU, blocked, and runnable (preempted, waiting for a CPU) make up the whole.
    let ends_in = |leaf: &'static str| move |stack: &str| stack.ends_with(leaf);
    let runnable = folded_weight_where(&wall, ends_in(";[runnable]"));
    assert_eq!(
        folded_total(&oncpu) + folded_total(&offcpu) + runnable,
        folded_total(&wall)
    );
    // The spinner never blocks: its time off CPU is preemption, [runnable], not blocked.
    let spin_blocked = folded_weight_where(&wall, |stack| {
        stack.contains(SPIN) && stack.ends_with(";[off-cpu]")
    });
    let spin_runnable = folded_weight_where(&wall, |stack| {
        stack.contains(SPIN) && stack.ends_with(";[runnable]")
    });
    eprintln!("spinner off CPU: {spin_runnable} us runnable, {spin_blocked} us blocked");
    assert!(
        spin_blocked * 50 <= weights[0],
        "spinner: {spin_blocked} us blocked of {} us\n{wall}",
        weights[0]
    );
    // Titles say what, for how long, from how many samples.
    for (svg, title, count) in [
        (
            "wallclock.svg",
            "Wall-clock time of wallclock-demo",
            "samples at 499 Hz",
        ),
        (
            "oncpu.svg",
            "On-CPU time of wallclock-demo",
            "samples at 499 Hz",
        ),
        (
            "offcpu.svg",
            "Off-CPU time of wallclock-demo",
            "off-CPU intervals",
        ),
    ] {
        let text = read(&dir, svg);
        assert!(
            text.contains("<svg")
                && text.contains(title)
                && text.contains(count)
                && text.contains("s profiled"),
            "{svg}"
        );
    }

    // pprof: decodes, and its wall values add up to the folded total.
    let pprof = gunzip(&dir.join("wallclock.pb.gz"));
    let (samples_total, wall_total, strings) = pprof_totals(&pprof);
    assert_eq!(wall_total, folded_total(&wall));
    assert!(samples_total > 0);
    assert!(strings.iter().any(|s| s == SPIN), "{strings:?}");

    // speedscope: three sampled profiles, the first being the wall-clock one.
    let speedscope: serde_json::Value =
        serde_json::from_str(&read(&dir, "wallclock.speedscope.json")).unwrap();
    let profiles = speedscope["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 3);
    assert_eq!(profiles[0]["type"], "sampled");
    assert_eq!(profiles[0]["endValue"], folded_total(&wall));
    let weights_sum: u64 = profiles[0]["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(weights_sum, folded_total(&wall));
}

#[privileged_test]
fn per_thread_puts_each_thread_under_its_own_frame() {
    require_privileged();
    let (_, truth, dir) = profile_demo("profile-threads", &["--per-thread"]);
    let wall = read(&dir, "wallclock.folded");
    for (thread, field, frame) in [
        ("spinner", "spinner_tid", SPIN),
        ("sleeper", "sleeper_tid", SLEEP),
        ("waiter", "waiter_tid", WAIT),
    ] {
        let prefix = format!("wallclock-demo;{thread} [{}];", truth[field]);
        assert!(
            wall.lines()
                .any(|l| l.starts_with(&prefix) && l.contains(frame)),
            "{prefix}\n{wall}"
        );
    }
}

#[privileged_test]
fn jit_compiled_frames_are_named_from_the_perf_map() {
    require_privileged();
    let jit_demo = env!("CARGO_BIN_EXE_jit-demo");
    // The default unwinds with call frame information; the generated code has none, so
    // its caller is found through the frame pointer the code keeps, and marked so. With
    // frame pointers only, nothing is marked: every frame came the same way.
    for (unwind, caller) in [
        ("dwarf", "jit_demo::run_jit [fp];jit_spin_loop"),
        ("fp", "jit_demo::run_jit;jit_spin_loop"),
    ] {
        let (out, truth, dir) = profile_target(
            jit_demo,
            &["--ms", "1500"],
            &format!("profile-jit-{unwind}"),
            &["--unwind", unwind],
        );
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", truth["pid"]));
        let oncpu = read(&dir, "oncpu.folded");
        let total = folded_total(&oncpu);
        // Inside the generated code, named from the perf map, under its caller.
        let jit = folded_weight_where(&oncpu, |stack| stack.contains(caller));
        eprintln!("--unwind {unwind}: {jit} of {total} us on CPU in jit_spin_loop\n{out}");
        assert!(total > 200_000, "{oncpu}");
        assert!(
            jit * 100 >= total * 80,
            "--unwind {unwind}: {jit} of {total} us:\n{oncpu}"
        );
        if unwind == "fp" {
            assert!(!oncpu.contains(" [fp]"), "{oncpu}");
        }
        // Named: nothing to say about unnamed code.
        assert!(!out.contains("Unnamed:"), "{out}");
    }
}

/// Without its perf map, the JIT code cannot be named: the summary says how much of the
/// wall time that is and how to get names.
#[privileged_test]
fn unnamed_jit_code_comes_with_a_hint_to_name_it() {
    require_privileged();
    let jit_demo = env!("CARGO_BIN_EXE_jit-demo");
    let dir = out_dir("profile-jit-unnamed");
    let target = Target::start(jit_demo, &["--ms", "1500"]);
    let map = format!("/tmp/perf-{}.map", target.pid);
    std::fs::remove_file(&map).unwrap();
    let tracer = TracerRun::profile().pid(target.pid).out(&dir).start();
    target.release();
    target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("Unnamed: "))
        .unwrap_or_else(|| panic!("no Unnamed line:\n{out}"));
    let share: f64 = line["Unnamed: ".len()..]
        .split('%')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(share >= 80.0, "{line}");
    assert!(line.contains(&map), "{line}");
}

#[privileged_test]
fn cpp_names_are_demangled() {
    require_privileged();
    let bin = compile_target(
        "g++",
        "src/cpp/cpp-demo.cpp",
        "cpp-demo",
        &["-fno-omit-frame-pointer"],
    );
    let (out, _, dir) = profile_target(bin.to_str().unwrap(), &["1000"], "profile-cpp", &[]);
    let oncpu = read(&dir, "oncpu.folded");
    let spin = "main;demo::Worker<int>::spin(double)";
    let total = folded_total(&oncpu);
    let named = folded_weight_where(&oncpu, |stack| stack.contains(spin));
    eprintln!("{named} of {total} us under {spin}\n{out}");
    assert!(named * 100 >= total * 80, "{named} of {total} us:\n{oncpu}");
}

#[privileged_test]
fn full_maps_are_reported_not_hidden() {
    require_privileged();
    let lost_line = |out: &str| -> String {
        out.lines()
            .find(|l| l.starts_with("Lost: "))
            .unwrap_or_else(|| panic!("no Lost line:\n{out}"))
            .to_string()
    };
    // Room for 2 stacks: the others cannot be captured, and the summary says so. Each
    // flag apart: with few keys too, which keys get in first (with or without a stack) is
    // a race. Frame pointers: every user stack goes to the stack map (the demo's threads
    // have at least four), where DWARF unwinding sends them to user space.
    let (out, _, dir) = profile_demo(
        "profile-small-stack-map",
        &["--stack-map-size", "2", "--unwind", "fp"],
    );
    let lost = lost_line(&out);
    assert!(number_before(&lost, " stacks not captured") > 0, "{lost}");
    // What fit is still written, with missing stacks named as such.
    assert!(
        read(&dir, "wallclock.folded").contains("[missing "),
        "{out}"
    );
    // Room for 4 keys: the rest are dropped, and counted.
    let (out, _, _) = profile_demo("profile-small-maps", &["--map-size", "4"]);
    let lost = lost_line(&out);
    assert!(
        number_before(&lost, " samples or intervals dropped") > 0,
        "{lost}"
    );
    // With the default sizes nothing is dropped (a stack may still collide in the stack
    // map's hash table, which is counted too).
    let (out, _, _) = profile_demo("profile-default-maps", &[]);
    assert!(
        out.contains("Nothing lost") || out.contains(" 0 samples or intervals dropped"),
        "{out}"
    );
}

#[privileged_test]
fn threads_blocked_since_before_the_start_are_accounted_under_their_stacks() {
    require_privileged();
    // Attach once the waiter is already blocked on the lock (and the holder asleep). The
    // threads run on for seconds: a start slowed by a busy machine still leaves a profile
    // of many samples, where one sample (10 ms) more or less is no 20% of a thread.
    let dir = out_dir("profile-late");
    let target = Target::start(WALLCLOCK_DEMO, &["--ms", "4000"]);
    target.release();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let tracer = TracerRun::profile()
        .pid(target.pid)
        .arg("--per-thread")
        .out(&dir)
        .start();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let wall = read(&dir, "wallclock.folded");
    let thread_total = |field: &str| {
        let prefix = format!(
            "wallclock-demo;{} [{}];",
            &field[..field.len() - 4],
            truth[field]
        );
        folded_weight_where(&wall, |stack| stack.starts_with(&prefix))
    };
    let spinner = thread_total("spinner_tid");
    let waiter = thread_total("waiter_tid");
    eprintln!("spinner {spinner} us, waiter {waiter} us\n{out}");
    // The waiter never switched during the profile, yet its wall time is all there.
    assert!(
        (waiter as f64 - spinner as f64).abs() <= 0.2 * spinner as f64,
        "waiter {waiter} us, spinner {spinner} us\n{wall}"
    );
    // And it is under the function it waits in, read from /proc when profiling started,
    // down through the kernel's futex wait: not under an unknown frame.
    let waiter_prefix = format!("wallclock-demo;waiter [{}];", truth["waiter_tid"]);
    let in_wait = folded_weight_where(&wall, |stack| {
        stack.starts_with(&waiter_prefix)
            && stack.contains("start_thread")
            && stack.contains(WAIT)
            && stack.contains("futex")
            && stack.ends_with(";[off-cpu]")
    });
    assert!(
        in_wait as f64 >= 0.9 * waiter as f64,
        "waiter: {in_wait} of {waiter} us under {WAIT}\n{wall}"
    );
    assert!(
        !wall.contains("[blocked since before profiling started]"),
        "{wall}"
    );
}

#[privileged_test]
fn system_wide_names_each_process() {
    require_privileged();
    let dir = out_dir("profile-all");
    let target = Target::start(WALLCLOCK_DEMO, &["--ms", "1500"]);
    let demo = format!("wallclock-demo [{}];", target.pid);
    let tracer = TracerRun::profile().duration("1s").out(&dir).start();
    target.release();
    let (ok, out, err) = tracer.finish();
    target.finish();
    assert!(ok, "tracer failed: {err}");
    assert!(err.contains("duration elapsed"), "{err}");
    assert!(out.contains("processes"), "{out}");
    let wall = read(&dir, "wallclock.folded");
    // The demo, seen only through its samples, is captured and symbolized on the fly,
    // under a frame with its name and PID (the profile has many processes).
    assert!(
        wall.lines()
            .any(|l| l.starts_with(&demo) && l.contains(SPIN)),
        "{wall}"
    );
}

/// Decompresses a gzip file with the system's gzip.
fn gunzip(path: &Path) -> Vec<u8> {
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .expect("gzip is needed to read the pprof output");
    assert!(out.status.success(), "gzip -dc {}", path.display());
    out.stdout
}

fn varint(buf: &[u8], pos: &mut usize) -> u64 {
    let (mut value, mut shift) = (0u64, 0);
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

/// Top-level fields of a protobuf message: (field number, varint or bytes).
fn fields(buf: &[u8]) -> Vec<(u64, Result<u64, &[u8]>)> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos);
        match key & 7 {
            0 => out.push((key >> 3, Ok(varint(buf, &mut pos)))),
            2 => {
                let len = varint(buf, &mut pos) as usize;
                out.push((key >> 3, Err(&buf[pos..pos + len])));
                pos += len;
            }
            other => panic!("unexpected wire type {other}"),
        }
    }
    out
}

/// Sums the two values of every pprof sample; returns them and the string table.
fn pprof_totals(profile: &[u8]) -> (u64, u64, Vec<String>) {
    let (mut samples, mut wall, mut strings) = (0, 0, Vec::new());
    for (field, value) in fields(profile) {
        match (field, value) {
            (2, Err(sample)) => {
                for (field, value) in fields(sample) {
                    if let (2, Err(packed)) = (field, value) {
                        let mut pos = 0;
                        samples += varint(packed, &mut pos);
                        wall += varint(packed, &mut pos);
                        assert_eq!(pos, packed.len(), "two values per sample");
                    }
                }
            }
            (6, Err(s)) => strings.push(String::from_utf8(s.to_vec()).unwrap()),
            _ => {}
        }
    }
    assert_eq!(strings.first().map(String::as_str), Some(""));
    (samples, wall, strings)
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = run_tracer(&["profile", "--frequency", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = out.stderr.as_str();
    assert!(err.contains("invalid --frequency 0"), "{err}");
}

#[privileged_test]
fn a_missing_process_is_a_clear_error() {
    require_privileged();
    let out = run_tracer(&["profile", "--pid", "4194304"]);
    assert_eq!(out.status.code(), Some(1));
    let err = out.stderr.as_str();
    assert!(err.contains("no such process: 4194304"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A binary stripped of every symbol, whose names are in a separate debug file it points
/// to with `.gnu_debuglink` (as distributions ship `-dbgsym` packages): its frames are
/// named from that file, static functions included.
#[privileged_test]
fn frames_are_named_from_separate_debug_files() {
    require_privileged();
    let bin = compile_target(
        "gcc",
        "src/debuglink/debuglink-demo.c",
        "debuglink-demo",
        &["-g", "-O1"],
    );
    let debug = bin.with_extension("debug");
    let run = |program: &str, args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new(program)
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "{program} {args:?}");
    };
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            bin.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run("strip", &["--strip-all".as_ref(), bin.as_os_str()]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run("objcopy", &[link.as_ref(), bin.as_os_str()]);
    let nm = std::process::Command::new("nm").arg(&bin).output().unwrap();
    assert!(
        String::from_utf8_lossy(&nm.stderr).contains("no symbols"),
        "the binary keeps symbols: {nm:?}"
    );
    let dir = out_dir("profile-debuglink");
    let mut target = std::process::Command::new(&bin)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(target.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid = target.id().to_string();
    let out = run_tracer(&["profile", "--pid", &pid, "-o", dir.to_str().unwrap()]);
    assert!(target.wait().unwrap().success());
    assert!(out.status.success(), "{out:?}");
    let oncpu = read(&dir, "oncpu.folded");
    let named = folded_weight_where(&oncpu, |s| s.contains("main;spin_in_static_function"));
    let total = folded_total(&oncpu);
    assert!(
        named * 100 >= total * 90,
        "{named} of {total} us named\n{oncpu}"
    );
}

/// C functions named `f`, `i` and `w` keep their names: only mangled names are demangled
/// (a C++ demangler reads them as the types float, int and wchar_t).
#[privileged_test]
fn one_letter_c_functions_keep_their_names() {
    require_privileged();
    let bin = compile_target(
        "gcc",
        "src/oneletter/oneletter.c",
        "oneletter",
        &["-fno-omit-frame-pointer", "-fno-inline"],
    );
    let target = StdinTarget::start(std::process::Command::new(&bin).arg("1000"));
    let dir = out_dir("profile-oneletter");
    let tracer = TracerRun::profile().pid(target.pid).out(&dir).start();
    let rest = target.release_and_finish();
    assert!(rest.contains("spun"), "{rest}");
    let (ok, _out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let oncpu = read(&dir, "oncpu.folded");
    assert!(
        oncpu.lines().any(|l| l.contains(";f;i;w ")),
        "no f -> i -> w stack\n{oncpu}"
    );
    for builtin in ["float", "wchar_t", ";int;"] {
        assert!(!oncpu.contains(builtin), "{builtin}\n{oncpu}");
    }
}

/// A stack-copy buffer too small for a burst (200 threads blocking at once, in a buffer
/// of four copies): the stacks that found it full are walked with frame pointers, and
/// the summary says how many and which flag keeps them.
#[privileged_test]
fn a_full_stack_copy_buffer_is_counted_and_names_its_flag() {
    require_privileged();
    let (out, _) = profile_many_threads_in_64k("profile-small-unwind-buffer", "3", "50");
    let unwinding = out
        .lines()
        .find(|l| l.starts_with("Unwinding: "))
        .unwrap_or_else(|| panic!("no unwinding line: {out}"));
    assert!(
        number_before(unwinding, " with the snapshot ring buffer full") > 0,
        "{unwinding}"
    );
    assert!(
        unwinding.contains("--unwind-buffer above its 64 KiB keeps them"),
        "{unwinding}"
    );
}

/// A burst that keeps a small stack-copy buffer half full (200 threads blocking every
/// 2 ms): a thread blocking again where its snapshot still waits to be unwound reuses
/// it, the summary says how many did, and those stacks keep their frames.
#[privileged_test]
fn a_half_full_stack_copy_buffer_reuses_snapshots_not_yet_unwound() {
    require_privileged();
    let (out, dir) = profile_many_threads_in_64k("profile-reused-unchecked", "50", "2");
    let reused = out
        .lines()
        .find(|l| l.starts_with("Reused unchecked: "))
        .unwrap_or_else(|| panic!("no line on reused snapshots: {out}"));
    assert!(
        number_before(reused, " off-CPU stacks took the snapshot") > 0,
        "{reused}"
    );
    assert!(
        reused.contains("--unwind-buffer above its 64 KiB sends them all"),
        "{reused}"
    );
    // The workers' sleeps are under the function they sleep in, reused snapshots
    // included.
    let folded = std::fs::read_to_string(dir.join("offcpu.folded")).unwrap();
    let (mut named, mut all) = (0u64, 0u64);
    let sleeps = folded
        .lines()
        .filter(|l| l.contains("worker_thread") && l.contains("nanosleep"));
    for line in sleeps {
        let weight: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        all += weight;
        if line.contains("block_in_worker") {
            named += weight;
        }
    }
    assert!(
        all > 0 && named * 10 >= all * 9,
        "{named} of {all}\n{folded}"
    );
}

/// Profiles `many-threads` (200 threads, each sleeping `sleeps` times `sleep_ms` ms) with
/// a stack-copy buffer of four copies, into output directory `name`; the summary and the
/// directory.
fn profile_many_threads_in_64k(
    name: &str,
    sleeps: &str,
    sleep_ms: &str,
) -> (String, std::path::PathBuf) {
    let dir = out_dir(name);
    let target = Target::start(
        MANY_THREADS,
        &[
            "--threads",
            "200",
            "--sleeps",
            sleeps,
            "--sleep-ms",
            sleep_ms,
        ],
    );
    let tracer = TracerRun::profile()
        .pid(target.pid)
        .args(["--unwind-buffer", "64K"])
        .out(&dir)
        .start();
    target.release();
    target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    (out, dir)
}

/// The number just before `what` in `line` (`... 12 stacks not captured`).
fn number_before(line: &str, what: &str) -> u64 {
    line.split(what)
        .next()
        .unwrap()
        .rsplit([' ', '(', ';'])
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("no number before {what:?} in {line:?}: {e}"))
}
