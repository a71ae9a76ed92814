//! Builds the eBPF programs in `tracer-ebpf` with the nightly toolchain and bpf-linker,
//! so `tracer` embeds them (see `loader.rs`). `cargo xtask setup` installs both; this
//! script only checks for them, so a missing piece is named instead of failing in a linker.

use std::{env, path::PathBuf};

use anyhow::{Context as _, bail};

/// Where `cargo xtask setup` caches bpf-linker.
fn cached_bpf_linker_dir() -> Option<PathBuf> {
    let home = env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".cache/tracer/bpf-linker/bin"))
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .context("tracer has no parent directory")?;
    let ebpf_dir = workspace.join("tracer-ebpf");
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("tracer-common").display()
    );
    println!("cargo:rerun-if-env-changed=PATH");

    if find_on_path("bpf-linker").is_none() {
        match cached_bpf_linker_dir().filter(|dir| dir.join("bpf-linker").is_file()) {
            Some(dir) => {
                let mut paths = vec![dir];
                paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
                // SAFETY: build scripts are single-threaded; this only affects the child
                // cargo that aya-build spawns.
                unsafe { env::set_var("PATH", env::join_paths(paths)?) };
            }
            None => bail!(
                "bpf-linker is not installed: run `cargo xtask setup` (it builds bpf-linker \
                 against the nightly toolchain's LLVM and caches it in ~/.cache/tracer)"
            ),
        }
    }

    let ebpf_dir_str = ebpf_dir.to_str().context("non-UTF-8 workspace path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: ebpf_dir_str,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .context(
        "building the eBPF programs failed; if the nightly toolchain lacks rust-src or \
         bpf-linker is broken, run `cargo xtask setup`",
    )
}
