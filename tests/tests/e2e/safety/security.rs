//! Security end to end (issue 6): what the tracer needs and says when it lacks it, what it
//! may change in a target (only its USDT semaphores, plus the kernel's uprobe breakpoints
//! while attached), and how it creates its output files (the user's umask, never through
//! a symlink planted at the output path).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    os::unix::fs::{FileExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
};

use crate::common::*;

/// setpriv's arguments to become `nobody` with no capabilities at all.
const NOBODY: [&str; 4] = [
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
];

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Copies of the tracer and usdt-args that `nobody` can reach whatever the permissions of
/// the checkout (a home directory is often closed to others).
struct PublicBins {
    tracer: PathBuf,
    usdt_args: PathBuf,
}

fn public_bins() -> &'static PublicBins {
    static BINS: OnceLock<PublicBins> = OnceLock::new();
    BINS.get_or_init(|| {
        let dir = out_dir("bins");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = |from: &Path, name: &str| {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
            to
        };
        PublicBins {
            tracer: copy(&tracer_bin(), "tracer"),
            usdt_args: copy(Path::new(USDT_ARGS), "usdt-args"),
        }
    })
}

/// Runs the tracer as an unprivileged user: as root, as `nobody`; otherwise as ourselves.
fn run_unprivileged(args: &[&str]) -> Output {
    if !is_root() {
        return Command::new(tracer_bin()).args(args).output().unwrap();
    }
    Command::new("setpriv")
        .args(NOBODY)
        .arg(&public_bins().tracer)
        .args(args)
        .output()
        .expect("setpriv (util-linux) is needed to drop privileges")
}

