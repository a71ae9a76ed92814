//! Error messages of the right class (issue 12, case 6), each with exit code 1 and no
//! panic: a target that exits while the tracer attaches is "process N exited", never a
//! kernel feature missing; a low open-file limit names `ulimit -n` and its value; a live
//! process that /proc hides (the hidepid mount option) is said to be hidden, not gone.

use std::{
    io::{BufRead as _, BufReader},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{fs::PermissionsExt as _, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;

const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// gc-demo waiting for SIGUSR1 (it never gets it), killed and reaped when dropped.
struct Victim {
    child: Child,
    pid: u32,
}

impl Victim {
    /// Starts it and returns once it is ready.
    fn start() -> Self {
        Self::start_program(Path::new(GC_DEMO))
    }

    /// Starts `program`, a copy of gc-demo, and returns once it is ready.
    fn start_program(program: &Path) -> Self {
        let mut child = Command::new(program)
            .arg("--wait-for-signal")
            .stdout(Stdio::piped())
            .spawn()
            .expect("cannot start gc-demo");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .unwrap()
            .parse()
            .unwrap();
        Self { child, pid }
    }

    /// Kills it and waits until it is gone (`reap`) or a zombie.
    fn kill(&mut self, reap: bool) {
        self.child.kill().unwrap();
        if reap {
            self.child.wait().unwrap();
            return;
        }
        let stat = format!("/proc/{}/stat", self.pid);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&stat)
            .unwrap()
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
        {
            assert!(
                Instant::now() < deadline,
                "{} never became a zombie",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the run failed with exit code 1, said `expected`, and did not panic.
fn assert_fails_with(out: &Output, expected: &str, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(
        err.contains(expected),
        "{what}: expected {expected:?} in: {err}"
    );
    assert!(!err.contains("kernel feature missing"), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

/// Holds opens of some files by one process until let go (fanotify permission events),
/// and lets everyone else's through at once: a test can then act at a known point of the
/// tracer's start.
struct OpenGate {
    fd: OwnedFd,
    /// The files watched, as (device, inode).
    files: Vec<(u64, u64)>,
}

/// An open held by [`OpenGate::hold`]; dropping it lets the open proceed.
struct HeldOpen<'a> {
    gate: &'a OpenGate,
    event_fd: i32,
}

impl Drop for HeldOpen<'_> {
    fn drop(&mut self) {
        self.gate.allow(self.event_fd);
    }
}

/// The (device, inode) of the file at `path`, following links.
fn file_id(path: impl AsRef<Path>) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

impl OpenGate {
    /// Watches opens of `paths`. Every open of them by anyone waits until the gate reads
    /// it (in [`Self::hold`] or [`Self::allow_until`]): start a process that opens one (a
    /// program that execs one) before.
    fn new(paths: &[&str]) -> Self {
        // SAFETY: plain syscalls; the path is NUL-terminated.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC,
                (libc::O_RDONLY | libc::O_CLOEXEC) as u32,
            )
        };
        assert!(
            fd >= 0,
            "fanotify_init: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fanotify_init returned a new fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut files = Vec::new();
        for path in paths {
            files.push(file_id(path).unwrap());
            let path = std::ffi::CString::new(*path).unwrap();
            // SAFETY: as above.
            let rc = unsafe {
                libc::fanotify_mark(
                    fd.as_raw_fd(),
                    libc::FAN_MARK_ADD,
                    libc::FAN_OPEN_PERM,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                )
            };
            assert_eq!(rc, 0, "fanotify_mark: {}", std::io::Error::last_os_error());
        }
        Self { fd, files }
    }

    fn allow(&self, event_fd: i32) {
        let response = libc::fanotify_response {
            fd: event_fd,
            response: libc::FAN_ALLOW,
        };
        // SAFETY: writes one fanotify_response; closes the event's fd, ours.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const response).cast(),
                std::mem::size_of::<libc::fanotify_response>(),
            );
            libc::close(event_fd);
        }
    }

    /// The open events that arrive within `timeout_ms` (none if none did).
    fn events(&self, timeout_ms: i32) -> Vec<libc::fanotify_event_metadata> {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&raw mut poll, 1, timeout_ms) } <= 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; 4096];
        // SAFETY: reads into buf, of the length given.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(
            n > 0,
            "reading fanotify: {}",
            std::io::Error::last_os_error()
        );
        let mut events = Vec::new();
        let mut at = 0;
        while at + std::mem::size_of::<libc::fanotify_event_metadata>() <= n as usize {
            // SAFETY: the kernel wrote whole event records; read_unaligned copes with any
            // alignment.
            let event: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
            at += event.event_len as usize;
            if event.fd >= 0 {
                events.push(event);
            }
        }
        events
    }

    /// Waits for process `pid` to open each watched file, letting other processes' opens
    /// (and its later opens of a file held) through, and returns with the first open of
    /// each held, in the order of the paths given; `None` if `pid` did not open them all
    /// before `timeout` or while `alive` says it runs.
    fn hold(
        &self,
        pid: u32,
        timeout: Duration,
        mut alive: impl FnMut() -> bool,
    ) -> Option<Vec<HeldOpen<'_>>> {
        let deadline = Instant::now() + timeout;
        let mut held: Vec<Option<HeldOpen>> = self.files.iter().map(|_| None).collect();
        while held.iter().any(Option::is_none) {
            if Instant::now() >= deadline || !alive() {
                return None;
            }
            for event in self.events(50) {
                let file = file_id(format!("/proc/self/fd/{}", event.fd)).ok();
                let slot = self.files.iter().position(|f| Some(*f) == file);
                match slot.map(|i| &mut held[i]) {
                    Some(slot @ None) if event.pid as u32 == pid => {
                        *slot = Some(HeldOpen {
                            gate: self,
                            event_fd: event.fd,
                        });
                    }
                    _ => self.allow(event.fd),
                }
            }
        }
        Some(held.into_iter().flatten().collect())
    }

    /// Lets every open through until `done` says so (true) or `timeout` passes (false).
    fn allow_until(&self, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            for event in self.events(1) {
                self.allow(event.fd);
            }
        }
        false
    }
}

