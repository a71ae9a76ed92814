//! The harness shared by the privileged end-to-end tests: find the tracer, start a target
//! that waits for SIGUSR1, attach, release the target, collect both outputs.

mod bpftrace;
mod http;
mod opens;
mod run;

pub use bpftrace::{Bpftrace, BpftraceMaps};
pub use http::{http_get, metrics_addr};
pub use opens::OpenWatch;
pub use privileged_test::privileged_test;
pub use run::{Finished, TracerRun};

use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap},
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, ChildStdout, Command, Stdio},
    sync::{
        Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Fails the test unless it can load eBPF (root; the tracer also accepts
/// CAP_BPF+CAP_PERFMON, but the tests drop to those from root).
///
/// Every test that calls this is a `#[privileged_test]`, ignored with the reason, so a
/// plain `cargo test` shows it as ignored rather than passed; `cargo xtask test` runs them
/// with `--include-ignored`. A test asked to run without the privilege fails: it never
/// reports a pass it did not earn, under CI=true or not.
///
/// The test then runs side by side with others (see [`require_privileged_alone`]), under
/// a watchdog (see [`watch_this_test`]).
pub fn require_privileged() {
    require_root();
    begin_test(|| Turn::SideBySide {
        _guard: lock_or_poisoned(SIDE_BY_SIDE.read()),
    });
}

/// [`require_privileged`] for a test whose measure the other tests' load would skew: it
/// waits until the tests running finish and runs alone.
///
/// Two kinds of test need this. One measures how the tracer holds up over time (its
/// memory, its maps), where load would read as growth. The other compares a span the
/// tracer times with the runtime's own clock, which leaves out the span's edges. On a
/// busy CPU the collecting thread is often preempted at those edges, and that wait lands
/// only in the tracer's span.
pub fn require_privileged_alone() {
    require_root();
    begin_test(|| Turn::Alone {
        _guard: lock_or_poisoned(SIDE_BY_SIDE.write()),
    });
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "not root: loading eBPF programs needs root (run `cargo xtask test` as root, or \
         leave out --include-ignored to skip the privileged tests)"
    );
}

/// Taken for reading by every privileged test, for writing by one that runs alone.
static SIDE_BY_SIDE: RwLock<()> = RwLock::new(());

/// A test's place among the others, held until its thread ends.
enum Turn {
    SideBySide {
        _guard: RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

/// A failed test that held the lock says nothing about the next one.
fn lock_or_poisoned<G>(locked: Result<G, PoisonError<G>>) -> G {
    locked.unwrap_or_else(PoisonError::into_inner)
}

/// No end-to-end test takes a minute and a half here; one that runs for this long waits
/// for something that will not come.
const HUNG_AFTER: Duration = Duration::from_secs(240);

/// Set when the test's thread ends (its thread-local is dropped); its turn ends then too.
struct TestDone {
    done: Arc<AtomicBool>,
    _turn: Turn,
}

impl Drop for TestDone {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

thread_local! {
    static THIS_TEST: RefCell<Option<TestDone>> = const { RefCell::new(None) };
}

/// Takes the test's turn and starts its watchdog, once per test: a helper that asks
/// again changes nothing (taking the lock twice on one thread could wait forever).
fn begin_test(turn: impl FnOnce() -> Turn) {
    if THIS_TEST.with(|test| test.borrow().is_some()) {
        return;
    }
    let turn = turn();
    let done = Arc::new(AtomicBool::new(false));
    THIS_TEST.with(|test| {
        *test.borrow_mut() = Some(TestDone {
            done: done.clone(),
            _turn: turn,
        });
    });
    watch_this_test(done);
}

/// Turns a hung test into a failed one: past [`HUNG_AFTER`], the processes the test binary
/// started are listed with where they wait, then killed, so that the test's reads end and
/// it fails with its own message; if even that does not end it, the binary aborts. A hang
/// would otherwise hold the whole CI run until its time limit, saying nothing.
fn watch_this_test(done: Arc<AtomicBool>) {
    let name = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let wait_until = |limit: Duration| {
            while started.elapsed() < limit {
                if done.load(Ordering::Relaxed) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            done.load(Ordering::Relaxed)
        };
        if wait_until(HUNG_AFTER) {
            return;
        }
        let descendants = descendants(std::process::id());
        let mut listing = String::new();
        for pid in &descendants {
            let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
            let cmdline = read("cmdline").unwrap_or_default().replace('\0', " ");
            let wchan = read("wchan").unwrap_or_default();
            listing.push_str(&format!("  {pid} waiting in {wchan}: {cmdline}\n"));
        }
        eprintln!(
            "{name} has run for {} s and is taken as hung; killing what it started:\n{listing}",
            HUNG_AFTER.as_secs()
        );
        for pid in descendants {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        if !wait_until(HUNG_AFTER + Duration::from_secs(60)) {
            eprintln!("{name} is still hung after its processes were killed: aborting");
            std::process::abort();
        }
    });
}

/// The processes below `pid`, children first.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The parent is the second field after the parenthesised name.
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((child, parent.parse().ok()?))
        })
        .collect();
    let mut found = vec![pid];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    found.remove(0);
    found
}

/// The demo runtime: GCs and task switches it fires and counts itself.
pub const GC_DEMO: &str = env!("CARGO_BIN_EXE_gc-demo");
/// Every argument form of a USDT probe, with the values it passed.
pub const USDT_ARGS: &str = env!("CARGO_BIN_EXE_usdt-args");
/// A process of as many threads as asked, each blocking in a known function.
pub const MANY_THREADS: &str = env!("CARGO_BIN_EXE_many-threads");

/// Held by each test that runs a JVM, for its whole run: a JVM of another test would be
/// one more process of `--exe java`, and a second CPU-spinning JVM would starve the first.
pub fn jvm_alone() -> std::sync::MutexGuard<'static, ()> {
    static JVM: std::sync::Mutex<()> = std::sync::Mutex::new(());
    JVM.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The tracer binary: $TRACER_BIN (set by `cargo xtask test`) or the workspace's release
/// build.
pub fn tracer_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("TRACER_BIN") {
        return path.into();
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/tracer");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask test` (it builds the tracer first)",
        path.display()
    );
    path
}