/// Runs the tracer as root with only the capabilities `caps` (setpriv names, e.g. `bpf`).
fn run_with_only(caps: &[&str], args: &[&str]) -> Output {
    let bounding: String = caps.iter().map(|c| format!(",+{c}")).collect();
    Command::new("setpriv")
        .args(["--inh-caps=-all", &format!("--bounding-set=-all{bounding}")])
        .arg(tracer_bin())
        .args(args)
        .output()
        .expect("setpriv (util-linux) is needed to drop capabilities")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Without root or CAP_BPF+CAP_PERFMON, `attach` and `trace` (by PID, by path, with a
/// command) exit 1 with one sentence naming what is missing, before doing anything: the
/// command after `--` is not run.
#[test]
fn without_privileges_attach_and_trace_name_what_is_missing() {
    let dir = out_dir("noprivs");
    // Writable by anyone, so only the tracer's refusal can keep the marker from existing.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = dir.join("the-command-ran");
    let consts = format!("usdt:{USDT_ARGS}:tracer_test:consts");
    let commands: Vec<Vec<&str>> = vec![
        vec!["attach", "--pid", "1"],
        vec!["trace", "--pid", "1", "usdt:*:tracer:gc__begin"],
        vec!["trace", "--count", &consts],
        vec!["trace", &consts, "--", "touch", marker.to_str().unwrap()],
    ];
    for args in &commands {
        let out = run_unprivileged(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("root")
                && err.contains("CAP_BPF")
                && err.contains("CAP_PERFMON")
                && err.contains("missing: CAP_BPF, CAP_PERFMON"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    assert!(!marker.exists(), "the command ran without the tracer");
}

/// With one of CAP_BPF and CAP_PERFMON only (root drops the rest), `attach` and `trace`
/// name the other.
#[privileged_test]
fn with_one_of_the_two_capabilities_the_other_is_named() {
    require_privileged();
    let commands: [&[&str]; 2] = [
        &["attach", "--pid", "1"],
        &["trace", "--pid", "1", "usdt:*:tracer:gc__begin"],
    ];
    for (have, missing) in [("bpf", "CAP_PERFMON"), ("perfmon", "CAP_BPF")] {
        for args in commands {
            let out = run_with_only(&[have], args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains(&format!("(missing: {missing})")), "{err}");
        }
    }
}

/// With exactly CAP_BPF and CAP_PERFMON (what the README and the privilege check promise
/// is enough), `trace` works: USDT sites attach through uprobe_multi links, which these two
/// capabilities allow (the uprobe PMU would want CAP_SYS_ADMIN on this kernel, 6.18).
#[privileged_test]
fn with_cap_bpf_and_cap_perfmon_trace_works() {
    require_privileged();
    let out = run_with_only(
        &["bpf", "perfmon"],
        &[
            "trace",
            "--count",
            "--format",
            "json",
            &format!("usdt:{USDT_ARGS}:tracer_test:consts"),
            "--",
            USDT_ARGS,
            "--loops",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(":tracer_test:consts\":3"), "{stdout}");
}

/// `list` only reads ELF files and /proc: it needs no privileges for a file or for one's
/// own process, and another user's process is a clear error, not a panic.
#[test]
fn list_needs_no_privileges() {
    let usdt_args = public_bins().usdt_args.to_str().unwrap();
    let out = run_unprivileged(&["list", usdt_args]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("usdt:{usdt_args}:tracer_test:consts")),
        "{text}"
    );
    let out = run_unprivileged(&[
        "list",
        "-v",
        &format!("usdt:{usdt_args}:tracer_test:guarded"),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("semaphore 0x"));

    // A process of the same unprivileged user.
    let mut own = if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(NOBODY).arg(usdt_args);
        cmd
    } else {
        Command::new(usdt_args)
    };
    let mut own = own
        .arg("--wait-for-signal")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(own.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = line.trim().strip_prefix("ready pid=").unwrap().to_string();
    let out = run_unprivileged(&["list", "--pid", &pid, "tracer_test:consts"]);
    let _ = own.kill();
    let _ = own.wait();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(":tracer_test:consts"));

    // Someone else's process (init, root's).
    let out = run_unprivileged(&["list", "--pid", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/proc/1/") && err.contains("Permission denied"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Every readable page of process `pid`, by address (the kernel's [vvar] pages, which
/// change by themselves, left out).
fn snapshot(pid: u32) -> BTreeMap<u64, Vec<u8>> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut pages = BTreeMap::new();
    for line in std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let name = fields.get(5).copied().unwrap_or("");
        if !fields[1].starts_with('r') || name.starts_with("[vvar") || name == "[vsyscall]" {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let (start, end) = (
            u64::from_str_radix(start, 16).unwrap(),
            u64::from_str_radix(end, 16).unwrap(),
        );
        for page in (start..end).step_by(4096) {
            let mut buf = vec![0; 4096];
            // Pages past the end of a mapped file cannot be read: skip them.
            if mem.read_exact_at(&mut buf, page).is_ok() {
                pages.insert(page, buf);
            }
        }
    }
    pages
}

/// Addresses whose byte differs between two snapshots, with (before, after) bytes.
fn changes(before: &BTreeMap<u64, Vec<u8>>, after: &BTreeMap<u64, Vec<u8>>) -> Vec<(u64, u8, u8)> {
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the readable pages changed"
    );
    let mut out = Vec::new();
    for (page, old) in before {
        let new = &after[page];
        for (i, (a, b)) in old.iter().zip(new).enumerate() {
            if a != b {
                out.push((page + i as u64, *a, *b));
            }
        }
    }
    out
}

/// The whole memory of a target blocked before its workload (so it changes nothing
/// itself), read through /proc/PID/mem before, while and after a tracer is attached:
/// while attached, the only bytes that differ are the first bytes of probe sites (now
/// the uprobe breakpoint, 0xcc), USDT semaphores (raised) and the dynamic loader's
/// `_dl_debug_state` (where a `dlopen` is held until the new library is attached); after
/// the tracer detached, not one byte differs. For `trace --pid` on every probe of
/// usdt-args (every site gets a breakpoint) and for `attach` on gc-demo.
#[privileged_test]
fn a_target_is_changed_only_at_semaphores_and_probe_sites_and_only_while_attached() {
    require_privileged();
    let dir = out_dir("memory");
    let cases: [(&str, &[&str], &str); 2] = [
        (USDT_ARGS, &["--loops", "2"], "trace"),
        (GC_DEMO, &["--gcs", "2"], "attach"),
    ];
    for (program, target_args, command) in cases {
        let target = Target::start(program, target_args);
        let pid = target.pid.to_string();
        let probes = ProbeSites::of(target.pid);
        let before = snapshot(target.pid);
        let args: Vec<&str> = match command {
            "trace" => vec![
                "trace",
                "--format",
                "json",
                "--pid",
                &pid,
                "usdt:*:tracer_test:*",
            ],
            _ => vec![
                "attach",
                "--format",
                "json",
                "--pid",
                &pid,
                "-o",
                dir.to_str().unwrap(),
            ],
        };
        let tracer = Tracer::start(&args);
        let during = snapshot(target.pid);
        send_signal(tracer.pid(), libc::SIGINT);
        let (ok, _, err) = tracer.finish();
        assert!(ok, "{err}");
        let after = snapshot(target.pid);

        let attached = changes(&before, &during);
        let loader_hold = dl_debug_state_address(target.pid);
        let (mut breakpoints, mut raised) = (0, BTreeSet::new());
        for &(address, old, new) in &attached {
            if Some(address) == loader_hold {
                assert_eq!(new, 0xcc, "{program}: _dl_debug_state {old:#x} -> {new:#x}");
            } else if probes.is_site(address) {
                assert_eq!(
                    new, 0xcc,
                    "{program}: site {address:#x}: {old:#x} -> {new:#x}"
                );
                breakpoints += 1;
            } else if let Some(&semaphore) = probes
                .semaphores
                .iter()
                .find(|&&s| s == address || s + 1 == address)
            {
                raised.insert(semaphore);
            } else {
                panic!("{program}: {address:#x} changed from {old:#x} to {new:#x}");
            }
        }
        assert!(
            breakpoints > 0 && !raised.is_empty(),
            "{program}: {attached:x?}"
        );
        if command == "trace" {
            assert_eq!(breakpoints, probes.sites.len(), "every site of usdt-args");
        }
        assert_eq!(
            changes(&before, &after),
            [],
            "{program}: changed after detaching"
        );

        target.release();
        target.finish();
    }
}

fn send_signal(pid: u32, signal: i32) {
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

/// Runs `tracer attach --pid PID --duration 300ms -o DIR` under umask `umask`.
fn attach_briefly(pid: u32, dir: &Path, umask: &str) -> Output {
    Command::new("sh")
        .args(["-c", &format!("umask {umask} && exec \"$0\" \"$@\"")])
        .arg(tracer_bin())
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "--duration",
            "300ms",
            "-o",
        ])
        .arg(dir)
        .output()
        .unwrap()
}

/// Output files get the user's umask: 0600 under umask 077, 0644 under 022 (and the
/// output directory the tracer creates 0700 and 0755), never an execute bit.
#[privileged_test]
fn output_files_follow_the_umask() {
    require_privileged();
    let target = Target::start(GC_DEMO, &["--gcs", "100000"]);
    target.release();
    let parent = out_dir("umask");
    for (umask, file_mode, dir_mode) in [("077", 0o600, 0o700), ("022", 0o644, 0o755)] {
        let dir = parent.join(format!("created-{umask}"));
        let out = attach_briefly(target.pid, &dir, umask);
        assert!(out.status.success(), "{}", stderr(&out));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), dir_mode, "umask {umask}: {}", dir.display());
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(files.iter().any(|f| f.ends_with("offcpu.svg")), "{files:?}");
        assert!(files.iter().any(|f| f.ends_with("offcpu.folded")));
        for file in files {
            assert_eq!(mode(&file), file_mode, "umask {umask}: {}", file.display());
        }
    }
}

/// A symlink planted at any output path (each file a normal run writes, to an existing
/// file; and offcpu.svg to a path that does not exist yet) is not followed: the tracer
/// fails with a message naming it, exit 1, and the victim is untouched (or not created);
/// the report of what it measured is still printed.
#[privileged_test]
fn a_symlink_planted_at_an_output_path_is_not_followed() {
    require_privileged();
    let target = Target::start(GC_DEMO, &["--gcs", "100000"]);
    target.release();
    let parent = out_dir("symlink");
    // What a normal run writes.
    let reference = parent.join("reference");
    let out = attach_briefly(target.pid, &reference, "022");
    assert!(out.status.success(), "{}", stderr(&out));
    let mut names: Vec<String> = std::fs::read_dir(&reference)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 2, "{names:?}");

    let victim = parent.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let absent = parent.join("not-to-be-created");
    let mut cases: Vec<(&str, &Path)> = names.iter().map(|n| (n.as_str(), &*victim)).collect();
    cases.push(("offcpu.svg", &absent));
    // The runs are independent: at once, to save the ~2 s each takes.
    std::thread::scope(|s| {
        for (case, (name, link_to)) in cases.into_iter().enumerate() {
            let (parent, pid) = (&parent, target.pid);
            s.spawn(move || {
                let dir = parent.join(format!("case-{case}"));
                std::fs::create_dir(&dir).unwrap();
                let link = dir.join(name);
                std::os::unix::fs::symlink(link_to, &link).unwrap();
                let out = attach_briefly(pid, &dir, "022");
                let err = stderr(&out);
                let what = format!("{name} -> {}", link_to.display());
                assert_eq!(out.status.code(), Some(1), "{what}: {err}");
                assert!(
                    err.contains(&format!("{} is a symbolic link", link.display())),
                    "{what}: {err}"
                );
                assert!(!err.contains("panicked"), "{err}");
                let report = String::from_utf8_lossy(&out.stdout);
                assert!(report.contains("GC: "), "{what}: no report:\n{report}");
                assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
            });
        }
    });
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!absent.exists(), "created through a dangling symlink");
}

/// Where the dynamic loader's `_dl_debug_state` is in process `pid`, as the tracer finds it
/// (the loader named by the executable's PT_INTERP, the symbol's file offset).
fn dl_debug_state_address(pid: u32) -> Option<u64> {
    let interp = tracer_usdt::interpreter(Path::new(&format!("/proc/{pid}/exe")))?;
    let loader = std::fs::canonicalize(&interp).ok()?;
    let offset = tracer_usdt::dl_debug_state_offset(&loader)?;
    exe_mappings_of(pid, &loader)
        .into_iter()
        .find(|m| m.2 <= offset && offset < m.2 + (m.1 - m.0))
        .map(|m| m.0 + offset - m.2)
}

/// The executable mappings of `file` in process `pid`: (start, end, file offset).
fn exe_mappings_of(pid: u32, file: &Path) -> Vec<(u64, u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (range, perms, offset, path) = (fields[0], fields[1], fields[2], fields.get(5)?);
            if !perms.contains('x') || Path::new(path) != file {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(offset, 16).ok()?,
            ))
        })
        .collect()
}

