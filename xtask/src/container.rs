//! `cargo xtask container`: the smoke test in a real privileged container, as a user's CI
//! runs it. Builds the image of tests/docker/Dockerfile with podman (`FROM scratch`: no
//! registry is reachable) from the release builds of `tracer` and `gc-demo`, a static
//! busybox and tests/smoke.sh, runs it twice, privileged, with a host directory mounted
//! at /out:
//!
//! 1. `--pid=host`: the tracer and its target in the host's PID namespace;
//! 2. the container's own PID namespace (the usual CI job container);
//!
//! and once more on the host, in a new PID namespace (`unshare --pid --fork
//! --mount-proc`), without a container.
//!
//! Inside, the smoke script starts gc-demo and traces it with `tracer attach --pid`; here,
//! on the host, every count of the report it leaves in /out is checked against the
//! measurements gc-demo printed (its ground truth): collections, the count of every GC
//! latency histogram, each task's runs and parks, the threads by the ids the target itself
//! sees, and the off-CPU flamegraph with the functions the workers block in.
//!
//! In a PID namespace of its own the tracer takes and prints the namespace's PIDs, and
//! its kernel side follows the target by them: every run is checked alike.
//!
//! Binaries: the image gets the very glibc builds every other test runs, plus the four
//! shared libraries `ldd` names for them (the loader, libc, libm, libgcc_s), copied from
//! this machine into the image's root at the same paths, so they are the ones the binaries
//! were linked against, and the image needs nothing else. A static build
//! (x86_64-unknown-linux-musl, no C code in the dependencies) was tried and works too, but
//! it is a second full release build of the tracer (3 minutes on 2 cores, against seconds
//! for the whole container test) of a program the rest of CI does not test, with musl's
//! slower allocator under the tracer's symbolization.
//!
//! Needs root and podman with runc (`cargo xtask setup` installs podman, runc and
//! busybox-static). Without them it is skipped with the reason, except under CI=true,
//! where it fails. Every command is printed before it runs.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{release_dir, workspace_root};

/// The one Dockerfile of the repository; `docker build` takes it as well.
const DOCKERFILE: &str = "tests/docker/Dockerfile";
const IMAGE: &str = "localhost/tracer-smoke:test";
/// These machines mount cgroup v1, which crun (podman's default runtime) refuses; runc
/// works with v1 and v2.
const RUNTIME: &str = "/usr/sbin/runc";
/// Collections gc-demo runs in the smoke script (its default).
const GCS: u64 = 10;
/// Longest a smoke run may take (it takes a second or two).
const RUN_TIMEOUT_S: u32 = 120;

#[derive(clap::Args, Debug, Default)]
pub struct ContainerArgs {
    /// Only make the build context (target/container/context), for `docker build`.
    #[arg(long)]
    context_only: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PidMode {
    Host,
    Own,
    /// No container: a new PID namespace on the host.
    Unshare,
}

impl PidMode {
    fn name(self) -> &'static str {
        match self {
            PidMode::Host => "host PID namespace (--pid=host)",
            PidMode::Own => "the container's own PID namespace",
            PidMode::Unshare => "a new PID namespace on the host (unshare)",
        }
    }

    fn dir(self) -> &'static str {
        match self {
            PidMode::Host => "out-pid-host",
            PidMode::Own => "out-pid-own",
            PidMode::Unshare => "out-unshare",
        }
    }
}

/// `cargo xtask container`: set up, build, then the container test.
pub fn run(args: ContainerArgs) -> Result<()> {
    crate::build()?;
    run_built(args)
}

