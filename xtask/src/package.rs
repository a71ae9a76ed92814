//! `cargo xtask deb` and `cargo xtask static`: the two forms a user copies to a server.
//!
//! The `.deb` holds what `cargo xtask install --prefix /usr` puts in place, built with
//! Debian's own `dpkg-deb`. The static build targets musl, whose Rust target links its own C
//! library: the tracer's dependencies hold no C code, so nothing else is needed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{install, release_dir, workspace_root};

/// The target of the static build.
pub const MUSL: &str = "x86_64-unknown-linux-musl";

/// Builds `target/debian/tracer_VERSION_ARCH.deb` and returns its path.
pub fn deb() -> Result<PathBuf> {
    crate::build_tracer()?;
    let staging = workspace_root().join("target/debian/root");
    let _ = fs::remove_dir_all(&staging);
    install::place(&release_dir().join("tracer"), &staging.join("usr"))?;
    // Debian's zsh looks in vendor-completions for packaged completions.
    let zsh = staging.join("usr/share/zsh");
    fs::create_dir_all(zsh.join("vendor-completions"))?;
    fs::rename(
        zsh.join("site-functions/_tracer"),
        zsh.join("vendor-completions/_tracer"),
    )?;
    fs::remove_dir(zsh.join("site-functions"))?;

    let version = tracer_version(&staging.join("usr/bin/tracer"))?;
    let architecture = output(Command::new("dpkg").arg("--print-architecture"))?;
    let control_dir = staging.join("DEBIAN");
    fs::create_dir_all(&control_dir)?;
    fs::write(
        control_dir.join("control"),
        control(&version, &architecture, size_kib(&staging)?),
    )?;
    let deb = workspace_root().join(format!("target/debian/tracer_{version}_{architecture}.deb"));
    crate::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&staging)
            .arg(&deb),
    )?;
    eprintln!("xtask deb: {}", deb.display());
    Ok(deb)
}

/// The control file: what `dpkg` and `apt` show of the package.
fn control(version: &str, architecture: &str, installed_kib: u64) -> String {
    format!(
        "Package: tracer\n\
         Version: {version}\n\
         Architecture: {architecture}\n\
         Maintainer: tracer developers <tracer@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: libc6 (>= 2.34)\n\
         Section: devel\n\
         Priority: optional\n\
         Description: eBPF tracer and wall-clock profiler for language runtimes\n \
         Attaches to a running process with no restart, through USDT probes and runtime\n \
         functions: GC pause histograms, off-CPU flamegraphs, wall-clock profiles of\n \
         every thread, and Prometheus metrics.\n"
    )
}

/// Builds the statically linked tracer and returns its path.
pub fn build_static() -> Result<PathBuf> {
    eprintln!("xtask static: adding the {MUSL} target to the host toolchain");
    crate::run(Command::new("rustup").args(["target", "add", MUSL]))?;
    crate::build_tracer_for(Some(MUSL))?;
    let bin = workspace_root().join(format!("target/{MUSL}/release/tracer"));
    eprintln!("xtask static: {}", bin.display());
    Ok(bin)
}

/// `0.1.0` from `tracer 0.1.0`.
fn tracer_version(bin: &Path) -> Result<String> {
    let printed = output(Command::new(bin).arg("--version"))?;
    match printed.split_whitespace().collect::<Vec<_>>()[..] {
        ["tracer", version] => Ok(version.to_string()),
        _ => bail!("unexpected `tracer --version` output: {printed:?}"),
    }
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The size of the files under `dir`, in KiB as dpkg counts them.
fn size_kib(dir: &Path) -> Result<u64> {
    let mut bytes = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            bytes += size_kib(&entry.path())? * 1024;
        } else {
            bytes += entry.metadata()?.len().div_ceil(1024) * 1024;
        }
    }
    Ok(bytes / 1024)
}
