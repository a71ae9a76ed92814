//! `--children`: the processes a server forks, traced by `attach`, `profile` and `trace`
//! (also in a PID namespace), and without it only the parent.

use super::*;

// ---------------------------------------------------------------------------------------
// --pid --children

#[privileged_test]
fn attach_follows_forked_children_latencies_processes_and_stacks() {
    require_privileged();
    let (n, k) = (3, 5);
    let dir = out_dir("services-children");
    let server = start_server(SERVER, &server_args(n, k, 0, 2, 300));
    let tracer = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args(["--latency", PAIR]),
    );
    server.release();
    let truth = Truth::parse(server.finish());
    let report = tracer.finish_json(&dir);
    assert_eq!(truth.total_pairs, n * k);
    assert_eq!(truth.children.len() as u64, n);

    // With only --pid and --children it stops once the server and its children all exited.
    let stopped_by = report.json["stopped_by"].as_str().unwrap_or("");
    assert!(
        stopped_by.contains("exited"),
        "stopped by {stopped_by:?}, not by the processes' exit\n{}",
        report.context()
    );
    assert_processes(&report, &truth.all_pids(), "forking-server", &truth);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    assert_threads(&report, &truth);
    let _ = std::fs::remove_dir_all(dir);
}

/// A tracer whose own process stalls (stopped here; on a loaded machine, descheduled)
/// from the server's first fork until its children have exited and been reaped reads
/// their stack snapshots only then: their stacks are named from the parent's mappings, of
/// which theirs were a copy.
#[privileged_test]
fn children_gone_before_the_tracer_looked_are_named_from_their_parent() {
    require_privileged();
    let (n, k, block_ms) = (3, 4, 200);
    let dir = out_dir("services-stalled");
    let server = start_server(SERVER, &server_args(n, k, 0, 2, block_ms));
    let tracer = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args(["--latency", PAIR]),
    );
    let tracer_pid = tracer.pid() as i32;
    // SAFETY: kill has no memory preconditions; the tracer is our child, not reaped.
    unsafe { libc::kill(tracer_pid, libc::SIGSTOP) };
    server.release();
    std::thread::sleep(std::time::Duration::from_millis(block_ms + 300));
    // SAFETY: as above.
    unsafe { libc::kill(tracer_pid, libc::SIGCONT) };
    let truth = Truth::parse(server.finish());
    let report = tracer.finish_json(&dir);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    let _ = std::fs::remove_dir_all(dir);
}

/// The forking server and the tracer both in a new PID namespace (as in a container
/// without `--pid=host`): the tracer takes and prints the namespace's PIDs, follows the
/// forks by them, and counts every pair, by process, as the server numbers them.
#[privileged_test]
fn in_a_pid_namespace_of_its_own_a_service_is_traced_by_the_namespaces_pids() {
    require_privileged();
    let dir = out_dir("services-pidns");
    let args = server_args(3, 4, 1, 2, 200).join(" ");
    let script = format!(
        r"set -u
        d={dir}
        {SERVER} {args} --wait-for-signal > $d/server.out &
        s=$!
        until grep -q '^ready' $d/server.out; do sleep 0.02; done
        {tracer} attach --pid $s --children --format json -o $d/attach --latency {PAIR} \
            -d {SAFETY_DURATION} > $d/report.json 2> $d/tracer.err &
        t=$!
        until grep -q '^Attached' $d/tracer.err; do kill -0 $t || exit 1; sleep 0.02; done
        kill -USR1 $s
        wait $s
        wait $t",
        dir = dir.display(),
        tracer = tracer_bin().display(),
    );
    let status = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .status()
        .expect("cannot run unshare");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    assert!(
        status.success(),
        "the run in a new PID namespace failed ({status})
tracer stderr:
{}",
        read("tracer.err")
    );
    let server_out = read("server.out");
    let truth_line = server_out.lines().last().unwrap_or_default();
    let truth = Truth::parse(
        serde_json::from_str(truth_line).unwrap_or_else(|e| panic!("{e}: {server_out}")),
    );
    let report = Report {
        json: serde_json::from_str(&read("report.json"))
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", read("report.json"), read("tracer.err"))),
        stderr: read("tracer.err"),
        dir: dir.join("attach"),
    };
    // The server is the first process of the namespace after the shell: a small number,
    // not a host PID.
    assert!(
        truth.pid < 100,
        "the server's pid in its namespace: {}",
        truth.pid
    );
    assert_eq!(report.json["pid"], truth.pid, "{}", report.context());
    assert_processes(&report, &truth.all_pids(), "forking-server", &truth);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    assert_threads(&report, &truth);
    let _ = std::fs::remove_dir_all(dir);
}