/// The container test, with the release binaries already built.
pub fn run_built(args: ContainerArgs) -> Result<()> {
    let root = workspace_root().join("target/container");
    if args.context_only {
        let context = make_context(&root.join("context"))?;
        eprintln!(
            "xtask container: build context in {}; build it with -f {DOCKERFILE}",
            context.display()
        );
        return Ok(());
    }
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if let Err(reason) = preflight() {
        if in_ci {
            bail!("the container smoke test cannot run: {reason:#}; CI must run it");
        }
        eprintln!("xtask container: SKIPPED: {reason:#}");
        return Ok(());
    }
    let conf = root.join("containers.conf");
    std::fs::create_dir_all(&root)?;
    // The container runtime may not set rlimits on these machines: no default ulimits.
    std::fs::write(&conf, "[containers]\ndefault_ulimits = []\n")?;

    let started = Instant::now();
    let context = make_context(&root.join("context"))?;
    podman(
        &conf,
        &[
            "build",
            "--network",
            "none",
            "-t",
            IMAGE,
            "-f",
            &workspace_root().join(DOCKERFILE).display().to_string(),
            &context.display().to_string(),
        ],
    )?;
    // Each build leaves the previous image untagged.
    let _ = podman_quiet(&conf, &["image", "prune", "-f"]);
    let build_time = started.elapsed();
    eprintln!(
        "xtask container: image built in {:.1} s",
        build_time.as_secs_f64()
    );

    let mut summary = vec![format!("image build {:.1} s", build_time.as_secs_f64())];
    for mode in [PidMode::Host, PidMode::Own, PidMode::Unshare] {
        let out = root.join(mode.dir());
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)?;
        let started = Instant::now();
        let result = match mode {
            PidMode::Unshare => unshared_run(&out),
            _ => smoke_run(&conf, mode, &out),
        };
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(checked) => {
                eprintln!("xtask container: PASS in {}: {checked}", mode.name());
                summary.push(format!("{}: pass ({took:.1} s)", mode.name()));
            }
            Err(err) => {
                return Err(err.context(format!("the smoke test in {}", mode.name())));
            }
        }
    }
    eprintln!("xtask container: {}", summary.join("; "));
    Ok(())
}

/// Why the test cannot run here, if it cannot: not root (eBPF), no podman or runc, or a
/// podman that cannot work.
fn preflight() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    ensure!(
        euid == 0,
        "not root (the tracer in the container loads eBPF programs)"
    );
    ensure!(
        Path::new(RUNTIME).is_file(),
        "no {RUNTIME} (cargo xtask setup installs runc)"
    );
    let info = Command::new("podman")
        .args([
            "--runtime",
            RUNTIME,
            "info",
            "--format",
            "{{.Host.OCIRuntime.Name}}",
        ])
        .env("CONTAINERS_CONF", "/dev/null")
        .output()
        .context("cannot run podman (cargo xtask setup installs it)")?;
    ensure!(
        info.status.success(),
        "`podman info` failed ({}): {}",
        info.status,
        String::from_utf8_lossy(&info.stderr).trim()
    );
    Ok(())
}

/// Fills the build context: the binaries, their shared libraries under rootfs/ at the
/// paths ldd resolves, a static busybox, the smoke script.
fn make_context(dir: &Path) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let busybox = Path::new("/bin/busybox");
    ensure!(
        busybox.is_file(),
        "no /bin/busybox (cargo xtask setup installs busybox-static)"
    );
    ensure!(
        shared_libraries(busybox)?.is_empty(),
        "/bin/busybox is linked dynamically: the image needs busybox-static's \
         (apt-get install busybox-static)"
    );
    std::fs::copy(busybox, dir.join("busybox"))?;
    for bin in ["tracer", "gc-demo"] {
        let path = release_dir().join(bin);
        std::fs::copy(&path, dir.join(bin))
            .with_context(|| format!("cannot copy {}", path.display()))?;
        for lib in shared_libraries(&path)? {
            let to = rootfs.join(lib.strip_prefix("/").expect("ldd paths are absolute"));
            std::fs::create_dir_all(to.parent().expect("a file in a directory"))?;
            // A copy of what the path resolves to, under the name the loader looks for.
            std::fs::copy(&lib, &to)
                .with_context(|| format!("cannot copy {} (needed by {bin})", lib.display()))?;
        }
    }
    std::fs::copy(
        workspace_root().join("tests/smoke.sh"),
        dir.join("smoke.sh"),
    )?;
    Ok(dir.to_path_buf())
}

