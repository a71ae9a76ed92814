//! A server started after the tracer, found by executable (`--exe`), command name
//! (`--comm`) or cgroup (`--cgroup`, v2 and v1).

use super::*;

// ---------------------------------------------------------------------------------------
// Processes started while tracing: --exe, --comm, --cgroup

/// Waits until the tracer has put its probes into process `pid` (breakpoints at the
/// sites, semaphores raised), so the process can be let go without losing a hit.
fn wait_until_traced(pid: u32, tracer: &Running) {
    let sites = ProbeSites::of(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let breakpoints = sites.breakpoints();
        let semaphores = sites.semaphore_values();
        if breakpoints > 0 && semaphores.iter().all(|&v| v > 0) {
            return;
        }
        assert!(
            tracer.is_running(),
            "the tracer exited before it traced process {pid}"
        );
        assert!(
            Instant::now() < deadline,
            "10 s after process {pid} started the tracer has not traced it: {breakpoints} \
             breakpoints, semaphores {semaphores:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `attach SELECT --latency PAIR --format json -o DIR`, then `program` (which no
/// process ran when the tracer attached), calls `place(pid)` (e.g. to move it into a
/// cgroup), waits until it is traced and lets it run; interrupts the tracer once the server
/// exited (these tracers run until interrupted) and returns the report and the truth.
///
/// With `early`, one server is started (and placed) before the tracer and never released:
/// selections by name or cgroup find the probes in the processes that match at the
/// start, so one must. It is in the report's processes, with no pairs; its PID is
/// returned.
fn attach_then_start(
    select: &[&str],
    program: &Path,
    dir: &Path,
    early: bool,
    place: impl Fn(u32),
) -> (Report, Truth, Option<u32>) {
    let early = early.then(|| {
        let server = start_server(program.to_str().unwrap(), &server_args(1, 1, 1, 1, 1));
        place(server.pid);
        server
    });
    let out = dir.join("attach");
    let tracer = Running::start(
        TracerRun::attach()
            .args(select)
            .duration(SAFETY_DURATION)
            .json()
            .out(&out)
            .args(["--latency", PAIR]),
    );
    let server = start_server(program.to_str().unwrap(), &server_args(3, 4, 2, 2, 200));
    place(server.pid);
    wait_until_traced(server.pid, &tracer);
    server.release();
    let truth = Truth::parse(server.finish());
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        tracer.is_running(),
        "with {select:?} the tracer runs until interrupted, also after every process exited"
    );
    tracer.interrupt();
    let report = tracer.finish_json(&out);
    let early_pid = early.map(|server| server.pid);
    (report, truth, early_pid)
}

/// A server started after the tracer, and its children (they run the same executable),
/// are all traced.
fn assert_started_later_traced(report: &Report, truth: &Truth, name: &str, early: Option<u32>) {
    let mut pids = truth.all_pids();
    pids.extend(early);
    assert_processes(report, &pids, name, truth);
    assert_pairs(report, truth, &truth.all_pids(), name);
    assert_threads(report, truth);
}

#[privileged_test]
fn exe_traces_a_server_started_after_the_tracer() {
    require_privileged();
    let dir = out_dir("services-exe");
    let program = executable_copy(SERVER, &dir);
    let (report, truth, early) = attach_then_start(
        &["--exe", program.to_str().unwrap()],
        &program,
        &dir,
        false,
        |_| {},
    );
    assert_started_later_traced(&report, &truth, "forking-server", early);
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn comm_traces_a_server_started_after_the_tracer() {
    require_privileged();
    // A command name of its own (at most 15 bytes, the kernel's comm).
    let dir = out_dir("services-comm");
    let program = executable_copy_as(SERVER, &dir, "fsrv-comm-test");
    let (report, truth, early) =
        attach_then_start(&["--comm", "fsrv-comm-test"], &program, &dir, true, |_| {});
    assert_started_later_traced(&report, &truth, "fsrv-comm-test", early);
    let _ = std::fs::remove_dir_all(dir);
}

fn cgroup_test(hierarchy: &str, name: &str) {
    let dir = out_dir(name);
    let program = executable_copy(SERVER, &dir);
    let cgroup = TestCgroup::create(hierarchy, name);
    let (report, truth, early) = attach_then_start(
        &["--cgroup", cgroup.0.to_str().unwrap()],
        &program,
        &dir,
        true,
        |pid| {
            cgroup.add(pid);
            // A process moved into a cgroup (neither forked nor executed there) joins
            // the targets at the tracer's next look, within 200 ms.
            std::thread::sleep(Duration::from_millis(600));
        },
    );
    assert_started_later_traced(&report, &truth, "forking-server", early);
    drop(cgroup);
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn cgroup_v2_traces_a_server_moved_in_after_the_tracer_started() {
    require_privileged();
    let root = cgroup_v2_root();
    assert!(
        Path::new(root).join("cgroup.procs").exists(),
        "no cgroup v2 hierarchy at {root}"
    );
    cgroup_test(root, "services-cgroup2");
}

#[privileged_test]
fn cgroup_v1_traces_a_server_moved_in_after_the_tracer_started() {
    require_privileged();
    // The pids controller's hierarchy: mounted on every cgroup v1 (and hybrid) system.
    let root = "/sys/fs/cgroup/pids";
    if !Path::new(root).join("cgroup.procs").exists() {
        // A pure cgroup v2 system has no v1 hierarchy: nothing to test.
        eprintln!("skipped: no cgroup v1 hierarchy at {root}");
        return;
    }
    cgroup_test(root, "services-cgroup1");
}
