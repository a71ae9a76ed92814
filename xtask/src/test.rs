//! `cargo xtask test`: every test, privileged end-to-end tests included. Under CI=true
//! those must run; a missing capability fails them instead of skipping. Last, the smoke
//! test in a privileged container (`cargo xtask container`).

use anyhow::Result;

use crate::{cargo, release_dir};

pub fn run() -> Result<()> {
    crate::build()?;
    crate::run(&mut cargo(&["fmt", "--all", "--", "--check"]))?;
    crate::run(
        cargo(&[
            "test",
            "--release",
            "--workspace",
            "--exclude",
            "tracer-ebpf",
        ])
        .env("TRACER_BIN", release_dir().join("tracer")),
    )?;
    crate::container::run_built(Default::default())
}
