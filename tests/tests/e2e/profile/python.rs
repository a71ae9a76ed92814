//! Python frames in Python's own words: `tests/python/wallclock_demo.py` profiled on
//! Debian's CPython 3.11 and on pyenv's builds, and `tracer stacks` against the
//! interpreter's own view of its threads.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::common::*;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/wallclock_demo.py");
const SCRIPT_FILE: &str = "wallclock_demo.py";

/// The functions of the script each timing itself, by the field of its report.
const TIMED: [&str; 5] = [
    "spin_python",
    "nap",
    "sleep_in_python",
    "churn_garbage",
    "wait_on_socket",
];

/// Debian's interpreter, or a pyenv build of `version` (`3.12.1`).
fn interpreter(version: Option<&str>) -> PathBuf {
    let path = match version {
        None => PathBuf::from("/usr/bin/python3.11"),
        Some(version) => {
            let root = std::env::var_os("PYENV_ROOT")
                .map_or_else(|| PathBuf::from("/root/.pyenv"), PathBuf::from);
            let minor: String = version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".");
            root.join("versions")
                .join(version)
                .join("bin")
                .join(format!("python{minor}"))
        }
    };
    assert!(
        path.is_file(),
        "{} is missing: the machines this project runs on have Debian's python3.11 and \
         pyenv's CPython builds",
        path.display()
    );
    path
}

/// Whether `stack` (a folded line's frames) names a function of the script.
fn names_the_script(stack: &str) -> bool {
    stack.contains(&format!("({SCRIPT_FILE}:"))
}

/// Profiles `python SCRIPT ARGS` from its release to its exit with `tracer profile --pid
/// PID EXTRA -o DIR`; returns the script's report, the tracer's summary and the
/// wall-clock profile's folded stacks.
fn profile_script(
    python: &Path,
    args: &[&str],
    name: &str,
    extra: &[&str],
) -> (serde_json::Value, String, String) {
    require_privileged();
    let dir = out_dir(name);
    let mut target_args = vec![SCRIPT];
    target_args.extend_from_slice(args);
    let target = Target::start(python.to_str().unwrap(), &target_args);
    let pid = target.pid.to_string();
    let mut tracer_args = vec!["profile", "--pid", &pid, "-o", dir.to_str().unwrap()];
    tracer_args.extend_from_slice(extra);
    let tracer = Tracer::start(&tracer_args);
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    (truth, out, wall)
}

/// Profiles the script on `python` from its start to its exit and checks that every
/// thread's wall time is named in Python and each timed function's share matches its
/// own clock.
fn profile_python(python: &Path, name: &str) {
    // Enough on-CPU samples that each function's share is within a few percent.
    let extra = ["--per-thread", "--frequency", "499"];
    let (truth, out, wall) = profile_script(python, &[], name, &extra);

    // Every thread's wall time (the thread is the second frame) names the script.
    let mut threads: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (stack, weight) in wall.lines().filter_map(|l| l.rsplit_once(' ')) {
        let weight: u64 = weight.parse().unwrap();
        let thread = stack.split(';').nth(1).unwrap_or("?");
        let entry = threads.entry(thread).or_default();
        entry.0 += weight;
        if names_the_script(stack) {
            entry.1 += weight;
        }
    }
    eprintln!("{out}\nper thread (total us, named us): {threads:?}");
    assert!(threads.len() >= 6, "{threads:?}\n{wall}");
    for (thread, (total, named)) in &threads {
        let share = *named as f64 / *total as f64;
        assert!(
            share >= 0.9,
            "{thread}: {:.1}% of {total} us names a function of the script\n{wall}",
            share * 100.0
        );
    }

    // Each timed function's wall time against the function's own clock.
    for function in TIMED {
        let frame = format!("{function} ({SCRIPT_FILE}:");
        let measured = folded_weight_where(&wall, |stack| stack.contains(&frame));
        let own_us = truth[function].as_u64().unwrap() / 1000;
        let error = (measured as f64 - own_us as f64).abs() / own_us as f64;
        eprintln!("{function}: {measured} us, its own clock {own_us} us");
        assert!(
            error <= 0.1,
            "{function}: {measured} us, its own clock says {own_us} us\n{wall}"
        );
    }

    // C code called from Python sits between the Python caller and the kernel: the C
    // library's call (3.9 sleeps in select(2), later versions in clock_nanosleep(2)).
    let calls_into = |line: &str, caller: &str, callees: &[&str], kernel: &dyn Fn(&str) -> bool| {
        let Some(at) = line.find(&format!("{caller} ({SCRIPT_FILE}:")) else {
            return false;
        };
        let frames = || line[at..].split(';');
        frames().any(|frame| callees.iter().any(|callee| frame.ends_with(callee)))
            && frames().any(kernel)
    };
    let kernel_function = |frame: &str| frame.ends_with("_[k]") && !frame.starts_with('[');
    assert!(
        wall.lines().any(|line| calls_into(
            line,
            "nap",
            &["clock_nanosleep", "select"],
            &kernel_function
        )),
        "no nap -> C library sleep -> kernel stack\n{wall}"
    );
    // The socket is waited on once, so its kernel stack is taken once: when the kernel
    // cannot give it, the profile must say so in its place.
    let said_lost = |frame: &str| {
        ["[kernel stack unreadable]_[k]", "[kernel stack missed]_[k]"].contains(&frame)
    };
    let socket = |kernel: &dyn Fn(&str) -> bool| {
        wall.lines()
            .any(|line| calls_into(line, "wait_on_socket", &["recv"], kernel))
    };
    if !socket(&kernel_function) && socket(&said_lost) {
        eprintln!("wait_on_socket's one kernel stack was lost, and the profile says so");
    } else {
        assert!(
            socket(&kernel_function),
            "no wait_on_socket -> recv -> kernel stack\n{wall}\n{out}"
        );
    }
}