/// The shared libraries (and the loader) `ldd` says `binary` loads; none for a static one.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // glibc's ldd says "not a dynamic executable" on stderr (and fails), "statically
    // linked" for a static PIE.
    let said = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    if said.contains("not a dynamic executable") || said.contains("statically linked") {
        return Ok(Vec::new());
    }
    ensure!(
        out.status.success(),
        "ldd {} failed: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut libs = Vec::new();
    for line in text.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2
        // (0x...)`, or the vDSO (no file).
        let target = line.split_once("=>").map_or(line, |(_, to)| to).trim();
        ensure!(
            !target.starts_with("not found"),
            "{} needs a library this machine lacks: {}",
            binary.display(),
            line.trim()
        );
        let path = target.split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

fn podman_command(conf: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", conf)
        .args(["--runtime", RUNTIME])
        .args(args);
    cmd
}

fn shown(conf: &Path, args: &[&str]) -> String {
    format!(
        "CONTAINERS_CONF={} podman --runtime {RUNTIME} {}",
        conf.display(),
        args.join(" ")
    )
}

/// Runs podman, printing the command first and its output as it comes.
fn podman(conf: &Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask container: + {}", shown(conf, args));
    let status = podman_command(conf, args)
        .status()
        .context("cannot run podman")?;
    ensure!(
        status.success(),
        "`{}` failed ({status})",
        shown(conf, args)
    );
    Ok(())
}

fn podman_quiet(conf: &Path, args: &[&str]) -> Result<()> {
    let status = podman_command(conf, args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    ensure!(status.success());
    Ok(())
}

/// One smoke run in the container, then the checks of what it left in `out`; returns
/// what was checked.
fn smoke_run(conf: &Path, mode: PidMode, out: &Path) -> Result<String> {
    let name = match mode {
        PidMode::Host => "tracer-smoke-pid-host",
        PidMode::Own | PidMode::Unshare => "tracer-smoke-pid-own",
    };
    // A container a killed earlier run left behind would hold the name.
    let _ = podman_quiet(conf, &["rm", "-f", name]);
    let volume = format!("{}:/out", out.display());
    let mut args = vec!["run", "--rm", "--name", name, "--privileged"];
    if mode == PidMode::Host {
        args.push("--pid=host");
    }
    args.extend(["--network", "none", "-v", &volume, IMAGE]);
    let timeout = RUN_TIMEOUT_S.to_string();
    eprintln!(
        "xtask container: {}:\nxtask container: + {}",
        mode.name(),
        shown(conf, &args)
    );
    let status = Command::new("timeout")
        .args(["--kill-after=10", &timeout, "podman"])
        .env("CONTAINERS_CONF", conf)
        .args(["--runtime", RUNTIME])
        .args(&args)
        .status()
        .context("cannot run podman")?;
    if status.code() == Some(124) {
        bail!("the smoke run did not end within {RUN_TIMEOUT_S} s");
    }
    ensure!(
        status.success(),
        "the smoke script failed in the container ({status})"
    );
    check_results(out, mode)
}

/// The smoke script on the host in a new PID namespace (with its own /proc), then the
/// checks of what it left in `out`.
fn unshared_run(out: &Path) -> Result<String> {
    let timeout = RUN_TIMEOUT_S.to_string();
    let mut command = Command::new("timeout");
    command
        .args(["--kill-after=10", &timeout])
        .args(["unshare", "--pid", "--fork", "--mount-proc", "sh"])
        .arg(workspace_root().join("tests/smoke.sh"))
        .env("OUT", out)
        .env("TRACER", release_dir().join("tracer"))
        .env("GC_DEMO", release_dir().join("gc-demo"));
    eprintln!("xtask container: + {command:?}");
    let status = command.status().context("cannot run unshare")?;
    if status.code() == Some(124) {
        bail!("the smoke run did not end within {RUN_TIMEOUT_S} s");
    }
    ensure!(
        status.success(),
        "the smoke script failed in a new PID namespace ({status})"
    );
    check_results(out, PidMode::Unshare)
}

/// gc-demo's ground truth (the JSON line it prints at the end).
struct Truth {
    pid: u64,
    gcs: u64,
    /// Each pause, from just before `gc__begin` to just after `gc__end`.
    pause_ns: Vec<u64>,
    /// Each pause, from just after `gc__begin` to just before `gc__end`.
    pause_inner_ns: Vec<u64>,
    /// Task id -> (thread id, runs).
    tasks: BTreeMap<u64, (u64, u64)>,
}

fn read_truth(dir: &Path) -> Result<Truth> {
    let path = dir.join("demo.out");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the smoke run left no {}", path.display()))?;
    let ready: u64 = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("ready pid="))
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("no `ready pid=` line in {}", path.display()))?;
    let json = text
        .lines()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no measurements (JSON line) in {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(json)
        .with_context(|| format!("gc-demo's measurements in {}", path.display()))?;
    let num = |v: &serde_json::Value, key: &str| {
        v[key]
            .as_u64()
            .with_context(|| format!("no {key} in gc-demo's measurements"))
    };
    let pid = num(&v, "pid")?;
    ensure!(
        pid == ready,
        "gc-demo said `ready pid={ready}`, then pid {pid}"
    );
    let mut tasks = BTreeMap::new();
    for task in v["tasks"]
        .as_array()
        .context("no tasks in gc-demo's measurements")?
    {
        tasks.insert(num(task, "id")?, (num(task, "tid")?, num(task, "runs")?));
    }
    Ok(Truth {
        pid,
        gcs: num(&v, "gcs")?,
        pause_ns: v["pause_ns"]
            .as_array()
            .context("no pause_ns")?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect(),
        pause_inner_ns: v["pause_inner_ns"]
            .as_array()
            .context("no pause_inner_ns")?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect(),
        tasks,
    })
}

/// A duration as the report prints it (`9.99ms`, `56.9us`, `2.41s`, `850ns`), in ns.
fn parse_duration(text: &str) -> Option<f64> {
    let text = text.trim().trim_end_matches(',');
    let (number, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .into_iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|n| (n, scale)))?;
    Some(number.parse::<f64>().ok()? * scale)
}

