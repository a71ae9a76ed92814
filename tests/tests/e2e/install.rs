//! `cargo xtask install --prefix DIR`: the binary, man pages a reader opens with `man`,
//! and completion scripts each shell loads; the same files as a `.deb` (`cargo xtask
//! deb`); and the statically linked build a user copies to a server (`cargo xtask static`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::common::{GC_DEMO, TracerRun, attach_json_by};

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Runs `cargo xtask TASK`, failing the test with its output when it fails.
fn xtask(task: &[&str]) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .arg("xtask")
        .args(task)
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo xtask {task:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The path a task printed after `PREFIX: `, on its last such line.
fn printed_path(out: &Output, prefix: &str) -> PathBuf {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {out:?}"))
        .into()
}

/// Fails the test unless it runs as root: installing a package and loading eBPF need it.
/// No watchdog: the static build alone can take minutes on a cold machine.
fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "not root: dpkg -i and loading eBPF need root (cargo xtask test runs as root)"
    );
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    out
}

#[test]
#[ignore = "builds and installs the tracer with cargo xtask: run with --include-ignored (cargo xtask test does)"]
fn install_puts_the_binary_man_pages_and_completions_under_the_prefix() {
    let prefix = std::env::temp_dir().join(format!("tracer-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    xtask(&["install", "--prefix", prefix.to_str().unwrap()]);

    let version = Command::new(prefix.join("bin/tracer"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("tracer "));

    let man = prefix.join("share/man/man1");
    for page in [
        "tracer",
        "tracer-attach",
        "tracer-list",
        "tracer-trace",
        "tracer-profile",
        "tracer-stacks",
    ] {
        let shown = Command::new("man")
            .arg("-l")
            .arg(man.join(format!("{page}.1")))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.status.success() && text.contains("NAME") && text.contains(page),
            "{page}: {shown:?}"
        );
    }

    let bash = prefix.join("share/bash-completion/completions/tracer");
    let complete = Command::new("bash")
        .arg("-c")
        .arg(format!("source {}; complete -p tracer", bash.display()))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&complete.stdout).contains("-F _tracer tracer"),
        "{complete:?}"
    );
    for file in [
        "share/zsh/site-functions/_tracer",
        "share/fish/vendor_completions.d/tracer.fish",
    ] {
        let text = std::fs::read_to_string(prefix.join(file)).unwrap();
        assert!(text.contains("tracer"), "{file}");
    }
    std::fs::remove_dir_all(&prefix).unwrap();
}

/// The files the package owns, as `dpkg -L` lists them (directories left out).
fn package_files() -> Vec<PathBuf> {
    let listed = run(Command::new("dpkg").args(["-L", "tracer"]));
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|path| path.is_file())
        .collect()
}

#[test]
#[ignore = "builds a .deb and installs it with dpkg: needs root, run with --include-ignored (cargo xtask test does)"]
fn the_deb_installs_the_tracer_its_pages_and_completions_and_removes_cleanly() {
    require_root();
    let installed_before = Command::new("dpkg")
        .args(["-s", "tracer"])
        .output()
        .unwrap();
    assert!(
        !installed_before.status.success(),
        "a tracer package is installed already: remove it with `dpkg --purge tracer` first"
    );
    let deb = printed_path(&xtask(&["deb"]), "xtask deb: ");

    run(Command::new("dpkg").arg("-i").arg(&deb));
    let files = package_files();
    let removal = Command::new("dpkg").args(["--purge", "tracer"]).output();
    for expected in [
        "/usr/bin/tracer",
        "/usr/share/man/man1/tracer.1",
        "/usr/share/man/man1/tracer-attach.1",
        "/usr/share/man/man1/tracer-stacks.1",
        "/usr/share/bash-completion/completions/tracer",
        "/usr/share/zsh/vendor-completions/_tracer",
        "/usr/share/fish/vendor_completions.d/tracer.fish",
    ] {
        assert!(
            files.contains(&PathBuf::from(expected)),
            "{expected} not in the package: {files:?}"
        );
    }
    assert!(
        removal.unwrap().status.success(),
        "dpkg --purge tracer failed"
    );
    let left: Vec<_> = files.iter().filter(|path| path.exists()).collect();
    assert!(left.is_empty(), "left after removal: {left:?}");
    let status = Command::new("dpkg")
        .args(["-s", "tracer"])
        .output()
        .unwrap();
    assert!(
        !status.status.success(),
        "still known to dpkg after --purge"
    );
}

/// Whether an ELF file names a program interpreter (the dynamic loader).
fn has_interpreter(path: &Path) -> bool {
    use object::{
        Endianness,
        elf::{FileHeader64, PT_INTERP},
        read::elf::{FileHeader as _, ProgramHeader as _},
    };
    let data = std::fs::read(path).unwrap();
    let header = FileHeader64::<Endianness>::parse(&*data).unwrap();
    let endian = header.endian().unwrap();
    header
        .program_headers(endian, &*data)
        .unwrap()
        .iter()
        .any(|segment| segment.p_type(endian) == PT_INTERP)
}

#[test]
#[ignore = "builds the tracer for musl and loads eBPF: needs root, run with --include-ignored (cargo xtask test does)"]
fn the_static_build_needs_no_loader_lists_probes_and_attaches() {
    require_root();
    let bin = printed_path(&xtask(&["static"]), "xtask static: ");
    assert!(
        !has_interpreter(&bin),
        "{} names a dynamic loader",
        bin.display()
    );
    assert!(
        has_interpreter(Path::new(GC_DEMO)),
        "the check sees a dynamic loader"
    );

    let listed = run(Command::new(&bin).arg("list").arg(GC_DEMO));
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(":tracer:gc__begin"), "{listed}");

    let run = attach_json_by(
        TracerRun::attach().binary(&bin),
        GC_DEMO,
        &["--gcs", "6", "--pause-ms", "5", "--interval-ms", "5"],
        "static-attach",
        &[],
    );
    assert_eq!(run.report["gc"]["count"], 6, "{:#}", run.report);
    assert!(run.dir.join("offcpu.svg").is_file());
}