#[privileged_test]
fn debian_python_3_11_threads_are_named_in_python() {
    profile_python(&interpreter(None), "python-debian-3.11");
}

#[privileged_test]
fn pyenv_python_3_9_threads_are_named_in_python() {
    profile_python(&interpreter(Some("3.9.18")), "python-pyenv-3.9");
}

#[privileged_test]
fn pyenv_python_3_12_threads_are_named_in_python() {
    profile_python(&interpreter(Some("3.12.1")), "python-pyenv-3.12");
}

#[privileged_test]
fn pyenv_python_3_13_threads_are_named_in_python() {
    profile_python(&interpreter(Some("3.13.0")), "python-pyenv-3.13");
}

/// `(function, line)` of each Python frame of a `tracer stacks` user stack, innermost
/// first: `Event.wait (threading.py:629)` is `("wait", 629)`.
fn python_frames(stack: &[serde_json::Value]) -> Vec<(String, u64)> {
    stack
        .iter()
        .filter_map(|frame| {
            let frame = frame.as_str()?;
            let (name, place) = frame.split_once(" (")?;
            let (_, line) = place.strip_suffix(')')?.rsplit_once(':')?;
            let function = name.rsplit('.').next()?;
            Some((function.to_string(), line.parse().ok()?))
        })
        .collect()
}