/// A target program started with `--wait-for-signal`.
pub struct Target {
    pub pid: u32,
    child: Child,
}

impl Target {
    /// Starts `program` and waits for its `ready pid=` line.
    pub fn start(program: &str, args: &[&str]) -> Target {
        let mut child = Command::new(program)
            .args(args)
            .arg("--wait-for-signal")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .unwrap_or_else(|| panic!("{program} said {line:?}"))
            .parse()
            .unwrap();
        child.stdout = Some(stdout.into_inner());
        Target { pid, child }
    }

    /// The next line the target prints after its `ready` line (read a byte at a time, so
    /// nothing after it is taken from [`Target::finish`]).
    pub fn read_line(&mut self) -> String {
        let stdout = self.child.stdout.as_mut().unwrap();
        let mut line = Vec::new();
        let mut byte = [0u8];
        while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        String::from_utf8(line).unwrap()
    }

    /// Lets the workload start.
    pub fn release(&self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        assert_eq!(unsafe { libc::kill(self.pid as i32, libc::SIGUSR1) }, 0);
    }

    /// Waits for the target to finish and returns its ground-truth JSON line.
    pub fn finish(mut self) -> serde_json::Value {
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "target failed: {status}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("target printed {out:?}: {e}"))
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `tracer` whose standard error is watched for the attach line.
pub struct Tracer {
    child: Child,
    stderr: BufReader<ChildStderr>,
    pub early_stderr: String,
}

impl Tracer {
    /// Starts `tracer ARGS` and returns once it printed that it attached: the command
    /// line as a user types it ([`TracerRun`] builds one up).
    pub fn start(args: &[&str]) -> Tracer {
        TracerRun::new(args[0]).args(&args[1..]).start()
    }

    /// Spawns `command` (described as `described` in failures) and reads its standard
    /// error up to the line that says it attached.
    // The child is waited for by `finish`, or by the early-exit path below.
    #[allow(clippy::zombie_processes)]
    fn spawn(mut command: Command, described: String) -> Tracer {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {described}: {e}"));
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut early_stderr = String::new();
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{described} exited before attaching ({}): {early_stderr}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            early_stderr.push_str(&line);
            if line.starts_with("Attached") {
                return Tracer {
                    child,
                    stderr,
                    early_stderr,
                };
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads standard error until a line contains `needle`; panics if the tracer exits
    /// first.
    pub fn wait_for_stderr(&mut self, needle: &str) {
        loop {
            let mut line = String::new();
            assert!(
                self.stderr.read_line(&mut line).unwrap_or(0) != 0,
                "tracer ended before printing {needle:?}: {}",
                self.early_stderr
            );
            self.early_stderr.push_str(&line);
            if line.contains(needle) {
                return;
            }
        }
    }

    /// Waits for the tracer to exit; returns (success, stdout, all of stderr).
    pub fn finish(mut self) -> (bool, String, String) {
        // Both at once: a report larger than a pipe's buffer would otherwise wait for a
        // reader that waits for standard error to close.
        let mut stdout = self.child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            stdout.read_to_string(&mut out).unwrap();
            out
        });
        let mut err = self.early_stderr.clone();
        self.stderr.read_to_string(&mut err).unwrap();
        let out = reader.join().unwrap();
        let status = self.child.wait().unwrap();
        (status.success(), out, err)
    }
}

/// A test that fails before it finished its tracer must not leave it running (with
/// `--exe` or `--comm` and no duration it would never stop): it gets SIGINT, as a user
/// would stop it, then SIGKILL.
impl Drop for Tracer {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: kill has no memory preconditions; the child is not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while matches!(self.child.try_wait(), Ok(None)) {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `tracer ARGS` to its end, whatever its exit: the command line as a user types it
/// ([`TracerRun`] builds one up).
pub fn run_tracer(args: &[&str]) -> Finished {
    TracerRun::new(args[0]).args(&args[1..]).output()
}

/// A fresh empty directory for a test's output files.
pub fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sum of the weights of folded lines whose stack contains `frame`.
pub fn folded_weight(folded: &str, frame: &str) -> u64 {
    folded_weight_where(folded, |stack| {
        stack
            .split(';')
            .any(|f| f.split(' ').next() == Some(frame) || f == frame)
    })
}

/// Compiles the C or C++ test target `source` (relative to the tests crate) with
/// `compiler` and `flags` (after -O2 -g0) into `name` in the tests' scratch directory.
pub fn compile_target(compiler: &str, source: &str, name: &str, flags: &[&str]) -> PathBuf {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    let bin = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new(compiler)
        .args(["-O2", "-g0"])
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        status.success(),
        "{compiler} failed on {}",
        source.display()
    );
    bin
}

/// The summed weight of the folded-stack lines whose stack passes `keep`.
pub fn folded_weight_where(folded: &str, keep: impl Fn(&str) -> bool) -> u64 {
    folded
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(stack, _)| keep(stack))
        .filter_map(|(_, weight)| weight.parse::<u64>().ok())
        .sum()
}

/// (start, end, file offset, permissions) of each mapping of process `pid`'s executable.
pub fn exe_mappings(pid: u32) -> Vec<(u64, u64, u64, String)> {
    let inode = std::fs::metadata(format!("/proc/{pid}/exe")).unwrap().ino();
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 6 || fields[4].parse::<u64>().ok()? != inode {
                return None;
            }
            let (start, end) = fields[0].split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(fields[2], 16).ok()?,
                fields[1].to_string(),
            ))
        })
        .collect()
}