/// Checks the report, flamegraph and folded stacks in `dir` against gc-demo's truth.
fn check_results(dir: &Path, mode: PidMode) -> Result<String> {
    let truth = read_truth(dir)?;
    let report_path = dir.join("report.txt");
    let report = std::fs::read_to_string(&report_path)
        .with_context(|| format!("the smoke run left no {}", report_path.display()))?;
    let lines: Vec<&str> = report.lines().collect();
    let fail = |what: String| -> anyhow::Error {
        anyhow::anyhow!("{what}\n--- {}:\n{report}", report_path.display())
    };
    let mut checked = String::new();

    ensure!(
        truth.gcs == GCS,
        "gc-demo ran {} collections, the smoke script asks for {GCS}",
        truth.gcs
    );
    // The target as it sees itself: in its own PID namespace that is the namespace's pid.
    let traced = format!("Traced process {} (gc-demo)", truth.pid);
    if !report.contains(&traced) {
        return Err(fail(format!(
            "the report does not say `{traced}` (gc-demo's pid, as it sees it)"
        )));
    }
    let gc_line = format!("GC: {} collections,", truth.gcs);
    if !report.contains(&gc_line) {
        return Err(fail(format!("expected `{gc_line}` in the report")));
    }
    write!(checked, "{} GCs (gc-demo: {})", truth.gcs, truth.gcs)?;

    // Every latency histogram: its buckets add up to one per collection, and so does its
    // count line; the pause histogram's min and max are gc-demo's own.
    for latency in ["gc_pause", "gc_stop_the_world", "gc_mark", "gc_sweep"] {
        let header = format!("@{latency}_us:");
        let start = lines
            .iter()
            .position(|l| l.trim_end() == header)
            .ok_or_else(|| fail(format!("no {header} histogram in the report")))?;
        let mut sum = 0;
        let mut count_line = None;
        for line in &lines[start + 1..] {
            if let Some(rest) = line.strip_prefix("count ") {
                count_line = Some(rest);
                break;
            }
            // `[8K, 16K)    10 |@@@...|`, or `[1]    2 |@@...|` for a single value.
            let bucket = line
                .split_once([')', ']'])
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| fail(format!("unexpected line in {header}: {line:?}")))?;
            sum += bucket;
        }
        let count_line = count_line.ok_or_else(|| fail(format!("{header} has no `count` line")))?;
        let count: u64 = count_line
            .split(',')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| fail(format!("cannot read {header}'s count")))?;
        if count != truth.gcs || sum != truth.gcs {
            return Err(fail(format!(
                "{header}: count {count}, buckets adding up to {sum}; gc-demo ran {} collections",
                truth.gcs
            )));
        }
        if latency == "gc_pause" {
            let field = |name: &str| {
                count_line
                    .split(',')
                    .find_map(|f| f.trim().strip_prefix(name))
                    .and_then(parse_duration)
            };
            let (min, max) = (field("min "), field("max "));
            let extreme = |list: &[u64], pick: fn(u64, u64) -> u64| {
                list.iter().copied().reduce(pick).map(|ns| ns as f64)
            };
            let (outer_min, outer_max) = (
                extreme(&truth.pause_ns, u64::min).context("no pauses")?,
                extreme(&truth.pause_ns, u64::max).context("no pauses")?,
            );
            let (inner_min, inner_max) = (
                extreme(&truth.pause_inner_ns, u64::min).context("no pauses")?,
                extreme(&truth.pause_inner_ns, u64::max).context("no pauses")?,
            );
            // The probes' programs run inside the traps, so each pause lies between
            // gc-demo's clock readings just outside the probes and just inside them,
            // however long the collector was preempted around a probe (2.6 ms seen on two
            // busy CPUs); so do the shortest and the longest. But for the 3 significant
            // digits they are printed to.
            let inside = |seen: Option<f64>, outer: f64, inner: f64| {
                seen.is_some_and(|s| s <= outer * 1.005 && s >= inner * 0.995)
            };
            if !inside(min, outer_min, inner_min) || !inside(max, outer_max, inner_max) {
                return Err(fail(format!(
                    "{header}: min/max {min:?}/{max:?} ns, gc-demo measured {inner_min} to \
                     {outer_min} / {inner_max} to {outer_max} ns"
                )));
            }
        }
        write!(checked, ", {latency} {count}")?;
    }

    // Tasks: each worker's runs and parks, as gc-demo counted its rt__run__task.
    let tasks_at = lines
        .iter()
        .position(|l| l.starts_with("Tasks:"))
        .ok_or_else(|| fail("no Tasks table in the report".into()))?;
    let mut seen_tasks = BTreeMap::new();
    for line in lines[tasks_at + 2..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [task, .., parks, runs] = fields[..] else {
            return Err(fail(format!("unexpected task row {line:?}")));
        };
        let parse = |s: &str| s.parse::<u64>().ok();
        match (parse(task), parse(parks), parse(runs)) {
            (Some(t), Some(p), Some(r)) => seen_tasks.insert(t, (p, r)),
            _ => return Err(fail(format!("unexpected task row {line:?}"))),
        };
    }
    for (task, &(_, runs)) in &truth.tasks {
        if seen_tasks.get(task) != Some(&(runs, runs)) {
            return Err(fail(format!(
                "task {task}: (parks, runs) {:?} in the report, gc-demo ran it {runs} times",
                seen_tasks.get(task)
            )));
        }
        write!(checked, ", task {task} {runs} runs")?;
    }

    // Threads, by the ids gc-demo itself read (gettid): the namespace's in its own.
    let threads_at = lines
        .iter()
        .position(|l| l.starts_with("Threads:"))
        .ok_or_else(|| fail("no Threads table in the report".into()))?;
    let tids: Vec<u64> = lines[threads_at + 2..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let mut want: Vec<u64> = truth.tasks.values().map(|&(tid, _)| tid).collect();
    want.push(truth.pid);
    if let Some(missing) = want.iter().find(|tid| !tids.contains(tid)) {
        return Err(fail(format!(
            "thread {missing} of gc-demo (as it numbers its threads) is not in the Threads table"
        )));
    }
    write!(
        checked,
        ", threads {want:?} by gc-demo's own ids ({})",
        match mode {
            PidMode::Host => "host pids",
            PidMode::Own => "the container's pids",
            PidMode::Unshare => "the namespace's pids",
        }
    )?;

    // The off-CPU flamegraph and its folded stacks, with where the workers block.
    let profile = dir.join("profile");
    let svg = std::fs::read_to_string(profile.join("offcpu.svg"))
        .with_context(|| format!("no {}/offcpu.svg", profile.display()))?;
    let folded = std::fs::read_to_string(profile.join("offcpu.folded"))
        .with_context(|| format!("no {}/offcpu.folded", profile.display()))?;
    ensure!(svg.contains("<svg"), "offcpu.svg is not an SVG");
    for function in ["sleep_in_demo_io", "wait_for_demo_lock"] {
        ensure!(
            svg.contains(function) && folded.contains(function),
            "{function} (where gc-demo's workers block) is not in offcpu.svg and offcpu.folded"
        );
    }
    write!(
        checked,
        ", offcpu.svg ({} bytes) with sleep_in_demo_io and wait_for_demo_lock",
        svg.len()
    )?;
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory like the one a smoke run leaves: the report and gc-demo's truth of a
    /// real run (testdata/smoke), edited by `edit`, and small stand-ins for the profile.
    fn results(edit: impl Fn(String) -> String) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtask-smoke-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("profile")).unwrap();
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/smoke");
        let report = std::fs::read_to_string(data.join("report.txt")).unwrap();
        std::fs::write(dir.join("report.txt"), edit(report)).unwrap();
        std::fs::copy(data.join("demo.out"), dir.join("demo.out")).unwrap();
        let stacks = "gc-demo;sleeper_thread;sleep_in_demo_io 10\n\
                      gc-demo;lock_waiter_thread;wait_for_demo_lock 10\n";
        std::fs::write(dir.join("profile/offcpu.folded"), stacks).unwrap();
        std::fs::write(
            dir.join("profile/offcpu.svg"),
            format!("<svg>{stacks}</svg>"),
        )
        .unwrap();
        dir
    }

    fn check(edit: impl Fn(String) -> String) -> Result<String> {
        let dir = results(edit);
        let result = check_results(&dir, PidMode::Host);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    #[test]
    fn a_real_run_passes() {
        let checked = check(|r| r).unwrap();
        assert!(checked.starts_with("10 GCs"), "{checked}");
    }

    /// Stacks the kernel could not take are the report's last paragraph, after the tasks.
    #[test]
    fn a_run_with_losses_passes() {
        let checked = check(|r| {
            r + "\nNot recorded: 0 events lost, 0 map-full drops, 6 stack capture errors, \
                 0 argument read errors.\n"
        })
        .unwrap();
        assert!(checked.contains("task 3"), "{checked}");
    }

    #[test]
    fn every_miscount_fails() {
        type Edit = fn(String) -> String;
        let cases: [(&str, Edit); 6] = [
            ("GC: 10 collections", |r| {
                r.replace("GC: 10 collections", "GC: 9 collections")
            }),
            ("@gc_mark_us:", |r| {
                r.replace("[4K, 8K)              10", "[4K, 8K)               9")
            }),
            ("task 3", |r| {
                r.replace("324ms       6       6", "324ms       6       5")
            }),
            ("max", |r| {
                r.replace("max 10.0ms, p50 10.0ms", "max 12.0ms, p50 10.0ms")
            }),
            ("thread 24844", |r| r.replace("24844", "99999")),
            ("Traced process 24811", |r| {
                r.replace("process 24811", "process 1")
            }),
        ];
        for (what, edit) in cases {
            let err = format!("{:#}", check(edit).expect_err(what));
            assert!(err.contains(what), "{what}: {err}");
        }
    }

    #[test]
    fn durations_as_printed() {
        assert_eq!(parse_duration("9.99ms"), Some(9_990_000.0));
        assert_eq!(parse_duration("56.9us,"), Some(56_900.0));
        assert_eq!(parse_duration("2.41s"), Some(2_410_000_000.0));
        assert_eq!(parse_duration("850ns"), Some(850.0));
    }
}