/// A check that thread `tid` has slept on a futex for `long` without a break, for each
/// look at it.
fn parked_on_futex(tid: u32, long: Duration) -> impl FnMut() -> bool {
    let wchan = format!("/proc/{tid}/task/{tid}/wchan");
    let mut since = None;
    move || {
        let parked = std::fs::read_to_string(&wchan).is_ok_and(|w| w.starts_with("futex"));
        match (parked, since) {
            (false, _) => since = None,
            (true, None) => since = Some(Instant::now()),
            (true, Some(at)) => return at.elapsed() >= long,
        }
        false
    }
}

/// Starts `tracer COMMAND --pid PID` and kills the target (reaped or left a zombie) at a
/// known point: the tracer has found it and scanned it, and waits for kernel BTF (its
/// read held here) to read the target's start time. Returns the tracer's output.
fn exit_while_loading(command: &str, reap: bool) -> (u32, Output) {
    let dir = out_dir(&format!("exit-{command}"));
    // A copy of its own: the gate holds every open of the file, and the other tests,
    // running beside this one, start gc-demo too. Their children, forked while the gate
    // is open, share its descriptor until they exec, so one whose exec waited for it
    // would wait forever.
    let program = executable_copy(GC_DEMO, &dir);
    let mut target = Victim::start_program(&program);
    let pid = target.pid;
    let gate = OpenGate::new(&[KERNEL_BTF, program.to_str().unwrap()]);
    let mut tracer = Command::new(tracer_bin())
        .args([command, "--pid", &pid.to_string(), "--duration", "5s", "-o"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tracer_pid = tracer.id();
    let held = gate.hold(tracer_pid, Duration::from_secs(60), || {
        Path::new(&format!("/proc/{tracer_pid}")).exists()
            && tracer.try_wait().ok().flatten().is_none()
    });
    let Some([kernel_btf, executable]) = held.and_then(|h| <[_; 2]>::try_from(h).ok()) else {
        panic!("{command}: the tracer never opened both {KERNEL_BTF} and its target");
    };
    // It opened the target's executable: it found the target, and scans it now. The load
    // then waits for the kernel types (a thread of its own reads them from the start),
    // on a futex while we hold them; it reads the target's start time right after. Other
    // waits of its main thread's start end by themselves within milliseconds.
    drop(executable);
    assert!(
        gate.allow_until(
            Duration::from_secs(60),
            parked_on_futex(tracer_pid, Duration::from_millis(300))
        ),
        "{command}: the tracer never waited for kernel BTF"
    );
    target.kill(reap);
    drop(kernel_btf);
    drop(gate);
    (pid, tracer.wait_with_output().unwrap())
}

/// A target that exits while `attach` or `profile` loads (after it was found, before
/// tracing starts), reaped or still a zombie: "process N exited", every time (it was
/// "kernel feature missing: cannot read the start time of process N", or a uprobe error).
#[privileged_test]
fn a_target_that_exits_while_the_tracer_loads_is_reported_as_exited() {
    require_privileged();
    for command in ["attach", "profile"] {
        for reap in [true, false] {
            for _ in 0..3 {
                let (pid, out) = exit_while_loading(command, reap);
                let what = format!(
                    "{command}, target {}",
                    if reap { "reaped" } else { "a zombie" }
                );
                assert_fails_with(
                    &out,
                    &format!("tracer: error: process {pid} exited\n"),
                    &what,
                );
            }
        }
    }
}

/// A target that has exited but is not reaped yet (a zombie: its PID still there, its
/// /proc entries mostly not): "process N exited" from every command that takes a PID (it
/// was "cannot read /proc/N/exe: No such file or directory").
#[privileged_test]
fn a_zombie_target_is_reported_as_exited_by_every_command() {
    require_privileged();
    let mut target = Victim::start();
    let pid = target.pid;
    target.kill(false);
    let pid_arg = pid.to_string();
    let dir = out_dir("zombie");
    let dir = dir.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["attach", "--pid", &pid_arg, "-o", dir],
        &["profile", "--pid", &pid_arg, "-o", dir],
        &["trace", "--pid", &pid_arg, "usdt:*:tracer:gc__begin"],
        &["list", "--pid", &pid_arg],
    ];
    for args in commands {
        let out = Command::new(tracer_bin()).args(args).output().unwrap();
        assert_fails_with(
            &out,
            &format!("tracer: error: process {pid} exited\n"),
            args[0],
        );
    }
}

/// A target killed at various points of the tracer's start: whatever the tracer was doing
/// then, it either says the process exited (or that there is none, when it was gone
/// before the tracer looked) or traces it until "target exited"; never anything else.
#[privileged_test]
fn a_target_killed_at_any_point_of_the_start_is_never_misreported() {
    require_privileged();
    let mut exited = 0;
    for command in ["attach", "profile", "trace"] {
        for delay_ms in [0, 1, 2, 5, 10, 20, 40] {
            let mut target = Victim::start();
            let pid = target.pid;
            let pid_arg = pid.to_string();
            let dir = out_dir(&format!("killed-{command}"));
            let mut args = vec![command, "--pid", &pid_arg, "--duration", "10s"];
            match command {
                "trace" => args.push("usdt:*:tracer:gc__begin"),
                _ => args.extend(["-o", dir.to_str().unwrap()]),
            }
            let tracer = Command::new(tracer_bin())
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(delay_ms));
            target.kill(true);
            let out = tracer.wait_with_output().unwrap();
            let err = stderr(&out);
            let what = format!("{command} killed after {delay_ms} ms: {err}");
            assert!(!err.contains("panicked"), "{what}");
            if out.status.success() {
                assert!(err.contains("Stopped: target exited"), "{what}");
                continue;
            }
            assert_eq!(out.status.code(), Some(1), "{what}");
            let line = err.lines().last().unwrap_or_default();
            assert!(
                line == format!("tracer: error: process {pid} exited")
                    || line == format!("tracer: error: no such process: {pid}"),
                "{what}"
            );
            exited += 1;
        }
    }
    eprintln!("{exited} of 21 starts failed with the target gone, the others traced it");
}