/// The USDT sites and semaphores of a running process's executable, at run-time addresses,
/// from `tracer list -v` of /proc/PID/exe (the very file the process maps).
pub struct ProbeSites {
    pub pid: u32,
    /// Address of each probe instruction in each mapping that holds it, and its byte in the
    /// file.
    pub sites: Vec<(u64, u8)>,
    pub semaphores: Vec<u64>,
}

impl ProbeSites {
    pub fn of(pid: u32) -> Self {
        Self::listed_from(pid, &format!("/proc/{pid}/exe"))
    }

    /// The sites as `tracer list -v` gives them for `listed`, a file laid out as the
    /// process's executable is (the original of a copy whose notes were patched, so that
    /// the sites are known whatever the patched notes say).
    pub fn listed_from(pid: u32, listed: &str) -> Self {
        let exe = format!("/proc/{pid}/exe");
        let out = run_tracer(&["list", "-v", listed]);
        let listing = out.stdout.as_str();
        assert!(out.status.success(), "{out:?}");
        let file = std::fs::read(&exe).unwrap();
        let maps = exe_mappings(pid);
        // Segments share their boundary pages, so one file offset can be in two mappings:
        // the kernel puts a uprobe's breakpoint in each (both may execute, as far as it
        // knows), and counts a semaphore in the writable one.
        let addresses = |offset: u64, permission: char| {
            let found: Vec<u64> = maps
                .iter()
                .filter(|m| m.3.contains(permission))
                .filter(|m| m.2 <= offset && offset < m.2 + (m.1 - m.0))
                .map(|m| m.0 + offset - m.2)
                .collect();
            assert!(
                !found.is_empty(),
                "file offset {offset:#x} is not mapped: {maps:x?}"
            );
            found
        };
        let mut sites = Vec::new();
        let mut semaphores = BTreeSet::new();
        for line in listing
            .lines()
            .filter(|l| l.trim_start().starts_with("site "))
        {
            // `  site pc 0x.. (file offset 0x..), semaphore 0x.. (file offset 0x..)`
            let offsets: Vec<u64> = line
                .split("file offset 0x")
                .skip(1)
                .map(|rest| {
                    let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
                    u64::from_str_radix(&hex, 16).unwrap()
                })
                .collect();
            for address in addresses(offsets[0], 'r') {
                sites.push((address, file[offsets[0] as usize]));
            }
            if let Some(&semaphore) = offsets.get(1) {
                semaphores.insert(addresses(semaphore, 'w')[0]);
            }
        }
        assert!(!sites.is_empty(), "no probe sites in {listing}");
        assert!(!semaphores.is_empty(), "no semaphores in {listing}");
        Self {
            pid,
            sites,
            semaphores: semaphores.into_iter().collect(),
        }
    }