/// From the host, a server in a PID namespace below (a container's) is traced by its
/// host PIDs, and the report gives each process's PID in its own namespace beside them.
#[privileged_test]
fn from_the_host_processes_in_a_pid_namespace_show_their_namespace_pids() {
    require_privileged();
    let dir = out_dir("services-host-into-ns");
    let mut args = vec!["--pid", "--fork", "--kill-child", SERVER];
    let server_args = server_args(2, 3, 0, 2, 100);
    args.extend(server_args.iter().map(String::as_str));
    args.push("--wait-for-signal");
    let mut unshare = std::process::Command::new("unshare")
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run unshare");
    let mut stdout = std::io::BufReader::new(unshare.stdout.take().unwrap());
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut ready).unwrap();
    assert_eq!(
        ready.trim(),
        "ready pid=1",
        "the server is its namespace's first process"
    );
    let host_pid = *children_of(unshare.id())
        .iter()
        .next()
        .expect("unshare's child, the server");
    let out = dir.join("attach");
    let tracer = Running::start(
        TracerRun::attach()
            .pid(host_pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&out),
    );
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(host_pid as i32, libc::SIGUSR1) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let _ = unshare.wait();
    let truth =
        Truth::parse(serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{e}: {rest}")));
    let report = tracer.finish_json(&out);
    let processes = report.json["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let server = processes
        .iter()
        .find(|p| p["pid"] == host_pid)
        .unwrap_or_else(|| panic!("the server {host_pid} is not traced\n{}", report.context()));
    assert_eq!(server["namespace_pid"], 1, "{}", report.context());
    // The children, by the PIDs the server saw them with.
    let inner: BTreeSet<u32> = processes
        .iter()
        .filter(|p| p["pid"] != host_pid)
        .filter_map(|p| p["namespace_pid"].as_u64().map(|n| n as u32))
        .collect();
    assert_eq!(inner, truth.child_pids(), "{}", report.context());
    let _ = std::fs::remove_dir_all(dir);
}

/// `tracer profile --pid SERVER --children EXTRA -o DIR` over a run of the server with
/// `server_args`: the server's truth, and the tracer's standard output and error.
fn profile_server(dir: &Path, server_args: &[String], extra: &[&str]) -> (Truth, String, String) {
    let server = start_server(SERVER, server_args);
    let tracer = Running::start(
        TracerRun::profile()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .out(dir)
            .args(extra),
    );
    server.release();
    let truth = Truth::parse(server.finish());
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "tracer profile failed:\n{stderr}\n{out}");
    (truth, out, stderr)
}

