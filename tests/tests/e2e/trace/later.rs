//! Probes in what is loaded after attaching (issue 13, items 2 and 3), end to end on a
//! target built here (`src/late`: an executable with tracetest:testprobe that dlopens a
//! library with tracetest:latelib and the semaphore-guarded tracetest:guarded, and fires
//! them at once), each compared with bpftrace on the same case:
//! - `--pid` and `usdt:*`: the library dlopened after attaching is traced from its first
//!   hit, its semaphore raised, and everything is as it was after the stop;
//! - `--comm` (a set): the same, the kernel keeping the targets' hits;
//! - `-- CMD` and `usdt:*`, probes only in the library: found when it is loaded;
//! - no PID and `usdt:*`: every process carrying the probe, those started later too
//!   (not compared: bpftrace 0.17's `usdt:*` without -p is a file pattern in the current
//!   directory, and it may hang there).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write as _},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::common::*;

const N: usize = 5;

/// (executable, library), built once per test binary.
fn built() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib = compile_target("gcc", "src/late/lib.c", "liblate.so", &["-shared", "-fPIC"]);
        let exe = compile_target("gcc", "src/late/main.c", "late-main", &["-ldl"]);
        (exe, lib)
    })
}

/// A running `late-main`, driven line by line.
struct Late {
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Late {
    fn start(exe: &Path, n: usize) -> Late {
        Self::start_with(exe, &built().1, n)
    }

    /// [`Late::start`] with a library of its own.
    fn start_with(exe: &Path, lib: &Path, n: usize) -> Late {
        let mut child = Command::new(exe)
            .arg(lib)
            .arg(n.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let line = read_line(&mut stdout);
        let pid = line.strip_prefix("ready pid=").unwrap().parse().unwrap();
        Late {
            pid,
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    /// Sends the next line and returns what it printed for it (`raised=R`), if anything.
    fn step(&mut self) -> String {
        self.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        read_line(&mut self.stdout)
    }

    /// Closes its input, at which it exits.
    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Late {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line.trim_end().to_string()
}

/// How many probe sites of `file` (as `tracer list -v` finds them) hold a breakpoint in
/// process `pid` now, over every mapping of the file; and how many mapped sites there are.
fn breakpoints_in(pid: u32, file: &Path) -> (usize, usize) {
    let out = run_tracer(&["list", "-v", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let listing = out.stdout.as_str();
    let offsets: Vec<u64> = listing
        .lines()
        .filter(|l| l.trim_start().starts_with("site "))
        .map(|l| {
            let rest = l.split("file offset 0x").nth(1).unwrap();
            let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            u64::from_str_radix(&hex, 16).unwrap()
        })
        .collect();
    let original = std::fs::read(file).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let (mut set, mut mapped) = (0, 0);
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || Path::new(fields[5]) != file || !fields[1].contains('x') {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        for &site in &offsets {
            if offset <= site && site < offset + (end - start) {
                let mut byte = [0];
                mem.read_exact_at(&mut byte, start + site - offset).unwrap();
                mapped += 1;
                set += usize::from(byte[0] != original[site as usize]);
            }
        }
    }
    (set, mapped)
}

/// The counts of `trace --count --format json`, by whole specifier.
fn counts(stdout: &str) -> BTreeMap<String, u64> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<BTreeMap<String, u64>>(l).ok())
        .next_back()
        .unwrap_or_else(|| panic!("no counts in {stdout}"))
}

fn probe(file: &Path, name: &str) -> String {
    format!("usdt:{}:tracetest:{name}", file.display())
}

/// bpftrace's `@[probe]` counts (the probe names have colons, which its map parser
/// splits at).
fn probe_counts(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("@[")?.rsplit_once("]: "))
        .map(|(probe, n)| (probe.to_string(), n.parse().unwrap()))
        .collect()
}

const BPFTRACE_COUNT: &str =
    "BEGIN { printf(\"Tracing\\n\"); } usdt:*:tracetest:* { @[probe] = count(); }";

/// `--stack` holds for sites found later too: every hit of the library's probe comes
/// with its stack, through the library's `fire` into the executable's `main`.
#[privileged_test]
fn stacks_are_taken_at_the_sites_of_a_library_dlopened_after_attaching() {
    require_privileged();
    let (exe, _) = built();
    let mut target = Late::start(exe, N);
    let tracer = TracerRun::trace()
        .json()
        .args([
            "--stack", // The library and executable are built without frame pointers.
            "--unwind",
            "dwarf",
            "--hold-at-dlopen",
        ])
        .pid(target.pid)
        .arg("usdt:*:tracetest:latelib")
        .start();
    // dlopen and N hits (the guarded probe, not traced, keeps its semaphore down).
    assert_eq!(target.step(), "raised=0");
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let hits: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(hits.len(), N, "{out}\n{err}");
    for hit in &hits {
        let functions: Vec<&str> = hit["stack"]
            .as_array()
            .unwrap_or_else(|| panic!("no stack: {hit}"))
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        let at = |name: &str| functions.iter().position(|f| *f == name);
        assert!(
            matches!((at("fire"), at("main")), (Some(f), Some(m)) if f < m),
            "fire called from main: {functions:?}"
        );
    }
    target.finish();
}

/// `attach` too: a latency between two probes of a library dlopened after attaching is
/// measured from the first pair, the library's semaphore raised, and all is as it was
/// after the stop.
#[privileged_test]
fn attach_measures_a_latency_of_a_library_dlopened_after_attaching() {
    require_privileged();
    let (exe, lib) = built();
    let mut target = Late::start(exe, N);
    let dir = out_dir("later-attach");
    let attach = TracerRun::attach()
        .pid(target.pid)
        .json()
        .out(&dir)
        .args([
            "--hold-at-dlopen",
            "--latency",
            "tracetest:latelib,tracetest:guarded",
        ])
        .start();
    assert!(
        attach
            .early_stderr
            .contains("looking for it in what is loaded later"),
        "{}",
        attach.early_stderr
    );
    // dlopen, then at once N pairs: the semaphore was up for all.
    assert_eq!(target.step(), format!("raised={N}"));
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(attach.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = attach.finish();
    assert!(ok, "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let latency = &report["latencies"]["latelib_to_guarded"];
    assert_eq!(latency["count"], N as u64, "{report:#}\n{err}");
    let hits = |name: &str| {
        report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["probe"].as_str().is_some_and(|s| s.ends_with(name)))
            .map(|p| p["hits"].as_u64().unwrap())
    };
    assert_eq!(hits("tracetest:latelib"), Some(N as u64), "{report:#}");
    assert_eq!(hits("tracetest:guarded"), Some(N as u64), "{report:#}");
    // Left as it was: no breakpoint in the library, the semaphore 0.
    assert_eq!(breakpoints_in(target.pid, lib).0, 0, "breakpoints left");
    assert_eq!(target.step(), "raised=0", "the semaphore is back to 0");
    target.finish();
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn a_library_dlopened_after_attaching_is_traced_from_its_first_hit() {
    require_privileged();
    let (exe, lib) = built();
    let mut target = Late::start(exe, N);
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .arg("--hold-at-dlopen")
        .pid(target.pid)
        .arg("usdt:*:tracetest:*")
        .start();
    // dlopen, then at once N hits of each library probe: the semaphore was up for all.
    assert_eq!(target.step(), format!("raised={N}"));
    let (set, mapped) = breakpoints_in(target.pid, lib);
    assert!(mapped == 2 && set == 2, "library sites {set}/{mapped}");
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let ours = counts(&out);
    assert_eq!(ours[&probe(exe, "testprobe")], N as u64, "{out}");
    assert_eq!(ours[&probe(lib, "latelib")], N as u64, "{out}");
    assert_eq!(ours[&probe(lib, "guarded")], N as u64, "{out}");
    // Left as it was: no breakpoint in the library or the executable, the semaphore 0.
    assert_eq!(breakpoints_in(target.pid, lib).0, 0, "breakpoints left");
    assert_eq!(breakpoints_in(target.pid, exe).0, 0, "breakpoints left");
    assert_eq!(target.step(), "raised=0", "the semaphore is back to 0");
    target.finish();

    // bpftrace on the same case searches what is mapped when it attaches (from an empty
    // directory: its `usdt:*` is also a file pattern).
    let mut target = Late::start(exe, N);
    let pid = target.pid.to_string();
    let empty = out_dir("later-bpftrace-pid");
    let bpftrace = Bpftrace::start_in(&empty, &["-p", &pid, "-e", BPFTRACE_COUNT]);
    let raised = target.step();
    target.step();
    // Stopped while the target lives: when it ends first, bpftrace prints no maps.
    let theirs = probe_counts(&bpftrace.stop().text);
    target.finish();
    let theirs_of = |name: &str| {
        theirs
            .iter()
            .filter(|(k, _)| k.ends_with(&format!(":tracetest:{name}")))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    eprintln!(
        "bpftrace -p: testprobe {}, latelib {}, guarded {}, {raised}",
        theirs_of("testprobe"),
        theirs_of("latelib"),
        theirs_of("guarded")
    );
    assert_eq!(
        theirs_of("testprobe"),
        N as u64,
        "both trace the executable's probe: {theirs:?}"
    );
}

/// A set of processes (`--comm`): the library's sites are attached for every process
/// mapping it once the kernel tells that a member mapped it, and the kernel keeps the
/// targets' hits; a process of another name running the same files is not counted. A
/// member that maps nothing new has its maps read by no one: the tracer reads them only
/// after the `dlopen`. No `_dl_debug_state` uprobe is placed for a set (it would land in
/// every process on the machine running that loader), and the library's first hits,
/// made before the look, may be missed.
#[privileged_test]
fn a_library_dlopened_by_a_set_of_processes_is_traced_once_mapped() {
    require_privileged();
    let (exe, _) = built();
    let dir = out_dir("later-set");
    let (traced, other) = (dir.join("late-set"), dir.join("late-other"));
    std::fs::copy(exe, &traced).unwrap();
    std::fs::hard_link(&traced, &other).unwrap();
    // A library of its own: a set's uprobes are in every process that maps the file,
    // and the other tests' targets map theirs.
    let lib = &dir.join("liblate-set.so");
    std::fs::copy(built().1.as_path(), lib).unwrap();
    let mut target = Late::start_with(&traced, lib, N);
    let mut bystander = Late::start_with(&other, lib, N);
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .args(["--comm", "late-set", "usdt:*:tracetest:*"])
        .start();
    let loader = ld_so_of(bystander.pid);
    let opens = OpenWatch::start(tracer.pid(), &dir.join("tracer.strace"));
    // Ten periods of a look at every member's maps, had there been one.
    std::thread::sleep(Duration::from_secs(1));
    let mapped_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    target.step();
    bystander.step();
    let deadline = Instant::now() + Duration::from_secs(10);
    while breakpoints_in(target.pid, lib).0 == 0 {
        assert!(
            Instant::now() < deadline,
            "the library's probes were not attached"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let maps_read = opens.finish(&format!("/proc/{}/maps", target.pid));
    assert!(
        maps_read.iter().all(|&at| at >= mapped_at),
        "the maps of a member that mapped nothing new were read: {maps_read:?} (dlopen at {mapped_at})"
    );
    assert!(
        !maps_read.is_empty(),
        "the library was found without reading the maps"
    );
    assert_eq!(target.step(), format!("raised={N}"));
    // The same files, not a target: its semaphore is raised too (one uprobe per file),
    // its hits are not counted.
    assert_eq!(bystander.step(), format!("raised={N}"));
    assert_eq!(
        dl_debug_state_breakpoints(bystander.pid, &loader),
        0,
        "a process outside the set got the dlopen uprobe"
    );
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let ours = counts(&out);
    assert_eq!(ours[&probe(&traced, "testprobe")], N as u64, "{out}");
    let latelib = ours[&probe(lib, "latelib")];
    assert!(
        (N as u64..=2 * N as u64).contains(&latelib),
        "the second round's {N} hits and at most the first's: {latelib} in {out}"
    );
    for late in [&target, &bystander] {
        assert_eq!(breakpoints_in(late.pid, lib).0, 0, "breakpoints left");
    }
    target.finish();
    bystander.finish();
}

/// `attach` on a process that maps nothing new reads its maps at the start only: the
/// kernel tells of what it maps later (a library it loads), and then it is read again.
/// Runs `tracer COMMAND --pid PID EXTRA` on a target that maps a library after 1.5 s,
/// and checks with strace that the tracer reads the target's maps only after that.
fn maps_are_read_only_when_code_is_mapped(name: &str, command: &str, extra: &[&str]) {
    let (exe, _) = built();
    let dir = out_dir(name);
    let mut target = Late::start(exe, N);
    let pid = target.pid.to_string();
    let out = dir.join("out");
    let mut args = vec![command, "--pid", &pid, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let tracer = Tracer::start(&args);
    let opens = OpenWatch::start(tracer.pid(), &dir.join("tracer.strace"));
    // Ten periods of a look at the target's maps, and a sampler's refresh, had there been
    // any.
    std::thread::sleep(Duration::from_millis(1500));
    let mapped_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    target.step();
    // The look that follows the dlopen reads them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let maps = format!("/proc/{pid}/maps");
    let log = dir.join("tracer.strace");
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(&maps)
    {
        assert!(
            Instant::now() < deadline,
            "{command} {extra:?}: the maps were not read after the dlopen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let maps_read = opens.finish(&maps);
    assert!(
        maps_read.iter().all(|&at| at >= mapped_at),
        "{command} {extra:?}: the maps of a process that mapped nothing new were read: \
         {maps_read:?} (dlopen at {mapped_at})"
    );
    assert!(!maps_read.is_empty());
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, _, err) = tracer.finish();
    assert!(ok, "{err}");
    target.finish();
}

#[privileged_test]
fn attach_reads_the_maps_of_a_process_only_when_it_maps_code() {
    require_privileged();
    maps_are_read_only_when_code_is_mapped("later-attach-maps", "attach", &[]);
}

#[privileged_test]
fn attach_children_reads_the_maps_of_a_process_only_when_it_maps_code() {
    require_privileged();
    maps_are_read_only_when_code_is_mapped("later-children-maps", "attach", &["--children"]);
}

#[privileged_test]
fn profile_reads_the_maps_of_a_process_only_when_it_maps_code() {
    require_privileged();
    maps_are_read_only_when_code_is_mapped("later-profile-maps", "profile", &[]);
}

#[privileged_test]
fn a_command_s_probes_in_a_library_it_loads_later_are_found() {
    require_privileged();
    let (exe, lib) = built();
    let n = N.to_string();
    let mut tracer = Command::new(tracer_bin())
        .args([
            "trace",
            "--count",
            "--format",
            "json",
            "--hold-at-dlopen",
            "usdt:*:tracetest:guarded",
            "--",
        ])
        .arg(exe)
        .arg(lib)
        .arg(&n)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command reads its lines as they come; all at once is the same to it.
    tracer
        .stdin
        .take()
        .unwrap()
        .write_all(b"go\ngo\nend\n")
        .unwrap();
    let out = tracer.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("yet: looking for them"), "{stderr}");
    // Twice N hits, the semaphore raised for every one.
    assert!(
        stdout.contains(&format!("raised={N}\nraised={N}\n")),
        "{stdout}"
    );
    assert_eq!(counts(&stdout)[&probe(lib, "guarded")], 2 * N as u64);

    // bpftrace -c searches what the command maps when bpftrace attaches.
    let script = "BEGIN { printf(\"Tracing\\n\"); } usdt:*:tracetest:guarded { @ = count(); }";
    let mut bpftrace = Command::new("bpftrace")
        .current_dir(out_dir("later-bpftrace-cmd"))
        .args(["-e", script, "-c"])
        .arg(format!("{} {} {n}", exe.display(), lib.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    bpftrace
        .stdin
        .take()
        .unwrap()
        .write_all(b"go\ngo\nend\n")
        .unwrap();
    let bpftrace = bpftrace.wait_with_output().unwrap();
    eprintln!(
        "bpftrace -c: {}{}",
        String::from_utf8_lossy(&bpftrace.stdout),
        String::from_utf8_lossy(&bpftrace.stderr)
    );
}

#[privileged_test]
fn every_process_is_traced_without_a_pid_those_started_later_too() {
    require_privileged();
    let (exe, _) = built();
    let dir = out_dir("later-every");
    // Two copies: the second is a file no process maps when the tracer starts.
    let (first, second) = (dir.join("late-a"), dir.join("late-b"));
    std::fs::copy(exe, &first).unwrap();
    std::fs::copy(exe, &second).unwrap();
    let mut running = Late::start(&first, N);
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .arg("usdt:*:tracetest:testprobe")
        .start();
    let started = Instant::now();
    let mut later = Late::start(&second, N + 2);
    while breakpoints_in(later.pid, &second).0 == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the new process is not attached"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "a process started later attached within {:?}",
        started.elapsed()
    );
    assert!(breakpoints_in(running.pid, &first).0 > 0, "not attached");
    running.step();
    later.step();
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let ours = counts(&out);
    assert_eq!(ours[&probe(&first, "testprobe")], N as u64, "{out}");
    assert_eq!(ours[&probe(&second, "testprobe")], N as u64 + 2, "{out}");
    assert_eq!(breakpoints_in(running.pid, &first).0, 0, "breakpoints left");
    assert_eq!(breakpoints_in(later.pid, &second).0, 0, "breakpoints left");
    running.finish();
    later.finish();

    // bpftrace 0.17 has no such case: its `usdt:*` without -p is a file pattern in the
    // current directory (none of these files: 0 hits; a FIFO there: it hangs opening it).
}

/// The state letter of process `pid` (`R`, `S`, `T` for stopped...).
fn process_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// A tracer SIGKILLed while the kernel holds a target stopped at `dlopen` leaves it
/// running: the link keeper continues the held processes once it has closed the links.
/// The tracer is itself stopped first, so the hold lasts until the kill.
#[privileged_test]
fn a_tracer_killed_while_a_target_is_held_at_dlopen_leaves_it_running() {
    require_privileged();
    let (exe, lib) = built();
    let target = Late::start(exe, N);
    let pid = target.pid;
    let tracer = TracerRun::trace()
        .args([
            "--count",
            "--hold-at-dlopen",
            "--pid",
            &pid.to_string(),
            "usdt:*:tracetest:*",
        ])
        .start();
    let keeper = tracer_keeper_of(tracer.pid());
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let stepping = std::thread::spawn(move || {
        let mut target = target;
        let raised = target.step();
        done_tx.send(()).unwrap();
        (target, raised)
    });
    // The target reaches its dlopen and the kernel stops it there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_state(pid) != 'T' {
        assert!(Instant::now() < deadline, "the target was never held");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGKILL) };
    let _ = tracer.finish();
    assert!(
        done_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the held target was left stopped (state {})",
        process_state(pid)
    );
    let (mut target, _raised) = stepping.join().unwrap();
    // The keeper is gone and nothing of the trace is left in the target.
    let gone = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{keeper}")).exists() {
        assert!(Instant::now() < gone, "the keeper outlived its links");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Links released by a keeper are removed by a kernel worker a grace period or so
    // after it exits: nobody waits for them, as a tracer's own detach does.
    let restored = Instant::now() + Duration::from_secs(5);
    let left = || breakpoints_in(pid, lib).0 + breakpoints_in(pid, exe).0;
    while left() > 0 {
        assert!(Instant::now() < restored, "breakpoints left: {}", left());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(target.step(), "raised=0", "the semaphore is back to 0");
    target.finish();
}

/// The pid of the link keeper tracer `tracer` started (a child of it).
fn tracer_keeper_of(tracer: u32) -> u32 {
    let mut children = String::new();
    for task in std::fs::read_dir(format!("/proc/{tracer}/task")).unwrap() {
        let task = task.unwrap().path().join("children");
        children.push_str(&std::fs::read_to_string(task).unwrap_or_default());
        children.push(' ');
    }
    children
        .split_whitespace()
        .map(|p| p.parse::<u32>().unwrap())
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with("tracer-link-keeper"))
        })
        .expect("a link keeper")
}

/// Function probes in a library dlopened after attaching: found by its file name, held
/// at the dlopen like USDT sites, so the first call is counted, its entry and its return.
#[privileged_test]
fn function_probes_in_a_library_dlopened_after_attaching_count_its_first_call() {
    require_privileged();
    let (exe, lib) = built();
    let mut target = Late::start(exe, N);
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .arg("--hold-at-dlopen")
        .pid(target.pid)
        .args(["uprobe:liblate.so:fire", "uretprobe:liblate.so:fire"])
        .start();
    // dlopen, then at once one call of fire; then another.
    assert_eq!(target.step(), "raised=0");
    assert_eq!(target.step(), "raised=0");
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let ours = counts(&out);
    let lib = lib.display();
    assert_eq!(ours[&format!("uprobe:{lib}:fire")], 2, "{out}");
    assert_eq!(ours[&format!("uretprobe:{lib}:fire")], 2, "{out}");
    target.finish();
}

/// What `late-watchful` saw of a run: SIGCONT handler runs, reads interrupted, rounds.
fn watchful_run(hold: bool) -> (serde_json::Value, BTreeMap<String, u64>) {
    let (_, lib) = built();
    let exe = compile_target("gcc", "src/late/watchful.c", "late-watchful", &["-ldl"]);
    let mut target = Command::new(&exe)
        .arg(lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut stdout = BufReader::new(target.stdout.take().unwrap());
    let line = read_line(&mut stdout);
    let pid = line.strip_prefix("ready pid=").unwrap().to_string();
    let mut args = vec!["trace", "--count", "--format", "json", "--pid", &pid];
    if hold {
        args.push("--hold-at-dlopen");
    }
    args.push("usdt:*:tracetest:latelib");
    let tracer = Tracer::start(&args);
    for _ in 0..10 {
        stdin.write_all(b"go\n").unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    drop(stdin);
    let seen: serde_json::Value = serde_json::from_str(&read_line(&mut stdout)).unwrap();
    assert!(target.wait().unwrap().success());
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    (seen, counts(&out))
}

/// By default a dlopen is seen, not held: the target never sees a stop (a SIGCONT
/// handler, a read interrupted with EINTR), and the library's probes are attached
/// within a look; with --hold-at-dlopen it is stopped at each dlopen, which it can see.
#[privileged_test]
fn a_dlopen_is_not_held_unless_asked_and_the_target_never_sees_a_stop() {
    require_privileged();
    let (seen, ours) = watchful_run(false);
    assert_eq!(seen["rounds"], 10, "{seen}");
    assert_eq!(seen["sigcont"], 0, "the target saw a stop: {seen}");
    assert_eq!(
        seen["eintr"], 0,
        "the target's read was interrupted: {seen}"
    );
    let (_, lib) = built();
    let hits = ours.get(&probe(lib, "latelib")).copied().unwrap_or(0);
    assert!(
        hits >= 9,
        "the library found within a look, all hits but the first are traced: {hits} of 10"
    );
    let (seen, ours) = watchful_run(true);
    assert_eq!(seen["rounds"], 10, "{seen}");
    assert!(
        seen["sigcont"].as_u64().unwrap() > 0,
        "held at dlopen, the target sees the SIGCONT: {seen}"
    );
    assert_eq!(ours[&probe(lib, "latelib")], 10, "held: every hit traced");
}

/// A target under ptrace (strace here) shows the kernel's stop as `t`, not `T`: with
/// --hold-at-dlopen it is continued once the library's probes are attached, as any other
/// target, and not held until the tracer stops.
#[privileged_test]
fn a_ptraced_target_held_at_dlopen_is_continued() {
    require_privileged();
    let (exe, lib) = built();
    let mut strace = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null"])
        .arg(exe)
        .arg(lib)
        .arg(N.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("strace is installed by `cargo xtask setup`");
    let mut stdin = strace.stdin.take().unwrap();
    let stdout = BufReader::new(strace.stdout.take().unwrap());
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = || {
        lines
            .recv_timeout(Duration::from_secs(10))
            .expect("the target went on within 10 s")
    };
    let pid: u32 = next_line()
        .strip_prefix("ready pid=")
        .unwrap()
        .parse()
        .unwrap();
    let tracer = TracerRun::trace()
        .arg("--count")
        .json()
        .arg("--hold-at-dlopen")
        .pid(pid)
        .arg("usdt:*:tracetest:*")
        .start();
    // dlopen, held and continued, then N hits with the semaphore up for all.
    stdin.write_all(b"go\n").unwrap();
    assert_eq!(next_line(), format!("raised={N}"));
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    assert_eq!(counts(&out)[&probe(lib, "latelib")], N as u64, "{out}");
    stdin.write_all(b"go\n").unwrap();
    assert_eq!(next_line(), "raised=0", "the semaphore is back to 0");
    drop(stdin);
    assert!(strace.wait().unwrap().success());
}
