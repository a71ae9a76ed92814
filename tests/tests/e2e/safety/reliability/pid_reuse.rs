//! A target's PID taken by a new process while a tracer still watches it: nothing of the
//! new process is traced or counted as the target's.

use super::*;

/// Starts `program ARGS` (no wait for a signal) as process `pid`, which must be free:
/// sets the kernel's last allocated PID to `pid - 1` and forks, until the child gets it
/// (other tests fork meanwhile, so a few tries may lose the race).
fn spawn_as_pid(pid: u32, program: &str, args: &[&str]) -> Child {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("writing /proc/sys/kernel/ns_last_pid needs root");
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        if child.id() == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a process as PID {pid}");
}

/// Waits for a child started by [`spawn_as_pid`] and returns its ground-truth JSON.
fn finish_child(mut child: Child) -> serde_json::Value {
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let json = out.lines().last().unwrap();
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The target exits and its PID is taken by a new process running the same binary while
/// the tracer still holds its probes (it is stopped with SIGSTOP across the exit, which
/// stretches the moment between the exit and the tracer noticing it). The new process is
/// not traced: no breakpoint and no raised semaphore in it, none of its events printed
/// (`trace`) or counted (`attach`'s GC figures); and once resumed the tracer stops with
/// "target exited" and exits 0.
///
/// Off-CPU time has a test of its own below.
#[privileged_test]
fn a_reused_pid_is_not_traced() {
    require_privileged();
    // trace: usdt-args fires probes without semaphores too, so the new process executes
    // probe sites (a breakpoint there would fire) during the whole window.
    let target = Target::start(USDT_ARGS, &["--loops", "3"]);
    let pid = target.pid;
    let tracer = TracerRun::trace()
        .json()
        .pid(pid)
        .args(["usdt:*:tracer_test:*"])
        .start();
    send(tracer.pid(), libc::SIGSTOP);
    target.release();
    let truth = target.finish();
    let reuser = spawn_as_pid(pid, USDT_ARGS, &["--loops", "400", "--interval-ms", "2"]);
    thread::sleep(Duration::from_millis(100));
    ProbeSites::of(pid).assert_untouched("a new process with the traced PID");
    thread::sleep(Duration::from_millis(200));
    send(tracer.pid(), libc::SIGCONT);
    let (ok, out, err) = tracer.finish();
    let reuser_truth = finish_child(reuser);
    assert!(ok, "{err}");
    assert!(err.contains("Stopped: target exited"), "{err}");
    assert_eq!(reuser_truth["pid"], pid);
    assert_eq!(reuser_truth["fired"]["guarded"], 0, "{reuser_truth}");
    assert_eq!(reuser_truth["fired"]["consts"], 400);
    let fired: u64 = truth["fired"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let printed = out.lines().filter(|l| l.contains("\"probe\"")).count() as u64;
    assert_eq!(printed, fired, "only the original process's events: {out}");

    // attach: the new gc-demo's GCs are not counted.
    let target = Target::start(GC_DEMO, &["--gcs", "3", "--interval-ms", "10"]);
    let pid = target.pid;
    let dir = out_dir("reuse-attach");
    let tracer = TracerRun::attach().pid(pid).json().out(&dir).start();
    send(tracer.pid(), libc::SIGSTOP);
    target.release();
    let truth = target.finish();
    let reuser = spawn_as_pid(pid, GC_DEMO, &["--gcs", "20", "--interval-ms", "10"]);
    thread::sleep(Duration::from_millis(100));
    ProbeSites::of(pid).assert_untouched("a new process with the traced PID");
    thread::sleep(Duration::from_millis(200));
    send(tracer.pid(), libc::SIGCONT);
    let (ok, out, err) = tracer.finish();
    finish_child(reuser);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["stopped_by"], "target exited");
    assert_eq!(report["gc"]["count"], truth["gcs"], "{report:#}");
}

/// Off-CPU time of a process that took over the target's PID before the tracer noticed
/// the exit must not land in the target's profile: `sched_switch` accounting
/// (tracer-ebpf/src/offcpu.rs) identifies the target by its PID *and* its start time.
#[privileged_test]
fn off_cpu_time_of_a_process_reusing_the_pid_is_not_attributed_to_the_target() {
    require_privileged();
    let target = Target::start(GC_DEMO, &["--gcs", "3", "--interval-ms", "10"]);
    let pid = target.pid;
    let dir = out_dir("reuse-offcpu");
    let tracer = TracerRun::attach().pid(pid).json().out(&dir).start();
    let attached = Instant::now();
    send(tracer.pid(), libc::SIGSTOP);
    target.release();
    let _ = target.finish();
    // gc-demo has 4 threads; none can have been blocked longer than it was traced.
    let bound_ns = 4 * attached.elapsed().as_nanos() as u64;
    // The new process blocks about 4 s in all (4 threads, 1 s).
    let reuser = spawn_as_pid(pid, GC_DEMO, &["--gcs", "25", "--interval-ms", "30"]);
    thread::sleep(Duration::from_millis(1000));
    send(tracer.pid(), libc::SIGCONT);
    let (ok, out, err) = tracer.finish();
    finish_child(reuser);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let total = report["offcpu"]["total_ns"].as_u64().unwrap();
    assert!(
        total <= bound_ns,
        "{total} ns off-CPU reported for a target traced {bound_ns} ns thread-time at most"
    );
}