    pub fn read(&self, address: u64, buf: &mut [u8]) {
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        mem.read_exact_at(buf, address)
            .unwrap_or_else(|e| panic!("reading {address:#x} of {}: {e}", self.pid));
    }

    /// Whether `address` is a probe site.
    pub fn is_site(&self, address: u64) -> bool {
        self.sites.iter().any(|&(site, _)| site == address)
    }

    /// How many sites do not hold the file's instruction (a uprobe's breakpoint is there).
    pub fn breakpoints(&self) -> usize {
        self.sites
            .iter()
            .filter(|&&(address, original)| {
                let mut byte = [0];
                self.read(address, &mut byte);
                byte[0] != original
            })
            .count()
    }

    pub fn semaphore_values(&self) -> Vec<u16> {
        self.semaphores
            .iter()
            .map(|&address| {
                let mut value = [0; 2];
                self.read(address, &mut value);
                u16::from_ne_bytes(value)
            })
            .collect()
    }

    /// Asserts the process carries nothing of a tracer: no breakpoint, every semaphore 0.
    pub fn assert_untouched(&self, when: &str) {
        assert_eq!(
            self.breakpoints(),
            0,
            "{when}: breakpoints left in the target"
        );
        let values = self.semaphore_values();
        assert!(
            values.iter().all(|&v| v == 0),
            "{when}: semaphores {values:?}"
        );
    }

    /// Waits up to `timeout` for the process to carry nothing of a tracer (the link keeper
    /// of a killed tracer releases its uprobes after the tracer is gone), then asserts it.
    pub fn wait_untouched(&self, when: &str, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline
            && (self.breakpoints() > 0 || self.semaphore_values().iter().any(|&v| v > 0))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.assert_untouched(when);
    }

    /// Asserts a tracer is attached: breakpoints at some sites, some semaphore raised.
    pub fn assert_attached(&self) {
        assert!(self.breakpoints() > 0, "attached, yet no breakpoint");
        assert!(
            self.semaphore_values().iter().any(|&v| v > 0),
            "attached, yet no semaphore raised"
        );
    }
}

