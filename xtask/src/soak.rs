//! `cargo xtask soak [--seconds N]`: the churn test (`tests/tests/e2e/safety/churn.rs`) for N seconds
//! instead of CI's minute: `attach --metrics --profile-every` on a service whose processes
//! come and go, its memory and kernel maps sampled through the second half of the run.
//! On demand, not in CI; root.

use anyhow::Result;

use crate::{cargo, release_dir};

pub fn run(seconds: u64) -> Result<()> {
    crate::build()?;
    crate::run(
        cargo(&[
            "test",
            "--release",
            "-p",
            "tests",
            "--test",
            "e2e",
            "--",
            "--include-ignored",
            "--nocapture",
            "safety::churn::",
        ])
        .env("TRACER_BIN", release_dir().join("tracer"))
        .env("TRACER_SOAK_SECONDS", seconds.to_string()),
    )
}
