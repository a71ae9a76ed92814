//! `cargo xtask test`: every test, privileged end-to-end tests included. Those are
//! `#[ignore]`d with the reason (a plain `cargo test` lists them as ignored, never as
//! passed) and run here with `--include-ignored`; without root they fail. Last, the smoke
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
            "--",
            "--include-ignored",
        ])
        .env("TRACER_BIN", release_dir().join("tracer")),
    )?;
    crate::container::run_built(Default::default())
}
