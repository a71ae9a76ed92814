//! Builds the eBPF programs in `tracer-ebpf` with the nightly toolchain and bpf-linker,
//! so `tracer` embeds them (see `loader.rs`). `cargo xtask setup` installs both; this
//! script only checks for them, so a missing piece is named instead of failing in a linker.

use std::{
    env,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use object::build::elf::SectionData;

/// The pinned nightly of the eBPF build: the `channel` line of
/// `tracer-ebpf/rust-toolchain.toml` (`cargo xtask setup` installs it from the same line).
fn ebpf_toolchain(ebpf_dir: &Path) -> anyhow::Result<String> {
    let path = ebpf_dir.join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .next()
        .with_context(|| format!("no channel in {}", path.display()))
}

/// Where `cargo xtask setup` caches the bpf-linker built for `toolchain`'s LLVM.
fn cached_bpf_linker_dir(toolchain: &str) -> Option<PathBuf> {
    let home = env::var_os("HOME")?;
    Some(
        PathBuf::from(home)
            .join(".cache/tracer/bpf-linker")
            .join(toolchain)
            .join("bin"),
    )
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

    let toolchain = ebpf_toolchain(&ebpf_dir)?;
    println!(
        "cargo:rerun-if-changed={}",
        ebpf_dir.join("rust-toolchain.toml").display()
    );
    // The linker built for this toolchain's LLVM comes first: one on PATH may link another.
    match cached_bpf_linker_dir(&toolchain).filter(|dir| dir.join("bpf-linker").is_file()) {
        Some(dir) => {
            let mut paths = vec![dir];
            paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
            // SAFETY: build scripts are single-threaded; this only affects the child
            // cargo that aya-build spawns.
            unsafe { env::set_var("PATH", env::join_paths(paths)?) };
        }
        None if find_on_path("bpf-linker").is_some() => {}
        None => bail!(
            "bpf-linker is not installed: run `cargo xtask setup` (it installs the eBPF \
             toolchain {toolchain} and builds bpf-linker against its LLVM, cached in \
             ~/.cache/tracer)"
        ),
    }

    let ebpf_dir_str = ebpf_dir.to_str().context("non-UTF-8 workspace path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: ebpf_dir_str,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .with_context(|| {
        format!(
            "building the eBPF programs failed; if the {toolchain} toolchain or its rust-src \
             is missing, or bpf-linker is broken, run `cargo xtask setup`"
        )
    })?;
    let object = PathBuf::from(env::var("OUT_DIR")?).join("tracer-ebpf");
    strip_debug_info(&object)
}

/// Removes the DWARF sections (and their relocations) from the eBPF object tracer embeds,
/// and the programs' line and function info (`.BTF.ext`): bpf-linker needs DWARF to make
/// the BTF, which stays, but the loader loads the programs without BTF of their own and
/// never reads either. They were nine tenths of the object: every launch parsed their
/// 58,000 relocations (more than a millisecond) before loading anything.
fn strip_debug_info(path: &Path) -> anyhow::Result<()> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut builder = object::build::elf::Builder::read(data.as_slice())
        .with_context(|| format!("cannot parse {}", path.display()))?;
    for section in &mut builder.sections {
        let name = section.name.as_slice();
        if name.starts_with(b".debug_")
            || name.starts_with(b".rel.debug_")
            || name == b".BTF.ext"
            || name == b".rel.BTF.ext"
        {
            section.delete = true;
        }
    }
    builder.delete_orphans();
    // LLVM keeps the section names in the symbol string table; the writer wants a table
    // of their own.
    let has_section_names = builder
        .sections
        .iter()
        .any(|section| matches!(section.data, SectionData::SectionString));
    if !has_section_names {
        let names = builder.sections.add();
        names.name = b".shstrtab"[..].into();
        names.sh_type = object::elf::SHT_STRTAB;
        names.sh_addralign = 1;
        names.data = SectionData::SectionString;
    }
    let mut stripped = Vec::new();
    builder
        .write(&mut stripped)
        .with_context(|| format!("cannot write {} without debug info", path.display()))?;
    std::fs::write(path, stripped).with_context(|| format!("cannot write {}", path.display()))
}
