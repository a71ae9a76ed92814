//! Whether this process may load eBPF programs, checked up front so the user gets one
//! clear sentence instead of an EPERM from deep inside a syscall.

use thiserror::Error;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, Error)]
#[error(
    "tracer needs root, or the capabilities CAP_BPF and CAP_PERFMON (missing: {missing}); \
     run it with sudo"
)]
pub(crate) struct NotPrivileged {
    pub missing: String,
}

/// Succeeds when the effective capabilities allow loading BPF programs and opening perf
/// events (CAP_SYS_ADMIN covers both on older kernels).
pub(crate) fn check() -> Result<(), NotPrivileged> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    check_effective(effective_caps(&status))
}

fn effective_caps(status: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

fn check_effective(caps: u64) -> Result<(), NotPrivileged> {
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<_> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| !has(cap))
        .map(|(_, name)| name)
        .collect();
    Err(NotPrivileged {
        missing: missing.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_capeff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), 0x1ff_ffff_ffff);
        assert_eq!(effective_caps("nothing"), 0);
    }

    #[test]
    fn names_what_is_missing() {
        assert!(check_effective(1 << CAP_SYS_ADMIN).is_ok());
        assert!(check_effective((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
        let err = check_effective(1 << CAP_BPF).unwrap_err();
        assert_eq!(err.missing, "CAP_PERFMON");
        let err = check_effective(0).unwrap_err();
        assert_eq!(err.missing, "CAP_BPF, CAP_PERFMON");
        assert!(err.to_string().contains("sudo"));
    }
}