#[privileged_test]
fn profile_follows_forked_children() {
    require_privileged();
    let dir = out_dir("services-profile");
    let (truth, out, stderr) = profile_server(&dir, &server_args(2, 3, 0, 2, 300), &[]);
    let report = Report {
        json: Value::Null,
        stderr: format!("{stderr}\nstdout:\n{out}"),
        dir: dir.clone(),
    };
    assert_folded_per_process(&report, &truth, "forking-server");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--group-by name`: the server and its forked children run one program, so every
/// stack is under one root frame, the program's name, and the children's blocked time
/// adds up there.
#[privileged_test]
fn profile_grouped_by_name_puts_a_server_and_its_children_in_one_tower() {
    require_privileged();
    let dir = out_dir("services-profile-by-name");
    let server_args = server_args(3, 2, 0, 2, 300);
    let (truth, _, _) = profile_server(&dir, &server_args, &["--group-by", "name"]);
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    let roots: BTreeSet<&str> = wall
        .lines()
        .filter(|l| !l.is_empty())
        .map(root_frame)
        .collect();
    assert_eq!(
        roots,
        BTreeSet::from(["forking-server"]),
        "one tower for the server and its children:\n{wall}"
    );
    let blocked = folded_weight_where(&wall, |stack| {
        has_frame(stack, "forking_server::child_blocks_in_read")
    }) as f64;
    let true_us = truth.children.iter().map(|c| c.blocked_ns).sum::<u64>() as f64 / 1000.0;
    assert!(
        blocked >= 0.8 * true_us && blocked <= 1.2 * true_us,
        "the children blocked {blocked} us in child_blocks_in_read, their clocks say {true_us} us\n{wall}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn trace_count_with_children_counts_what_bpftrace_and_the_server_count() {
    require_privileged();
    // A copy of its own: bpftrace counts by path, every process that runs the file, and
    // other tests run the original at the same time.
    let dir = out_dir("services-count");
    let program = executable_copy(SERVER, &dir);
    let server = start_server(program.to_str().unwrap(), &server_args(4, 6, 3, 1, 50));
    let tracer = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .args(["usdt:*:tracer:gc__begin", "usdt:*:tracer:gc__end"]),
    );
    let bpftrace = server_bpftrace(&program);
    server.release();
    let truth = Truth::parse(server.finish());
    let (counts, output) = tracer.finish_counts();
    let bt = bpftrace.stop();
    eprintln!("bpftrace:\n{}\nserver: {}", bt.text, truth.json);

    assert_eq!(truth.total_pairs, 4 * 6 + 3);
    assert_bpftrace_saw_everything(&bt, &truth);
    for probe in [BEGIN, END] {
        assert_eq!(
            counts.get(probe),
            Some(&truth.total_pairs),
            "{probe}: tracer {counts:?}, bpftrace @begin {} @end {}, server {}\n{output}",
            bt.int("begin"),
            bt.int("end"),
            truth.json
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn without_children_only_the_parents_hits_count() {
    require_privileged();
    let dir = out_dir("services-no-children");
    let program = executable_copy(SERVER, &dir);
    let parent_pairs = 3;
    let server = start_server(
        program.to_str().unwrap(),
        &server_args(3, 4, parent_pairs, 1, 100),
    );
    let out = dir.join("attach");
    let attach = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .duration(SAFETY_DURATION)
            .json()
            .out(&out)
            .args(["--latency", PAIR]),
    );
    let count = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(server.pid)
            .duration(SAFETY_DURATION)
            .args(["usdt:*:tracer:gc__begin", "usdt:*:tracer:gc__end"]),
    );
    // bpftrace, by path, sees the children fire while the tracers are attached.
    let bpftrace = server_bpftrace(&program);
    server.release();
    let truth = Truth::parse(server.finish());
    let report = attach.finish_json(&out);
    let (counts, output) = count.finish_counts();
    let bt = bpftrace.stop();

    assert_bpftrace_saw_everything(&bt, &truth);
    let server_only = BTreeSet::from([truth.pid]);
    let name = program.file_name().unwrap().to_str().unwrap();
    assert_processes(&report, &server_only, name, &truth);
    assert_pairs(&report, &truth, &server_only, name);
    for probe in [BEGIN, END] {
        assert_eq!(
            counts.get(probe),
            Some(&parent_pairs),
            "{probe}: only the server's own {parent_pairs} pairs, not its children's \
             (bpftrace counted {} in all)\n{output}",
            bt.int("begin")
        );
    }
    for file in ["wallclock.folded", "offcpu.folded"] {
        let folded = report.folded(file);
        assert!(
            !folded.contains("forking_server::child_blocks_in_read"),
            "{file}: a child's stack, without --children\n{folded}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
