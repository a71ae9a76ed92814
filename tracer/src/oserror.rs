//! System errors that are not about the kernel's BPF support, though a BPF syscall may be
//! what returned them: out of file descriptors (EMFILE, ENFILE; every map, program, link
//! and perf event is one) and permission refused (EPERM, EACCES). Told apart here so each
//! is reported with its cause and what to do about it.

use std::{fmt, io};

/// What an OS error means for the user, when it is one of the causes above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// EMFILE (tracer's limit, `ulimit -n`) or, with `system`, ENFILE (the system's).
    TooManyOpenFiles { system: bool },
    /// EPERM or EACCES.
    NotPermitted,
}

/// The cause of `error`, when it is one the user can act on other than a kernel feature.
pub fn cause(error: &io::Error) -> Option<Cause> {
    match error.raw_os_error()? {
        libc::EMFILE => Some(Cause::TooManyOpenFiles { system: false }),
        libc::ENFILE => Some(Cause::TooManyOpenFiles { system: true }),
        libc::EPERM | libc::EACCES => Some(Cause::NotPermitted),
        _ => None,
    }
}

/// Tracer's open-file limit as it is now (getrlimit), for the message of an EMFILE or
/// ENFILE: that the limit is too low, what it is, how to raise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit, `ulimit -n`; `None` when unlimited or unknown.
    pub soft: Option<u64>,
    pub hard: Option<u64>,
    /// ENFILE: the system-wide table is full, not tracer's own limit.
    pub system: bool,
}

impl OpenFileLimit {
    pub fn now(system: bool) -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into `limit`.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        let value = |v: libc::rlim_t| (ok && v != libc::RLIM_INFINITY).then_some(v);
        Self {
            soft: value(limit.rlim_cur),
            hard: value(limit.rlim_max),
            system,
        }
    }
}

impl fmt::Display for OpenFileLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
        if self.system {
            return write!(
                f,
                "too many open files in the system (ENFILE): the system-wide limit \
                 (sysctl fs.file-max) is reached; tracer's own open-file limit, ulimit -n, \
                 is {}",
                shown(self.soft)
            );
        }
        write!(
            f,
            "too many open files: the open-file limit is too low for tracer (ulimit -n is {}",
            shown(self.soft)
        )?;
        match (self.soft, self.hard) {
            (Some(soft), Some(hard)) if hard > soft => write!(f, ", hard limit {hard}")?,
            (Some(_), Some(_)) => f.write_str(", the hard limit too")?,
            _ => {}
        }
        f.write_str("); raise it, e.g. `ulimit -n 4096`, and run tracer again")
    }
}

/// The open-file limit's message for an error caused, somewhere down its chain, by
/// EMFILE or ENFILE, unless the error says so already.
pub fn open_file_hint(error: &anyhow::Error) -> Option<OpenFileLimit> {
    if error.chain().any(|e| e.to_string().contains("ulimit -n")) {
        return None;
    }
    error.chain().find_map(|e| {
        let io = e.downcast_ref::<io::Error>()?;
        match cause(io)? {
            Cause::TooManyOpenFiles { system } => Some(OpenFileLimit::now(system)),
            Cause::NotPermitted => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errno() {
        let cause_of = |errno| cause(&io::Error::from_raw_os_error(errno));
        assert_eq!(
            cause_of(libc::EMFILE),
            Some(Cause::TooManyOpenFiles { system: false })
        );
        assert_eq!(
            cause_of(libc::ENFILE),
            Some(Cause::TooManyOpenFiles { system: true })
        );
        assert_eq!(cause_of(libc::EPERM), Some(Cause::NotPermitted));
        assert_eq!(cause_of(libc::EACCES), Some(Cause::NotPermitted));
        assert_eq!(cause_of(libc::EINVAL), None);
        assert_eq!(cause(&io::Error::other("no errno")), None);
    }

    #[test]
    fn the_limit_names_ulimit_and_its_value() {
        let limit = OpenFileLimit {
            soft: Some(24),
            hard: Some(24),
            system: false,
        };
        assert_eq!(
            limit.to_string(),
            "too many open files: the open-file limit is too low for tracer (ulimit -n is \
             24, the hard limit too); raise it, e.g. `ulimit -n 4096`, and run tracer again"
        );
        let soft = OpenFileLimit {
            hard: Some(524288),
            ..limit
        };
        assert!(
            soft.to_string()
                .contains("ulimit -n is 24, hard limit 524288)")
        );
        let system = OpenFileLimit {
            system: true,
            ..limit
        };
        assert!(system.to_string().contains("fs.file-max"));
        assert!(system.to_string().contains("ulimit -n, is 24"));
        let now = OpenFileLimit::now(false);
        assert!(now.soft.is_none_or(|soft| soft > 0), "{now:?}");
    }

    #[test]
    fn finds_emfile_down_an_error_chain() {
        let error = anyhow::Error::new(io::Error::from_raw_os_error(libc::EMFILE))
            .context("writing out/offcpu.svg");
        assert!(open_file_hint(&error).is_some_and(|l| !l.system));
        let said = anyhow::Error::new(io::Error::from_raw_os_error(libc::EMFILE))
            .context("too many open files: ulimit -n is 3");
        assert_eq!(open_file_hint(&said), None);
        let other = anyhow::Error::new(io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(open_file_hint(&other), None);
    }
}
