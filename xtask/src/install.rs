//! `cargo xtask install [--prefix DIR]`: the tracer, its man pages and its shell
//! completions, where each is looked for under the prefix.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::release_dir;

/// Where each generated file goes, relative to the prefix: (file, directory).
const COMPLETIONS: [(&str, &str); 3] = [
    ("tracer.bash", "share/bash-completion/completions/tracer"),
    ("_tracer", "share/zsh/site-functions/_tracer"),
    ("tracer.fish", "share/fish/vendor_completions.d/tracer.fish"),
];

pub fn run(prefix: &Path) -> Result<()> {
    crate::build_tracer()?;
    place(&release_dir().join("tracer"), prefix)
}

/// Copies the tracer built at `built` under `prefix`, with the man pages and completions it
/// writes of itself.
pub fn place(built: &Path, prefix: &Path) -> Result<()> {
    let bin = prefix.join("bin/tracer");
    copy(built, &bin)?;
    let man = prefix.join("share/man/man1");
    generate(&bin, "man", &man)?;
    let scratch = std::env::temp_dir().join(format!("tracer-completions-{}", std::process::id()));
    generate(&bin, "completions", &scratch)?;
    for (file, place) in COMPLETIONS {
        copy(&scratch.join(file), &prefix.join(place))?;
    }
    let _ = fs::remove_dir_all(&scratch);
    eprintln!(
        "xtask install: {} and its man pages ({}) and completions under {}",
        bin.display(),
        man.display(),
        prefix.join("share").display()
    );
    Ok(())
}

fn generate(bin: &Path, what: &str, dir: &Path) -> Result<()> {
    crate::run(Command::new(bin).args(["generate", what]).arg(dir))
}

fn copy(from: &Path, to: &PathBuf) -> Result<()> {
    let dir = to.parent().context("no parent directory")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // A new file renamed into place: a running tracer keeps its old binary.
    let temporary = to.with_extension("new");
    fs::copy(from, &temporary)
        .with_context(|| format!("cannot copy {} to {}", from.display(), temporary.display()))?;
    fs::rename(&temporary, to).with_context(|| format!("cannot install {}", to.display()))
}