/// `tracer stacks` names each blocked thread's Python functions and lines as the
/// interpreter itself does (`sys._current_frames()`).
fn stacks_match_python(python: &Path) {
    require_privileged();
    let mut child = Command::new(python)
        .args([SCRIPT, "--park"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let own: BTreeMap<String, Vec<(String, u64)>> = serde_json::from_str(
        line.trim()
            .strip_prefix("parked ")
            .unwrap_or_else(|| panic!("{line}")),
    )
    .unwrap();
    let out = run_tracer(&[
        "stacks",
        "--pid",
        &child.id().to_string(),
        "--format",
        "json",
    ]);
    drop(child.stdin.take());
    let _ = child.wait();
    assert!(out.status.success(), "{}", out.stderr.as_str());
    let dump: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    for (tid, expected) in &own {
        let thread = dump["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"].as_u64().map(|t| t.to_string()).as_deref() == Some(tid))
            .unwrap_or_else(|| panic!("thread {tid} missing\n{dump:#}"));
        let frames = python_frames(thread["user_stack"].as_array().unwrap());
        assert_eq!(&frames, expected, "thread {tid}\n{thread:#}");
    }
}

#[privileged_test]
fn stacks_names_python_frames_as_python_does_3_11() {
    stacks_match_python(&interpreter(None));
}

#[privileged_test]
fn stacks_names_python_frames_as_python_does_in_pyenvs_3_9_to_3_13() {
    for version in ["3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        stacks_match_python(&interpreter(Some(version)));
    }
}

/// `attach` splits each Python thread's wall time in Python's terms: the sleeper is
/// blocked, the collector collects garbage, the workers run Python and wait for the GIL.
#[privileged_test]
fn attach_splits_python_threads_time_in_pythons_terms() {
    require_privileged();
    let python = interpreter(Some("3.12.1"));
    let run = attach_json(python.to_str().unwrap(), &[SCRIPT], "python-states", &[]);
    let threads = run.report["threads"].as_array().unwrap();
    let split = |name: &str| {
        let tid = run.truth["tids"][name].as_u64().unwrap();
        let thread = threads
            .iter()
            .find(|t| t["tid"].as_u64() == Some(tid))
            .unwrap_or_else(|| panic!("{name} ({tid}) missing: {threads:#?}"));
        let wall = ["oncpu_ns", "blocked_ns", "runnable_ns"]
            .iter()
            .map(|f| thread[f].as_u64().unwrap())
            .sum::<u64>();
        let python = &thread["python"];
        let ns = move |field: &str| {
            python[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{thread:#}"))
        };
        let total = ["running_ns", "gil_ns", "gc_ns", "blocked_ns", "runnable_ns"]
            .iter()
            .map(|f| ns(f))
            .sum::<u64>();
        eprintln!("{name}: wall {wall} ns, in Python's terms {python}");
        assert!(total as f64 >= 0.9 * wall as f64, "{name}: {thread:#}");
        (wall, ns)
    };
    // The sleeper sleeps, and waits for the GIL the spinners hold each time it wakes.
    let (wall, sleeper) = split("sleeper");
    assert!(
        (sleeper("blocked_ns") + sleeper("gil_ns")) as f64 >= 0.9 * wall as f64
            && sleeper("blocked_ns") as f64 >= 0.5 * wall as f64,
        "the sleeper sleeps"
    );
    let (_, collector) = split("collector");
    let own_gc_us = run.truth["churn_garbage"].as_u64().unwrap() / 1000;
    assert!(
        collector("gc_ns") > 0 && collector("gc_ns") / 1000 <= own_gc_us,
        "the collector's GC time is part of churn_garbage's {own_gc_us} us"
    );
    for worker in ["cpu-1", "cpu-2"] {
        let (_, worker) = split(worker);
        assert!(worker("running_ns") > 0 && worker("blocked_ns") > 0);
    }
    let gil: u64 = ["cpu-1", "cpu-2", "sleeper", "collector"]
        .iter()
        .map(|name| split(name).1("gil_ns"))
        .sum();
    assert!(gil > 0, "threads that wake take the GIL from the spinners");
}

/// Per process of a folded profile (its root frame, `name [pid]`): its total weight and
/// the weight of stacks that name the script.
fn named_share_by_process(wall: &str) -> BTreeMap<String, (u64, u64)> {
    let mut processes: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (stack, weight) in wall.lines().filter_map(|l| l.rsplit_once(' ')) {
        let weight: u64 = weight.parse().unwrap();
        let process = stack.split(';').next().unwrap_or("?").to_string();
        let entry = processes.entry(process).or_default();
        entry.0 += weight;
        if names_the_script(stack) {
            entry.1 += weight;
        }
    }
    processes
}

/// A Python server's forked workers (`--children`) are named in Python from their first
/// instruction: the kernel gives each child its parent's interpreter.
#[privileged_test]
fn forked_python_workers_are_named_in_python() {
    let python = interpreter(Some("3.12.1"));
    let (truth, out, wall) =
        profile_script(&python, &["--fork"], "python-children", &["--children"]);
    let processes = named_share_by_process(&wall);
    eprintln!("{out}\nper process (total us, named us): {processes:?}");
    for child in truth["children"].as_array().unwrap() {
        let suffix = format!("[{child}]");
        let (total, named) = processes
            .iter()
            .find(|(name, _)| name.ends_with(&suffix))
            .map_or_else(
                || panic!("child {child} missing\n{wall}"),
                |(_, weights)| *weights,
            );
        assert!(
            named as f64 >= 0.9 * total as f64,
            "child {child}: {named} of {total} us named\n{wall}"
        );
        assert!(
            wall.lines()
                .any(|l| l.starts_with(&format!("python3.12 {suffix}"))
                    && l.contains(&format!("spin_in_child ({SCRIPT_FILE}:"))),
            "child {child}\n{wall}"
        );
    }
}

/// A traced shell that later runs Python: the programs without the Python walk (loaded
/// while no target ran Python) give way to those with it, and each timed function's time
/// is named in Python as its own clock measured it.
#[privileged_test]
fn a_target_that_starts_python_later_is_named_in_python() {
    require_privileged();
    let python = interpreter(None);
    let dir = out_dir("python-later");
    let mut shell = Command::new("sh")
        .args([
            "-c",
            &format!(
                "read _; exec {} {SCRIPT} --wait-for-signal",
                python.display()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = shell.id();
    let tracer = TracerRun::profile().pid(pid).out(&dir).start();
    std::io::Write::write_all(&mut shell.stdin.take().unwrap(), b"go\n").unwrap();
    let mut stdout = BufReader::new(shell.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), format!("ready pid={pid}"));
    // The tracer finds the interpreter within its look at the targets' processes.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    let mut report = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut report).unwrap();
    assert!(shell.wait().unwrap().success());
    let truth: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    eprintln!("{out}");
    for function in TIMED {
        let frame = format!("{function} ({SCRIPT_FILE}:");
        let measured = folded_weight_where(&wall, |stack| stack.contains(&frame));
        let own_us = truth[function].as_u64().unwrap() / 1000;
        eprintln!("{function}: {measured} us, its own clock {own_us} us");
        // Time on a CPU is sampled at 99 Hz: a function that runs for 0.6 s has about 60
        // samples, whose count varies by its square root.
        let sample_us = 1e6 / 99.0;
        let sampling_error = 3.0 * (own_us as f64 / sample_us).sqrt() * sample_us;
        let allowed = (0.1 * own_us as f64).max(sampling_error);
        assert!(
            (measured as f64 - own_us as f64).abs() <= allowed,
            "{function}: {measured} us, its own clock says {own_us} us\n{wall}"
        );
    }
}

/// A Python process in a mount namespace of its own, its interpreter and script at paths
/// the host does not have: its frames are read through /proc all the same.
#[privileged_test]
fn python_in_its_own_mount_namespace_is_named_in_python() {
    require_privileged();
    let python = interpreter(Some("3.12.1"));
    let home = python.parent().unwrap().parent().unwrap();
    let root = out_dir("python-container-root");
    let scripts = std::path::Path::new(SCRIPT).parent().unwrap();
    // The interpreter at /opt/py and the script at /app, seen only inside the namespace.
    let setup = format!(
        "set -e; R={root}; mkdir -p $R/usr $R/opt/py $R/app $R/tmp; \
         ln -sfn usr/lib $R/lib; ln -sfn usr/lib64 $R/lib64; ln -sfn usr/bin $R/bin; \
         mount --bind /usr $R/usr; mount --bind {home} $R/opt/py; mount --bind {scripts} $R/app; \
         exec chroot $R /usr/bin/env LD_LIBRARY_PATH=/opt/py/lib PYTHONHOME=/opt/py \
         /opt/py/bin/python3.12 /app/{SCRIPT_FILE} \"$@\"",
        root = root.display(),
        home = home.display(),
        scripts = scripts.display(),
    );
    let target = Target::start(
        "unshare",
        &[
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &setup,
            "sh",
        ],
    );
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid)).unwrap();
    assert!(maps.contains("/opt/py/lib/libpython3.12"), "{maps}");
    let dir = out_dir("python-container");
    let tracer = TracerRun::profile().pid(target.pid).out(&dir).start();
    target.release();
    let _ = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    let (total, named) = named_share_by_process(&wall)
        .into_values()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    eprintln!("{out}\nnamed {named} of {total} us");
    assert!(named as f64 >= 0.9 * total as f64, "{wall}");
    assert!(
        wall.contains(&format!("spin_python ({SCRIPT_FILE}:")),
        "{wall}"
    );
}

/// Each collection's stack, at Debian's CPython's own `gc__start` probe, sits under the
/// Python line that allocated and triggered it (`trace --stack`).
#[privileged_test]
fn gc_probe_hits_sit_under_the_python_line_that_triggered_them() {
    require_privileged();
    let python = interpreter(None);
    let target = Target::start(python.to_str().unwrap(), &[SCRIPT, "--gc"]);
    let probe = format!("usdt:{}:python:gc__start", python.display());
    let tracer = TracerRun::trace()
        .pid(target.pid)
        .args(["--stack", "--unwind", "dwarf"])
        .json()
        .arg(&probe)
        .start();
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let hits: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|event: &serde_json::Value| event["probe"] == probe.as_str())
        .collect();
    let explicit = truth["explicit"].as_u64().unwrap() as usize;
    assert!(hits.len() >= explicit, "{} hits\n{out}", hits.len());
    let innermost_python = |hit: &serde_json::Value| -> String {
        hit["stack"]
            .as_array()
            .unwrap()
            .iter()
            .find(|frame| frame["module"] == "[python]")
            .map(|frame| frame["function"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    // The interpreter's last collection, as it exits, runs no Python code.
    let at_exit = |hit: &&serde_json::Value| {
        hit["stack"]
            .as_array()
            .unwrap()
            .iter()
            .any(|frame| frame["function"] == "Py_FinalizeEx")
    };
    for hit in hits.iter().filter(|hit| !at_exit(hit)) {
        assert!(
            innermost_python(hit).contains(&format!("({SCRIPT_FILE}:")),
            "a collection outside the script's Python code: {hit:#}"
        );
    }
    let triggered = hits
        .iter()
        .filter(|hit| innermost_python(hit).starts_with("allocate_cycles"))
        .count();
    let collected = hits
        .iter()
        .filter(|hit| innermost_python(hit).starts_with("collect_garbage_often"))
        .count();
    assert!(
        triggered > 0,
        "no collection under the allocating line\n{out}"
    );
    assert_eq!(collected, explicit, "{out}");
}

/// A stack deeper than the Python frames the kernel sends is marked cut short, and the
/// report says how much of the wall time is.
#[privileged_test]
fn a_stack_cut_short_says_so() {
    let python = interpreter(Some("3.12.1"));
    let (_, out, wall) = profile_script(&python, &["--deep"], "python-deep", &[]);
    let cut = folded_weight_where(&wall, |stack| {
        stack.split(';').nth(1) == Some("[truncated]")
            && stack.contains(&format!("deep ({SCRIPT_FILE}:"))
    });
    assert!(cut >= 900_000, "{cut} us cut short\n{wall}");
    assert!(out.contains("Truncated: "), "{out}");
}

/// The descriptors of `/proc/PID/mem` the tracer `tracer` holds, by the PID they read.
fn mem_descriptors(tracer: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{tracer}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.to_string();
            target
                .strip_prefix("/proc/")?
                .strip_suffix("/mem")?
                .parse()
                .ok()
        })
        .collect()
}

/// Short-lived Python workers (`--children`) leave no descriptor open in the tracer once
/// they are done: their memory is read while they are named, then closed.
#[privileged_test]
fn python_workers_that_exit_leave_no_descriptor_open() {
    require_privileged();
    let python = interpreter(Some("3.12.1"));
    let dir = out_dir("python-fork-many");
    let mut target = Target::start(python.to_str().unwrap(), &[SCRIPT, "--fork-many"]);
    let tracer = TracerRun::profile()
        .pid(target.pid)
        .arg("--children")
        .out(&dir)
        .start();
    target.release();
    assert_eq!(target.read_line(), "workers done");
    // A few of the tracer's observe periods after the last worker exited.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let held = mem_descriptors(tracer.pid());
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let children: Vec<u32> = truth["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as u32)
        .collect();
    eprintln!("{out}\nthe tracer holds the memory of {held:?}");
    assert!(
        held.iter().all(|pid| !children.contains(pid)),
        "descriptors of exited workers: {held:?}"
    );
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    let named = children
        .iter()
        .filter(|child| {
            wall.lines().any(|l| {
                l.starts_with(&format!("python3.12 [{child}]"))
                    && l.contains(&format!("spin_in_child ({SCRIPT_FILE}:"))
            })
        })
        .count();
    assert!(
        named * 2 >= children.len(),
        "{named} of {} workers named\n{wall}",
        children.len()
    );
}