/// One `tracer attach --format json` run over `program`'s whole life.
pub struct AttachRun {
    pub report: serde_json::Value,
    pub truth: serde_json::Value,
    pub dir: PathBuf,
    pub stderr: String,
}

/// Starts `program TARGET_ARGS`, attaches `tracer attach --pid PID --format json -o DIR
/// EXTRA` (DIR a fresh `out_dir(name)`), releases the target and waits for both.
pub fn attach_json(program: &str, target_args: &[&str], name: &str, extra: &[&str]) -> AttachRun {
    attach_json_by(TracerRun::attach(), program, target_args, name, extra)
}

/// [`attach_json`] with `attach`, the tracer's command so far (another binary, say).
pub fn attach_json_by(
    attach: TracerRun,
    program: &str,
    target_args: &[&str],
    name: &str,
    extra: &[&str],
) -> AttachRun {
    let dir = out_dir(name);
    let target = Target::start(program, target_args);
    let tracer = attach.pid(target.pid).json().out(&dir).args(extra).start();
    target.release();
    let truth = target.finish();
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "tracer failed: {stderr}");
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    AttachRun {
        report,
        truth,
        dir,
        stderr,
    }
}

/// One event line of `tracer trace --format json`.
#[derive(Debug, Clone)]
pub struct TraceEvent {
    /// The whole specifier, `usdt:PATH:PROVIDER:NAME`.
    pub probe: String,
    pub pid: u32,
    /// As printed: numbers, or null for an unavailable argument.
    pub args: Vec<serde_json::Value>,
}

impl TraceEvent {
    /// The probe's name alone (after the last colon).
    pub fn name(&self) -> &str {
        self.probe.rsplit(':').next().unwrap_or_default()
    }

    /// The arguments as signed numbers (unsigned ones above i64::MAX wrap, as C casts).
    pub fn int_args(&self) -> Vec<i64> {
        self.args
            .iter()
            .map(|a| {
                a.as_i64()
                    .or_else(|| a.as_u64().map(|u| u as i64))
                    .unwrap_or_else(|| panic!("argument {a} of {self:?} is not a number"))
            })
            .collect()
    }
}

/// What `tracer trace --format json` printed: its events, and the other JSON lines of
/// standard output (a traced command shares it: its own lines, such as a truth line,
/// have no `probe`).
#[derive(Debug, Default)]
pub struct TracePrinted {
    pub events: Vec<TraceEvent>,
    pub other_json: Vec<serde_json::Value>,
}

/// Parses the standard output of `tracer trace --format json`.
pub fn parse_trace_json(stdout: &str) -> TracePrinted {
    let mut printed = TracePrinted::default();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let Some(probe) = value.get("probe").and_then(|p| p.as_str()) else {
            printed.other_json.push(value);
            continue;
        };
        let number = |key: &str| {
            value[key]
                .as_u64()
                .unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        // Every event names its thread and time; no test compares them yet.
        number("tid");
        number("time_ns");
        printed.events.push(TraceEvent {
            probe: probe.to_owned(),
            pid: number("pid") as u32,
            args: value["args"]
                .as_array()
                .unwrap_or_else(|| panic!("no args in {line}"))
                .clone(),
        });
    }
    printed
}

/// One `tracer trace --format json ARGS` run, waited for.
pub struct TraceRun {
    pub printed: TracePrinted,
    pub stderr: String,
}

/// Runs `tracer trace --format json ARGS` to its end (give `-- CMD` or `--duration`) and
/// parses what it printed; fails the test when the tracer fails.
pub fn trace_json(args: &[&str]) -> TraceRun {
    let finished = TracerRun::trace().json().args(args).run();
    TraceRun {
        printed: finished.trace(),
        stderr: finished.stderr,
    }
}

/// A copy of `program` in `dir`, ready to run: a child forked meanwhile by another test
/// may briefly hold the copy open for writing (exec fails with ETXTBSY), so this waits
/// until the copy runs (`--help`).
pub fn executable_copy(program: &str, dir: &Path) -> PathBuf {
    executable_copy_as(program, dir, Path::new(program).file_name().unwrap())
}