/// Starts the tracer with at most `limit` open files (soft and hard, as `ulimit -n` sets
/// them).
fn run_with_open_file_limit(limit: u64, args: &[&str]) -> Output {
    let mut command = Command::new(tracer_bin());
    command.args(args);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        command.pre_exec(move || {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &raw const rlimit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    command.output().unwrap()
}

/// With `ulimit -n` too low for its maps, programs and perf events, each command says the
/// open-file limit is too low, with its value (it was "kernel feature missing: map
/// CONTROL: Too many open files", or "loading the eBPF programs failed").
#[privileged_test]
fn a_low_open_file_limit_is_named() {
    require_privileged();
    let target = Victim::start();
    let pid_arg = target.pid.to_string();
    let dir = out_dir("nofile");
    let dir = dir.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &["attach", "--pid", &pid_arg, "--duration", "1s", "-o", dir],
        &["profile", "--pid", &pid_arg, "--duration", "1s", "-o", dir],
        &[
            "trace",
            "--pid",
            &pid_arg,
            "--duration",
            "1s",
            "usdt:*:tracer:gc__begin",
        ],
    ];
    for args in commands {
        for limit in [16, 24] {
            let out = run_with_open_file_limit(limit, args);
            assert_fails_with(
                &out,
                &format!(
                    ": too many open files: the open-file limit is too low for tracer \
                     (ulimit -n is {limit}, the hard limit too); raise it, e.g. `ulimit -n \
                     4096`, and run tracer again\n"
                ),
                &format!("{} with ulimit -n {limit}", args[0]),
            );
        }
    }
}

/// A copy of the tracer that `nobody` can run whatever the permissions of the checkout.
fn public_tracer() -> PathBuf {
    let dir = out_dir("public-tracer");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = executable_copy(tracer_bin().to_str().unwrap(), &dir);
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// A process of root's, while the tracer runs as `nobody` with CAP_BPF and CAP_PERFMON in
/// a mount namespace of its own whose /proc is mounted with `options` (hidepid): every
/// command says /proc hides the process, how it is mounted and what to do (it was
/// "process N exited" or "no such process: N"). Root would see through hidepid.
#[privileged_test]
fn a_process_hidden_by_hidepid_is_said_to_be_hidden() {
    require_privileged();
    let tracer = public_tracer();
    let target = Victim::start();
    let pid = target.pid;
    let pid_arg = pid.to_string();
    let dir = out_dir("hidepid");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let dir = dir.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["attach", "--pid", &pid_arg, "--duration", "1s", "-o", dir],
        &["profile", "--pid", &pid_arg, "--duration", "1s", "-o", dir],
        &[
            "trace",
            "--pid",
            &pid_arg,
            "--duration",
            "1s",
            "usdt:*:tracer:gc__begin",
        ],
        &["list", "--pid", &pid_arg],
    ];
    for (options, shown) in [
        ("hidepid=invisible", "(mounted with hidepid=invisible)"),
        ("hidepid=2", "(mounted with hidepid=invisible)"),
        (
            "hidepid=noaccess,gid=4242",
            "(mounted with gid=4242,hidepid=noaccess)",
        ),
    ] {
        for args in commands {
            let script = format!(
                "mount -t proc -o {options} proc /proc && exec setpriv --reuid=65534 \
                 --regid=65534 --clear-groups --inh-caps=+bpf,+perfmon \
                 --ambient-caps=+bpf,+perfmon \"$0\" \"$@\""
            );
            let out = Command::new("unshare")
                .args(["--mount", "--fork", "sh", "-c", &script])
                .arg(&tracer)
                .args(args)
                .output()
                .expect("unshare and setpriv (util-linux) are needed");
            let group = match options.contains("gid=") {
                true => "as a member of group 4242 (/proc's gid= option)\n",
                false => "as a member of the group given by /proc's gid= mount option\n",
            };
            let what = format!("{} with {options}", args[0]);
            assert_fails_with(
                &out,
                &format!(
                    "tracer: error: process {pid} is running, but /proc hides it from tracer \
                     {shown}: remount /proc with `mount -o remount,hidepid=0 /proc`, or run \
                     tracer as root, with CAP_SYS_PTRACE, or {group}"
                ),
                &what,
            );
        }
    }
}

/// A timeline that cannot be written fails before anything is attached, naming the file
/// and why; the target is untouched.
#[privileged_test]
fn an_unwritable_timeline_is_refused_before_attaching() {
    require_privileged();
    let target = Victim::start();
    let pid = target.pid.to_string();
    let dir = out_dir("timeline-refused");
    let missing = dir.join("no/such/dir/timeline.json");
    let cases = [
        (
            missing.clone(),
            format!(
                "cannot write {}: No such file or directory",
                missing.display()
            ),
        ),
        (
            dir.clone(),
            format!(
                "cannot write {}: it is a link or not a regular file",
                dir.display()
            ),
        ),
    ];
    for (path, expected) in cases {
        let out = Command::new(tracer_bin())
            .args(["attach", "--pid", &pid, "-o"])
            .arg(dir.join("out"))
            .arg("--timeline")
            .arg(&path)
            .output()
            .unwrap();
        assert_fails_with(&out, &expected, "attach --timeline");
        assert!(!stderr(&out).contains("Attached"), "{}", stderr(&out));
    }
    assert!(!missing.exists());
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `program` (a copy of many-threads) with `threads` workers that sleep for
/// minutes, and returns once every thread exists.
fn start_many_threads(program: &Path, threads: usize) -> Victim {
    let mut child = Command::new(program)
        .args(["--threads", &threads.to_string()])
        .args(["--sleeps", "3000", "--sleep-ms", "100", "--wait-for-signal"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start many-threads");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line
        .trim()
        .strip_prefix("ready pid=")
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let task = format!("/proc/{pid}/task");
    while std::fs::read_dir(&task).map_or(0, Iterator::count) < threads + 1 {
        assert!(
            Instant::now() < deadline,
            "many-threads never had its threads"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Victim { child, pid }
}

/// Asserts that `tracer stacks` failed because process `pid` exited while it read it,
/// printing what it had read, if anything, marked partial.
fn assert_said_exited_while_read(out: &Output, pid: u32, what: &str) {
    let err = stderr(out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}\n{stdout}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    let said = format!("tracer: error: process {pid} exited while being read");
    assert!(err.contains(&said), "{what}: expected {said:?} in: {err}");
    assert_eq!(err.matches("tracer: error:").count(), 1, "{what}: {err}");
    if let Some(first) = stdout.lines().next() {
        assert!(
            first.ends_with(" (partial: the process exited while being read)"),
            "{what}: {first}"
        );
        assert!(err.contains("the dump printed is partial"), "{what}: {err}");
    }
}

/// `tracer stacks` of a process killed (reaped, or left a zombie) after its threads were
/// read and before their stacks were named: the tracer holds at its first open of the
/// process's executable, which names its frames. It prints what it read, marked partial,
/// says the process exited while being read, and exits with 1 (it printed the threads
/// without their user stacks and exited with 0).
#[privileged_test]
fn stacks_of_a_process_killed_while_being_read_is_marked_partial_and_fails() {
    require_privileged();
    for reap in [true, false] {
        let dir = out_dir(&format!("stacks-killed-{reap}"));
        // A copy of its own, as in `exit_while_loading`: the gate holds every open of it.
        let program = executable_copy(MANY_THREADS, &dir);
        let mut target = start_many_threads(&program, 20);
        let pid = target.pid;
        let gate = OpenGate::new(&[program.to_str().unwrap()]);
        let mut tracer = Command::new(tracer_bin())
            .args(["stacks", "--pid", &pid.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let tracer_pid = tracer.id();
        let alive = || tracer.try_wait().ok().flatten().is_none();
        let Some(held) = gate.hold(tracer_pid, Duration::from_secs(60), alive) else {
            let out = tracer.wait_with_output().unwrap();
            panic!(
                "the tracer never opened {}: {}",
                program.display(),
                stderr(&out)
            );
        };
        target.kill(reap);
        drop(held);
        drop(gate);
        let out = tracer.wait_with_output().unwrap();
        let what = format!("target {}", if reap { "reaped" } else { "a zombie" });
        assert_said_exited_while_read(&out, pid, &what);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.starts_with(&format!(
                "Process {pid} \"many-threads\": 21 threads (partial"
            )),
            "{what}: {stdout}"
        );
    }
}

/// Whether `dump`, the text of `tracer stacks` of many-threads with `threads` workers,
/// is whole: every thread, each sleeping worker with a user stack. (Its stack may stop
/// early: a worker that ran between the reading of its frame pointer and that of its
/// stack stops at the first frame built with frame pointers. One on a CPU when read has
/// a sample's stack, or none.) A dump cut short by the target's exit lacks threads, or
/// user stacks.
fn is_whole_dump(dump: &str, pid: u32, threads: usize) -> bool {
    let sections: Vec<&str> = dump.split("\nThread ").skip(1).collect();
    let has_user_frame = |section: &&str| {
        section
            .lines()
            .skip(1)
            .any(|frame| frame.starts_with("    ") && !frame.ends_with("_[k]"))
    };
    dump.starts_with(&format!(
        "Process {pid} \"many-threads\": {} threads\n",
        threads + 1
    )) && sections.len() == threads + 1
        && sections
            .iter()
            .filter(|section| {
                let head = section.lines().next().unwrap_or_default();
                head.contains("\"worker-") && head.contains("\": sleeping")
            })
            .all(has_user_frame)
}

/// `tracer stacks` of a process killed at moments spread over the time it takes: each
/// run either printed every thread with its stack and exited with 0, or said the process
/// exited (while being read, or before it was looked at) and exited with 1, what it
/// printed marked partial. It printed a partial dump and exited with 0.
#[privileged_test]
fn stacks_of_a_process_killed_at_any_moment_is_whole_or_said_partial() {
    require_privileged();
    const THREADS: usize = 200;
    const RUNS: u32 = 12;
    let dump_path = out_dir("stacks-killed-any").join("dump");
    let stacks_of = |pid: u32| {
        Command::new(tracer_bin())
            .args(["stacks", "--pid", &pid.to_string()])
            // A file, not a pipe: the dump is more than a pipe holds, and nothing reads it
            // until the target is killed.
            .stdout(std::fs::File::create(&dump_path).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let finish = |tracer: Child| {
        let mut out = tracer.wait_with_output().unwrap();
        out.stdout = std::fs::read(&dump_path).unwrap();
        out
    };
    let program = Path::new(MANY_THREADS);
    let whole = {
        let target = start_many_threads(program, THREADS);
        let started = Instant::now();
        let out = finish(stacks_of(target.pid));
        let took = started.elapsed();
        let dump = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            is_whole_dump(&dump, target.pid, THREADS),
            "{}\n{dump}",
            stderr(&out)
        );
        took
    };
    let mut exited_while_read = 0;
    for run in 0..RUNS {
        let mut target = start_many_threads(program, THREADS);
        let pid = target.pid;
        let tracer = stacks_of(pid);
        std::thread::sleep(whole * run / RUNS);
        target.kill(true);
        let out = finish(tracer);
        let err = stderr(&out);
        let dump = String::from_utf8_lossy(&out.stdout);
        let what = format!("killed after {:?} of {whole:?}", whole * run / RUNS);
        assert!(!err.contains("panicked"), "{what}: {err}");
        if out.status.success() {
            assert!(is_whole_dump(&dump, pid, THREADS), "{what}: {err}\n{dump}");
            continue;
        }
        let last = err.lines().last().unwrap_or_default();
        if last == format!("tracer: error: no such process: {pid}")
            || last == format!("tracer: error: process {pid} exited")
        {
            assert_eq!(out.status.code(), Some(1), "{what}: {err}");
            assert!(dump.is_empty(), "{what}: {dump}");
            continue;
        }
        assert_said_exited_while_read(&out, pid, &what);
        exited_while_read += 1;
    }
    eprintln!("{exited_while_read} of {RUNS} runs saw the target exit while reading it");
}

/// `tracer attach` and `profile` under an address-space limit (`ulimit -v`) from too low
/// to enough: each run traced, or failed with exit code 1 and one line naming the limit
/// and what to do. Never an abort (a failed allocation was "memory allocation of N bytes
/// failed", exit code 134, with a backtrace), nor a panic.
#[privileged_test]
fn a_low_address_space_limit_is_named_never_an_abort() {
    require_privileged();
    let target = Victim::start();
    let pid_arg = target.pid.to_string();
    let dir = out_dir("ulimit-v");
    let dir = dir.to_str().unwrap();
    let mut failed = 0;
    for command in ["attach", "profile"] {
        for mib in [20, 40, 60, 80, 120, 1024] {
            let kib: u64 = mib * 1024;
            let mut tracer = Command::new(tracer_bin());
            tracer.args([command, "--pid", &pid_arg, "--duration", "1s", "-o", dir]);
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
            unsafe {
                tracer.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: kib * 1024,
                        rlim_max: kib * 1024,
                    };
                    match libc::setrlimit(libc::RLIMIT_AS, &raw const limit) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
            let out = tracer.output().unwrap();
            let err = stderr(&out);
            let what = format!("{command} with ulimit -v {kib}");
            if out.status.success() {
                continue;
            }
            assert_eq!(out.status.code(), Some(1), "{what}: {err}");
            assert!(!err.contains("panicked"), "{what}: {err}");
            assert!(!err.contains("memory allocation of"), "{what}: {err}");
            assert_eq!(err.matches("tracer: error:").count(), 1, "{what}: {err}");
            let line = err
                .lines()
                .find(|l| l.starts_with("tracer: error:"))
                .unwrap();
            assert!(
                line.ends_with(&format!(
                    "(ulimit -v is {kib} KiB): raise the limit, e.g. `ulimit -v unlimited`, \
                     and run tracer again"
                )),
                "{what}: {err}"
            );
            assert!(line.contains("out of memory"), "{what}: {err}");
            failed += 1;
        }
    }
    // 20 MiB is too little for the tracer anywhere: some runs must have failed.
    assert!(failed >= 2, "{failed} runs failed");
}

/// The memory cgroup of this test process, when it is on cgroup v1's memory hierarchy:
/// where a cgroup below it can be given a memory limit.
fn own_memory_cgroup_v1() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let controllers = fields.nth(1)?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| fields.next())
            .flatten()
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    dir.join("memory.limit_in_bytes").exists().then_some(dir)
}

/// The cgroup v2 directory of this test process, when its memory controller can be
/// given to a cgroup below it.
fn own_memory_cgroup_v2() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let controllers = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    controllers
        .split_whitespace()
        .any(|c| c == "memory")
        .then_some(dir)
}

/// `tracer attach` and `profile` in a memory cgroup limited to 32 MiB: each fails with
/// exit code 1 and one line that names the cgroup's limit and what to do. It was "failed
/// to create map `X`: failed to create map `X`: Cannot allocate memory", the cause twice
/// and no hint, or the kernel killed the tracer.
#[privileged_test]
fn a_memory_cgroup_limit_is_named_once() {
    require_privileged();
    let (parent, file) = match (own_memory_cgroup_v1(), own_memory_cgroup_v2()) {
        (Some(dir), _) => (dir, "memory.limit_in_bytes"),
        (None, Some(dir)) => (dir, "memory.max"),
        (None, None) => panic!("no memory cgroup to make a limited one in"),
    };
    let cgroup = parent.join(format!("tracer-test-memory-{}", std::process::id()));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join(file), "32M").unwrap();
    let target = Victim::start();
    let pid_arg = target.pid.to_string();
    let dir = out_dir("memory-cgroup");
    let dir = dir.to_str().unwrap();
    let procs = cgroup.join("cgroup.procs");
    let mut outcomes = Vec::new();
    for command in ["attach", "profile"] {
        // The shell moves itself into the cgroup and becomes the tracer.
        let out = Command::new("sh")
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(&procs)
            .arg(tracer_bin())
            .args([command, "--pid", &pid_arg, "--duration", "1s", "-o", dir])
            .output()
            .unwrap();
        outcomes.push((command, out));
    }
    drop(target);
    // Emptied now that the tracers are gone.
    let _ = std::fs::remove_dir(&cgroup);
    for (command, out) in outcomes {
        let err = stderr(&out);
        let what = format!("{command} in a 32 MiB cgroup");
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_eq!(err.matches("tracer: error:").count(), 1, "{what}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("tracer: error:"))
            .unwrap();
        let causes: Vec<&str> = line.split(": ").collect();
        assert!(
            causes.windows(2).all(|pair| pair[0] != pair[1]),
            "{what}: a cause said twice: {line}"
        );
        assert!(
            line.contains(&format!(
                "the memory cgroup {} limits tracer to 32.0 MiB ({file})",
                cgroup.display()
            )),
            "{what}: {line}"
        );
        assert!(
            line.ends_with(
                ": raise that limit, or run tracer outside the cgroup, and run tracer again"
            ),
            "{what}: {line}"
        );
    }
}
