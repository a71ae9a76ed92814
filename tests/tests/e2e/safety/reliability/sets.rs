//! A set of targets holds the processes that run: children that exited and processes moved
//! out of the cgroup leave it.

use super::*;

/// Ids of the BPF maps process `pid` holds open.
fn map_ids(pid: u32) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap() {
        let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        if let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) {
            ids.insert(id.trim().parse().unwrap());
        }
    }
    ids
}

/// How many entries the `TARGETS` map of tracer `pid` holds now.
fn targets_in_kernel(pid: u32) -> usize {
    for id in map_ids(pid) {
        let out = Command::new("bpftool")
            .args(["--json", "map", "show", "id", &id.to_string()])
            .output()
            .unwrap();
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if info["name"] == "TARGETS" {
            let out = Command::new("bpftool")
                .args(["--json", "map", "dump", "id", &id.to_string()])
                .output()
                .unwrap();
            let entries: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            return entries.as_array().unwrap().len();
        }
    }
    panic!("tracer {pid} holds no TARGETS map")
}

/// The set of targets holds the processes that run, not every one that ever ran: what
/// the tracer does each period (the late probe sites' search, the liveness check) then
/// follows the live processes, not the 500 children that came and went.
#[privileged_test]
fn children_that_exited_leave_the_set_of_targets() {
    require_privileged();
    let mut shell = Command::new("sh")
        .args([
            "-c",
            "echo ready; read go; i=0; while [ $i -lt 500 ]; do /bin/true; i=$((i+1)); done; \
             echo done; read end",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = shell.stdin.take().unwrap();
    let mut output = BufReader::new(shell.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    let dir = out_dir("children-leave");
    let tracer = LiveTracer::start(
        &[
            "attach",
            "--children",
            "--pid",
            &shell.id().to_string(),
            "-o",
            dir.to_str().unwrap(),
        ],
        read_all,
    );
    std::io::Write::write_all(&mut input, b"go\n").unwrap();
    line.clear();
    output.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done");
    // Three looks of the tracker, 200 ms apart, and some room.
    thread::sleep(Duration::from_millis(1500));
    let left = targets_in_kernel(tracer.pid());
    assert!(
        left <= 2,
        "500 children exited, yet the kernel's set holds {left} processes"
    );
    send(tracer.pid(), libc::SIGINT);
    let (status, _, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("Detached from 501 processes"), "{stderr}");
    std::io::Write::write_all(&mut input, b"end\n").unwrap();
    shell.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A process moved out of the `--cgroup` traced is traced no more (its hits are not
/// counted), while the tracer goes on.
#[privileged_test]
fn a_process_moved_out_of_the_cgroup_is_traced_no_more() {
    require_privileged();
    let cgroup = TestCgroup::create(cgroup_v2_root(), "moved-out");
    let target = Target::start(many_sites().to_str().unwrap(), &["--seconds", "30"]);
    cgroup.add(target.pid);
    let events = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = events.clone();
    let tracer = LiveTracer::start(
        &[
            "trace",
            "--format",
            "json",
            "--cgroup",
            cgroup.0.to_str().unwrap(),
            "usdt:*:many:p0",
        ],
        move |out| {
            for _ in out.lines().map_while(Result::ok) {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        },
    );
    target.release();
    thread::sleep(Duration::from_millis(500));
    let before = events.load(std::sync::atomic::Ordering::Relaxed);
    assert!(before > 50, "traced in the cgroup: {before} events");
    let parent = cgroup.0.parent().unwrap().join("cgroup.procs");
    std::fs::write(parent, target.pid.to_string()).unwrap();
    // A look of the tracker (200 ms) and some room.
    thread::sleep(Duration::from_millis(600));
    let moved = events.load(std::sync::atomic::Ordering::Relaxed);
    thread::sleep(Duration::from_secs(1));
    let after = events.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        after,
        moved,
        "hits counted after the target left the cgroup: {} in a second",
        after - moved
    );
    send(tracer.pid(), libc::SIGINT);
    let (status, (), stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    send(target.pid, libc::SIGTERM);
    target.finish();
}