/// [`executable_copy`] under another file name (so another command name, its first 15
/// bytes).
pub fn executable_copy_as(program: &str, dir: &Path, name: impl AsRef<Path>) -> PathBuf {
    let copy = dir.join(name);
    std::fs::copy(program, &copy).unwrap();
    for _ in 0..100 {
        match Command::new(&copy)
            .arg("--help")
            .stdout(Stdio::null())
            .status()
        {
            Ok(status) if status.success() => return copy,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("{}: {other:?}", copy.display()),
        }
    }
    panic!("{} stays busy", copy.display());
}

/// `tracer trace --count --format json` output, each probe without its path → hits:
/// `PROVIDER:NAME` for a USDT probe, `uprobe:FUNC` or `uretprobe:FUNC` for a function.
pub fn trace_counts(stdout: &str) -> HashMap<String, u64> {
    let is_probe = |k: &str| {
        ["usdt:", "uprobe:", "uretprobe:"]
            .iter()
            .any(|t| k.starts_with(t))
    };
    let counts = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.as_object().is_some_and(|o| o.keys().any(|k| is_probe(k))))
        .unwrap_or_else(|| panic!("no counts in {stdout}"));
    counts
        .as_object()
        .unwrap()
        .iter()
        .map(|(probe, n)| {
            let kind = probe.split(':').next().unwrap();
            let mut parts = probe.rsplitn(3, ':');
            let name = parts.next().unwrap();
            let provider = match kind {
                "usdt" => parts.next().unwrap(),
                function => function,
            };
            (format!("{provider}:{name}"), n.as_u64().unwrap())
        })
        .collect()
}

/// A target that prints `ready pid=PID` (other lines before it are skipped), waits for a
/// line on its standard input, works, and exits; killed if the test fails first.
pub struct StdinTarget {
    pub pid: u32,
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl StdinTarget {
    pub fn start(command: &mut Command) -> StdinTarget {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let mut target = StdinTarget {
            pid: 0,
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        };
        loop {
            let mut line = String::new();
            assert!(
                target.stdout.read_line(&mut line).unwrap() > 0,
                "{command:?} exited before it was ready"
            );
            if let Some(pid) = line.trim().strip_prefix("ready pid=") {
                target.pid = pid.parse().unwrap();
                return target;
            }
        }
    }

    /// Lets it work, waits for it to exit, and returns the rest of its standard output.
    pub fn release_and_finish(mut self) -> String {
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "target failed ({status}): {rest}");
        rest
    }
}

impl Drop for StdinTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's directory.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap()
}

