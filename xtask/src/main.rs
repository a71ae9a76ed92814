//! Project tasks: `cargo xtask setup | build | demo | test | container | bench | soak |
//! fuzz | install | deb | static`.
//!
//! Everything a fresh machine lacks is installed by `setup`, which caches what it builds so
//! a second run costs nothing. The tasks that build the tracer alone (demo, install, deb,
//! static) install only the eBPF toolchain; the others run the whole of `setup`.

mod bench;
mod container;
mod demo;
mod fuzz;
mod install;
mod package;
mod setup;
mod soak;
mod test;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Build, demo and test the tracer")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the eBPF build and the tests need (rust-src, bpf-linker, bpftrace,
    /// podman).
    Setup,
    /// Set up, then build the tracer (with its eBPF programs) and the target programs.
    Build,
    /// Set up what the build needs, build the tracer and the demo runtime, trace it: GC
    /// histogram on stdout, flamegraph in out/demo.
    Demo,
    /// Set up, build and run every test, privileged end-to-end tests included.
    Test,
    /// Set up, build, and run the smoke test in a privileged podman container, in the
    /// host's PID namespace and in its own (part of `test`; root).
    Container(container::ContainerArgs),
    /// Set up, build, and measure issue 6's figures against bpftrace and inferno (root).
    Bench(bench::BenchArgs),
    /// Set up, build, and run the churn test for longer: an always-on attach whose
    /// targets come and go stays in bounded memory (root).
    Soak {
        /// How long the service churns.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
    },
    /// Build the tracer and install it: PREFIX/bin/tracer, its man pages in
    /// PREFIX/share/man/man1, and bash, zsh and fish completions under PREFIX/share.
    Install {
        /// Where to install.
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
    },
    /// Build the tracer and package what `install --prefix /usr` puts in place as a .deb
    /// (target/debian/tracer_VERSION_ARCH.deb), with dpkg-deb.
    Deb,
    /// Build a statically linked tracer (musl) that runs on any x86-64 Linux with BTF:
    /// target/x86_64-unknown-linux-musl/release/tracer.
    Static,
    /// Fuzz the USDT note parser, object discovery and argument specs with cargo-fuzz (nightly).
    Fuzz {
        /// How long to run each fuzz target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build => build(),
        Task::Demo => demo::run(),
        Task::Test => test::run(),
        Task::Container(args) => container::run(args),
        Task::Bench(args) => bench::run(args),
        Task::Soak { seconds } => soak::run(seconds),
        Task::Fuzz { seconds } => fuzz::run(seconds),
        Task::Install { prefix } => install::run(&prefix),
        Task::Deb => package::deb().map(drop),
        Task::Static => package::build_static().map(drop),
    }
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Where release binaries land.
pub fn release_dir() -> PathBuf {
    workspace_root().join("target/release")
}

/// Runs a command in the workspace, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    cmd.current_dir(workspace_root());
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// A cargo command that finds bpf-linker where setup put it.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    // The same PATH as the cargo that runs this (when it found bpf-linker the same way):
    // tracer's build script reruns, and tracer is built again, when PATH changes.
    let inherited: Vec<_> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect();
    let mut paths: Vec<_> = setup::bpf_linker_bin_dir()
        .into_iter()
        .filter(|dir| inherited.first() != Some(dir))
        .collect();
    paths.extend(inherited);
    cmd.env(
        "PATH",
        std::env::join_paths(paths).expect("PATH entries are valid"),
    );
    cmd
}

/// Set up what the build needs, then build the tracer binary alone, in release mode.
pub fn build_tracer() -> Result<()> {
    build_tracer_for(None)
}

/// [`build_tracer`] for a `target` other than the host's.
pub fn build_tracer_for(target: Option<&str>) -> Result<()> {
    setup::run_for_build()?;
    eprintln!("xtask: building tracer (with its eBPF programs)");
    let mut args = vec![
        "build",
        "--release",
        "--package",
        "tracer",
        "--bin",
        "tracer",
    ];
    if let Some(target) = target {
        args.extend(["--target", target]);
    }
    run(&mut cargo(&args))
}

/// The tracer and the demo runtime (`gc-demo`) alone, in release mode: what `cargo xtask
/// demo` uses.
pub fn build_demo() -> Result<()> {
    build_tracer()?;
    run(&mut cargo(&[
        "build",
        "--release",
        "--package",
        "tests",
        "--bin",
        "gc-demo",
    ]))
}

/// Set up, then build the tracer and the target programs in release mode.
pub fn build() -> Result<()> {
    setup::run()?;
    eprintln!("xtask: building tracer (with its eBPF programs) and the target programs");
    run(&mut cargo(&[
        "build",
        "--release",
        "--package",
        "tracer",
        "--package",
        "tests",
        "--bins",
    ]))
}
