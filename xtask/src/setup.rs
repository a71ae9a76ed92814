//! Installs what a fresh machine lacks for the eBPF build and the tests, idempotently.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// The workspace root (xtask's parent directory).
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The pinned nightly that builds the eBPF programs: the `channel` of
/// `tracer-ebpf/rust-toolchain.toml` (tracer's build script reads the same line).
pub fn ebpf_toolchain() -> Result<String> {
    let path = workspace().join("tracer-ebpf/rust-toolchain.toml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .next()
        .with_context(|| format!("no channel in {}", path.display()))
}

/// bpf-linker is built per eBPF toolchain: it must link that nightly's LLVM.
fn cache_dir(toolchain: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    home.join(".cache/tracer/bpf-linker").join(toolchain)
}

/// Where bpf-linker is installed (tracer's build script looks here too).
pub fn bpf_linker_bin_dir() -> Result<PathBuf> {
    Ok(cache_dir(&ebpf_toolchain()?).join("bin"))
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Everything: the build's pieces and the tools the tests use.
pub fn run() -> Result<()> {
    run_for_build()?;
    ensure_test_tools()?;
    ensure_speedscope()?;
    ensure_julia_bundle()?;
    Ok(())
}

/// The Julia runtime the tests measure without USDT probes: the `ace-jax-coupling` wheel
/// bundles a juliac-compiled library with Julia 1.13's own `libjulia-internal`, built as
/// official Julia releases are (no `WITH_DTRACE`).
const JULIA_BUNDLE: &str = "ace-jax-coupling==0.2.0";

/// Where the Julia bundle's venv is (the tests look there too).
fn julia_venv() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    home.join(".cache/tracer/julia")
}

/// Debian's CPython, which carries USDT probes: the Julia bundle's host, so that one
/// process has a runtime measured by USDT probes and one by its functions.
const JULIA_HOST_PYTHON: &str = "/usr/bin/python3.11";

/// A venv of Debian's python3.11 with the Julia bundle and numpy, made with pip; a no-op
/// when its runtime imports under that interpreter.
fn ensure_julia_bundle() -> Result<()> {
    let venv = julia_venv();
    let python = venv.join("bin/python");
    let imports = Command::new(&python)
        .args([
            "-c",
            "import sys, ace_jax_coupling, numpy; sys.exit(sys.base_prefix != '/usr')",
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if imports {
        return Ok(());
    }
    eprintln!(
        "xtask setup: installing {JULIA_BUNDLE} and numpy with pip in a venv, {}",
        venv.display()
    );
    let _ = std::fs::remove_dir_all(&venv);
    crate::run(
        Command::new(JULIA_HOST_PYTHON)
            .args(["-m", "venv"])
            .arg(&venv),
    )
    .context("making the Julia bundle's venv failed")?;
    crate::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", JULIA_BUNDLE, "numpy"])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .context("installing the Julia bundle with pip failed")
}

/// What building the tracer needs and no more: the eBPF toolchain and bpf-linker (the
/// demo's setup; the tests' tools come with `cargo xtask test`).
pub fn run_for_build() -> Result<()> {
    let toolchain = ebpf_toolchain()?;
    ensure_ebpf_toolchain(&toolchain)?;
    ensure_bpf_linker(&toolchain)
}

/// The speedscope release the timeline test opens in headless Chromium, and its npm
/// tarball's SHA-512.
const SPEEDSCOPE_VERSION: &str = "1.25.0";
const SPEEDSCOPE_SHA512: &str = "7297fd1d64d97f58a32d7049ae4f3b55eff9e2d9d8c7aae57f48144e1be7de8a24ea1eb784b5d539088c7f8e0f4fe5e8579d3770f7ef7e24f980fe6fa23a7a02";

/// Unpacks speedscope's npm package (its built web app, `package/dist/release`) into
/// `~/.cache/tracer/speedscope-VERSION`, where the timeline test looks; a no-op when it
/// is there. The tarball is checked against its known SHA-512.
fn ensure_speedscope() -> Result<()> {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let dir = home
        .join(".cache/tracer")
        .join(format!("speedscope-{SPEEDSCOPE_VERSION}"));
    if dir.join("package/dist/release/index.html").is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(&dir)?;
    let tarball = dir.join("speedscope.tgz");
    let url =
        format!("https://registry.npmjs.org/speedscope/-/speedscope-{SPEEDSCOPE_VERSION}.tgz");
    eprintln!("xtask setup: downloading {url}");
    crate::run(
        Command::new("curl")
            .args(["-fsSL", "-o"])
            .arg(&tarball)
            .arg(&url),
    )
    .context("downloading speedscope failed")?;
    let sum = output(Command::new("sha512sum").arg(&tarball))?;
    if sum.split_whitespace().next() != Some(SPEEDSCOPE_SHA512) {
        let _ = std::fs::remove_file(&tarball);
        bail!("{url} does not have the expected SHA-512 ({sum})");
    }
    crate::run(
        Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir),
    )?;
    let _ = std::fs::remove_file(&tarball);
    Ok(())
}

/// Installs the pinned nightly with rust-src (`-Z build-std=core` needs it); a no-op when
/// both are there.
fn ensure_ebpf_toolchain(toolchain: &str) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--toolchain", toolchain, "--installed"])
        .stderr(Stdio::null())
        .output()
        .context("rustup is required to install the eBPF toolchain")?;
    if installed.status.success()
        && String::from_utf8_lossy(&installed.stdout)
            .lines()
            .any(|l| l.starts_with("rust-src"))
    {
        return Ok(());
    }
    eprintln!("xtask setup: installing the eBPF toolchain {toolchain} with rust-src");
    crate::run(Command::new("rustup").args([
        "toolchain",
        "install",
        toolchain,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

/// The LLVM major the toolchain's rustc was built with, as bpf-linker's feature name.
fn llvm_feature(toolchain: &str) -> Result<String> {
    let version = output(
        Command::new("rustc")
            .arg(format!("+{toolchain}"))
            .arg("-vV"),
    )?;
    let major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .with_context(|| format!("`rustc +{toolchain} -vV` names no LLVM version"))?;
    Ok(format!("llvm-{major}"))
}

fn ensure_bpf_linker(toolchain: &str) -> Result<()> {
    let cache = cache_dir(toolchain);
    let linker = cache.join("bin/bpf-linker");
    let works = |linker: &std::path::Path| {
        Command::new(linker)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if linker.is_file() && works(&linker) {
        return Ok(());
    }
    // No LLVM development package of the nightly's LLVM major exists on this distribution,
    // so bpf-linker links the libLLVM that ships inside the nightly toolchain itself.
    let sysroot = output(
        Command::new("rustc")
            .arg(format!("+{toolchain}"))
            .args(["--print", "sysroot"]),
    )?;
    let nightly_lib = PathBuf::from(sysroot.trim()).join("lib");
    let libllvm = std::fs::read_dir(&nightly_lib)
        .with_context(|| format!("cannot read {}", nightly_lib.display()))?
        .filter_map(std::result::Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .with_context(|| {
            format!(
                "no libLLVM.so.* in {}: is the {toolchain} toolchain complete?",
                nightly_lib.display()
            )
        })?;
    // The build links `libLLVM.so`; the binary then loads the library by its soname
    // through its rpath, so both names must exist there.
    let llvm_lib = cache.join("llvm/lib");
    std::fs::create_dir_all(&llvm_lib)?;
    for name in [
        std::ffi::OsStr::new("libLLVM.so"),
        libllvm.file_name().expect("a file"),
    ] {
        let link = llvm_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)?;
    }
    let feature = llvm_feature(toolchain)?;
    eprintln!(
        "xtask setup: building bpf-linker {BPF_LINKER_VERSION} ({feature}) against {} (once: it is cached)",
        libllvm.display()
    );
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--force",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            &feature,
            "--root",
        ])
        .arg(&cache)
        .env("LLVM_PREFIX", cache.join("llvm"))
        .status()?;
    if !status.success() || !works(&linker) {
        bail!(
            "building bpf-linker {BPF_LINKER_VERSION} with feature {feature} against {} failed",
            libllvm.display()
        );
    }
    Ok(())
}

/// Whether `program` is on PATH, or, for an absolute path, whether that file exists.
fn have(program: &str) -> bool {
    if program.starts_with('/') {
        return std::path::Path::new(program).exists();
    }
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the Debian package `package` is installed.
fn have_package(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).ends_with(" installed"))
}

/// bpftrace is the reference the comparison tests check us against; bpftool lists the
/// kernel's BPF programs and links, to check none of ours outlive the tracer; gcc and g++
/// build the C and C++ test targets, with sys/sdt.h for the probes real C programs carry.
/// The container smoke test (`cargo xtask container`) builds and runs its image with
/// podman and runc (crun, podman's default, refuses the cgroup v1 these machines mount),
/// with busybox-static's /bin/busybox as the image's shell (the `busybox` package's is
/// linked dynamically, so only the package says which one is there). Chromium opens the
/// timeline in a real viewer (speedscope, see [`ensure_speedscope`]), headless; curl
/// downloads that viewer. Go is a runtime the tests measure through its functions.
/// Prometheus (and its promtool) scrapes `attach --metrics` in the tests, as it would in
/// production.
fn ensure_test_tools() -> Result<()> {
    let tools = [
        ("go", "golang-go"),
        ("bpftrace", "bpftrace"),
        ("bpftool", "bpftool"),
        ("gcc", "gcc"),
        ("g++", "g++"),
        (
            "/usr/include/x86_64-linux-gnu/sys/sdt.h",
            "systemtap-sdt-dev",
        ),
        ("podman", "podman"),
        ("/usr/sbin/runc", "runc"),
        ("chromium", "chromium"),
        ("curl", "curl"),
        ("strace", "strace"),
        ("/usr/bin/prometheus", "prometheus"),
    ];
    let mut missing: Vec<&str> = tools
        .into_iter()
        .filter(|(bin, _)| !have(bin))
        .map(|(_, pkg)| pkg)
        .collect();
    if !have_package("busybox-static") {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask setup: installing {} with apt-get", missing.join(" "));
    crate::run(Command::new("apt-get").args(["update", "-q"]))?;
    crate::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("installing test tools failed (apt-get needs root)")
}
