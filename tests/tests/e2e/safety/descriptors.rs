//! The tracer's own file descriptors (issue 36): a service that starts many short-lived
//! processes must not run the tracer out of them. It keeps one descriptor per distinct
//! file mapped, not one per process, and running out never reads as the target exiting.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crate::common::*;

/// Rounds of the spawning parent: each runs `/bin/true`, then `/bin/sleep` for long
/// enough that the tracer captures that child's mappings.
const ROUNDS: usize = 600;

/// The tracer's open-file limit (soft and hard): far below one descriptor per process.
const FD_LIMIT: libc::rlim_t = 256;

/// Descriptors the tracer may open while the children run, over those it held once
/// attached: a few new files (`true`, `sleep`) and passing reads of /proc.
const FD_GROWTH_ALLOWED: usize = 32;

/// How many descriptors process `pid` has open now.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, std::iter::Iterator::count)
}

/// Sends each line `reader` gives to the returned channel, until it closes.
fn lines_of(reader: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

#[privileged_test]
fn children_of_a_service_cost_descriptors_per_file_not_per_process() {
    require_privileged();
    let dir = out_dir("descriptors-children");
    // Waits for a line before it starts its children, and for another before it exits.
    let script = format!(
        "read go; i=0; while [ $i -lt {ROUNDS} ]; do /bin/true; /bin/sleep 0.005; \
         i=$((i + 1)); done; echo spawned; read done"
    );
    let mut parent = Command::new("/bin/sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start /bin/sh");
    let parent_said = lines_of(parent.stdout.take().unwrap());
    let parent_pid = parent.id().to_string();

    let mut command = Command::new(tracer_bin());
    command
        .args(["attach", "--children", "--pid", &parent_pid])
        .args(["--format", "json", "-o", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of ours but `limit`.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: FD_LIMIT,
                rlim_max: FD_LIMIT,
            };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let mut tracer = command.spawn().expect("cannot start tracer");
    let tracer_pid = tracer.id();
    let mut stdout = tracer.stdout.take().unwrap();
    let report = thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let tracer_said = lines_of(tracer.stderr.take().unwrap());
    let mut stderr = String::new();
    loop {
        let line = tracer_said
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("tracer did not attach ({e}): {stderr}"));
        stderr.push_str(&line);
        stderr.push('\n');
        if line.starts_with("Attached") {
            break;
        }
    }
    let attached_fds = open_descriptors(tracer_pid);

    writeln!(parent.stdin.as_mut().unwrap(), "go").unwrap();
    let started = Instant::now();
    let mut most_fds = attached_fds;
    loop {
        most_fds = most_fds.max(open_descriptors(tracer_pid));
        if let Some(status) = tracer.try_wait().unwrap() {
            stderr.extend(tracer_said.try_iter().map(|l| l + "\n"));
            panic!(
                "tracer stopped while the children ran ({status}), with at most {most_fds} \
                 descriptors open: {stderr}"
            );
        }
        match parent_said.recv_timeout(Duration::from_millis(50)) {
            Ok(line) if line == "spawned" => break,
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(e) => panic!("the parent ended before its children were done: {e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the parent took over two minutes to start {ROUNDS} rounds of children"
        );
    }
    // What a process that exited took must be given back: give the tracer's once-a-second
    // look at its processes the time to notice.
    thread::sleep(Duration::from_millis(1500));
    let settled_fds = open_descriptors(tracer_pid);
    most_fds = most_fds.max(settled_fds);
    assert!(
        tracer.try_wait().unwrap().is_none(),
        "tracer stopped after the children ran: {stderr}"
    );

    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(tracer_pid as i32, libc::SIGINT) }, 0);
    let status = tracer.wait().unwrap();
    stderr.extend(tracer_said.iter().map(|l| l + "\n"));
    let out = report.join().unwrap();
    drop(parent.stdin.take());
    let _ = parent.wait();

    eprintln!(
        "tracer descriptors: {attached_fds} once attached, at most {most_fds} while \
         {ROUNDS} rounds of children ran, {settled_fds} after"
    );
    assert!(status.success(), "tracer failed ({status}): {stderr}");
    assert!(
        !stderr.contains("target exited"),
        "the service still ran: {stderr}"
    );
    assert!(
        stderr.contains("Stopped: interrupted (SIGINT)"),
        "no stop on SIGINT: {stderr}"
    );
    let followed: usize = stderr
        .split("Detached from ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `Detached from N processes`: {stderr}"));
    assert!(
        followed >= 2 * ROUNDS,
        "followed {followed} processes of the {} the parent started: {stderr}",
        2 * ROUNDS
    );
    assert!(
        most_fds <= attached_fds + FD_GROWTH_ALLOWED,
        "descriptors grew with the processes: {attached_fds} once attached, at most \
         {most_fds} while {} children ran",
        2 * ROUNDS
    );
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("no JSON report ({e}): {out}"));
    assert!(report.is_object(), "{out}");
}