/// The link keeper reads `tracer-keeper` in `ps`, and holds nothing the tracer's caller
/// left open: a pipe's reader is not kept waiting by it.
#[privileged_test]
fn the_keeper_is_named_and_inherits_no_descriptor() {
    require_privileged();
    let target = Target::start(GC_DEMO, &["--gcs", "1000"]);
    let (reader, writer) = {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes (no O_CLOEXEC: the
        // tracer inherits the write end, as from a careless caller).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    let probe = format!("usdt:{GC_DEMO}:tracer:gc__begin");
    let tracer = TracerRun::trace()
        .pid(target.pid)
        .args(["--count", &probe])
        .start();
    let keeper = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok())
                    == Some(tracer.pid())
            })
        })
        .expect("the tracer has a keeper");
    let comm = std::fs::read_to_string(format!("/proc/{keeper}/comm")).unwrap();
    let pipe = std::fs::read_link(format!("/proc/self/fd/{writer}")).unwrap();
    let held: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{keeper}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .collect();
    // SAFETY: the two ends are ours, closed once.
    unsafe {
        libc::close(reader);
        libc::close(writer);
    }
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let _ = tracer.finish();
    drop(target);
    assert_eq!(comm.trim_end(), "tracer-keeper");
    assert!(!held.contains(&pipe), "the keeper holds {pipe:?}: {held:?}");
}