/// Builds a program of its own (`main`, with `dependencies`: lines of a manifest's
/// `[dependencies]`, and any sections after them, such as a `[patch]`) with `--cfg tokio_unstable` and frame pointers, as a project of its
/// own under `target/NAME` with its own target directory, so that the workspace's
/// artifacts (built without the cfg) stay valid. Returns the binary.
pub fn build_side_project(name: &str, dependencies: &str, main: &str) -> PathBuf {
    let workspace = workspace_dir();
    let project = workspace.join("target").join(name);
    std::fs::create_dir_all(project.join("src")).unwrap();
    let manifest = format!(
        r#"[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

# Not a member of the tracer workspace above it.
[workspace]

[dependencies]
{dependencies}"#
    );
    std::fs::write(project.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(project.join("src/main.rs"), main).unwrap();
    // The workspace's lock pins the versions it shares, already downloaded.
    std::fs::copy(workspace.join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["build", "--release", "--target-dir"])
        .arg(project.join("target"))
        .current_dir(&project)
        .env(
            "RUSTFLAGS",
            "--cfg tokio_unstable -C force-frame-pointers=yes",
        )
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo");
    assert!(
        out.status.success(),
        "building {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    project.join("target/release").join(name)
}

/// `a` and `b` within `relative` of `b`, or `absolute_ns` apart.
pub fn near(a: u64, b: u64, relative: f64, absolute_ns: u64) -> bool {
    let diff = a.abs_diff(b);
    diff <= absolute_ns || diff as f64 <= relative * b as f64
}

/// Whether two tracers' times of the same `spans` (totals, or one span each) agree. Both
/// programs run in the same uprobe traps, one after the other: microseconds apart, 50 µs
/// a span allowed. A busy machine may also preempt the target between them (the kernel
/// runs a trap's handlers preemptibly; 1.7 ms seen in CI, about one other task's time
/// slice): 4 ms more for each of the target's `preemptions` inside the spans (gc-demo
/// counts them; allow one where the target does not).
pub fn tracers_agree(a_ns: u64, b_ns: u64, spans: u64, preemptions: u64) -> bool {
    a_ns.abs_diff(b_ns) <= spans * 50_000 + preemptions * ONE_PREEMPTION_NS
}

/// What one preemption of a busy machine may take from a span (1.7 ms seen in CI).
pub const ONE_PREEMPTION_NS: u64 = 4_000_000;

/// Whether `probed_ns`, measured between two probes, fits the target's own measurements
/// of the same span: `outer_ns` from just before the first probe to just after the second,
/// `inner_ns` from just after the first returned to just before the second. The probes'
/// programs run inside the traps, so their span lies between the two, but for
/// `rounding_ns` (how the tracer printed it), however long a preemption around a probe
/// (2.6 ms seen on two busy CPUs).
pub fn inside_target_span(probed_ns: u64, outer_ns: u64, inner_ns: u64, rounding_ns: u64) -> bool {
    probed_ns <= outer_ns + rounding_ns && probed_ns + rounding_ns >= inner_ns
}

/// The entry of task `id` in an `attach` JSON report's task list.
pub fn report_task(report: &serde_json::Value, id: u64) -> &serde_json::Value {
    report["tasks"]["list"]
        .as_array()
        .and_then(|tasks| tasks.iter().find(|t| t["task"] == id))
        .unwrap_or_else(|| panic!("task {id} missing: {report:#}"))
}

/// A cgroup made for a test, removed when dropped (its processes moved out first).
pub struct TestCgroup(pub std::path::PathBuf);

impl TestCgroup {
    pub fn create(hierarchy: &str, name: &str) -> TestCgroup {
        let path = std::path::Path::new(hierarchy)
            .join(format!("tracer-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        TestCgroup(path)
    }

    pub fn add(&self, pid: u32) {
        let procs = self.0.join("cgroup.procs");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .and_then(|mut f| std::io::Write::write_all(&mut f, pid.to_string().as_bytes()))
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", procs.display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let parent = self.0.parent().unwrap().join("cgroup.procs");
        for _ in 0..50 {
            if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
                for pid in procs.split_whitespace() {
                    let _ = std::fs::write(&parent, pid);
                }
            }
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("could not remove cgroup {}", self.0.display());
    }
}

/// The cgroup v2 hierarchy: /sys/fs/cgroup itself, or /sys/fs/cgroup/unified on a hybrid
/// system (as these machines are).
pub fn cgroup_v2_root() -> &'static str {
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    }
}

/// The dynamic loader process `pid` runs.
pub fn ld_so_of(pid: u32) -> std::path::PathBuf {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| path.contains("/ld-linux"))
        .map(std::path::PathBuf::from)
        .expect("a dynamically linked process maps ld.so")
}

/// Whether process `pid` holds a breakpoint at `_dl_debug_state` of `loader`: 1 or 0.
pub fn dl_debug_state_breakpoints(pid: u32, loader: &std::path::Path) -> usize {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(loader)
        .output()
        .unwrap();
    let symbols = String::from_utf8_lossy(&out.stdout);
    let value = symbols
        .lines()
        .find(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|name| name.split('@').next() == Some("_dl_debug_state"))
        })
        .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
        .expect("ld.so exports _dl_debug_state");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let file = std::fs::read(loader).unwrap();
    // ld.so's first mapping is at file offset 0: a symbol's value is its offset from it.
    let base = maps
        .lines()
        .find(|l| l.ends_with(loader.to_str().unwrap()))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .unwrap();
    let mut byte = [0];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut byte, base + value).unwrap();
    usize::from(byte[0] == 0xcc && file[value as usize] != 0xcc)
}
