//! System errors that are not about the kernel's BPF support, though a BPF syscall may be
//! what returned them: out of file descriptors (EMFILE, ENFILE; every map, program, link
//! and perf event is one) and permission refused (EPERM, EACCES). Told apart here so each
//! is reported with its cause and what to do about it.

use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

/// What an OS error means for the user, when it is one of the causes above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// EMFILE (tracer's limit, `ulimit -n`) or, with `system`, ENFILE (the system's).
    TooManyOpenFiles { system: bool },
    /// EPERM or EACCES.
    NotPermitted,
}

/// The cause of `error`, when it is one the user can act on other than a kernel feature.
pub(crate) fn cause(error: &io::Error) -> Option<Cause> {
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
pub(crate) struct OpenFileLimit {
    /// The soft limit, `ulimit -n`; `None` when unlimited or unknown.
    pub soft: Option<u64>,
    pub hard: Option<u64>,
    /// ENFILE: the system-wide table is full, not tracer's own limit.
    pub system: bool,
}

impl OpenFileLimit {
    pub(crate) fn now(system: bool) -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into `limit`.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0;
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
pub(crate) fn open_file_hint(error: &anyhow::Error) -> Option<OpenFileLimit> {
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

/// The limits on tracer's memory in force: the address-space limit (`ulimit -v`) and the
/// lowest memory cgroup limit above it. An allocation or a BPF map that fails for want
/// of memory under one of them is reported with it: raising it is the remedy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MemoryLimits {
    /// RLIMIT_AS's soft limit, bytes; `None` when unlimited.
    pub address_space: Option<u64>,
    pub cgroup: Option<CgroupMemoryLimit>,
}

/// A memory cgroup's limit on the memory of the processes in it (and its descendants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMemoryLimit {
    /// The cgroup's directory.
    pub dir: PathBuf,
    /// The file that sets it: `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1).
    pub file: &'static str,
    pub bytes: u64,
}

/// A v1 memory cgroup without a limit reads as this much or more (the page counter's
/// maximum, rounded down to a page).
const CGROUP_V1_UNLIMITED: u64 = 1 << 62;

impl MemoryLimits {
    pub(crate) fn now() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into `limit`.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &raw mut limit) } == 0;
        Self {
            address_space: (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur),
            cgroup: cgroup_memory_limit(
                &fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
                &fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
                |path| fs::read_to_string(path).ok(),
            ),
        }
    }

    pub(crate) fn any(&self) -> bool {
        self.address_space.is_some() || self.cgroup.is_some()
    }
}

/// What to say of running out of memory under these limits, after "out of memory: ".
impl fmt::Display for MemoryLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let remedy = match (self.address_space, &self.cgroup) {
            (None, None) => {
                return f.write_str(
                    "no memory limit applies to tracer (ulimit -v, memory cgroup): the \
                     system has no memory left; free some and run tracer again",
                );
            }
            (Some(bytes), cgroup) => {
                write!(
                    f,
                    "tracer's address space is limited to {} (ulimit -v is {} KiB)",
                    mebibytes(bytes),
                    bytes / 1024
                )?;
                if let Some(cgroup) = cgroup {
                    write!(
                        f,
                        " and the memory cgroup {} limits it to {} ({})",
                        cgroup.dir.display(),
                        mebibytes(cgroup.bytes),
                        cgroup.file
                    )?;
                }
                "raise the limit, e.g. `ulimit -v unlimited`, and run tracer again"
            }
            (None, Some(cgroup)) => {
                write!(
                    f,
                    "the memory cgroup {} limits tracer to {} ({})",
                    cgroup.dir.display(),
                    mebibytes(cgroup.bytes),
                    cgroup.file
                )?;
                "raise that limit, or run tracer outside the cgroup, and run tracer again"
            }
        };
        write!(f, ": {remedy}")
    }
}

/// `68.4 MiB`.
fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The lowest memory limit of the cgroups this process is in, from its `/proc/self/cgroup`
/// and `/proc/self/mountinfo`, each cgroup's files read with `read`. The v2 hierarchy's
/// `memory.max` and the v1 memory controller's `memory.limit_in_bytes` are both looked at,
/// in the cgroup and each of its ancestors up to the mount's root.
pub(crate) fn cgroup_memory_limit(
    cgroups: &str,
    mountinfo: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<CgroupMemoryLimit> {
    let mut lowest: Option<CgroupMemoryLimit> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (file, v2) = match controllers {
            "" => ("memory.max", true),
            controllers if controllers.split(',').any(|c| c == "memory") => {
                ("memory.limit_in_bytes", false)
            }
            _ => continue,
        };
        let Some((mount_root, mount_point)) = cgroup_mount(mountinfo, v2) else {
            continue;
        };
        // Below the mount's root (a cgroup namespace's mount shows its own root as /).
        let relative = Path::new(path)
            .strip_prefix(mount_root)
            .unwrap_or(Path::new(path).strip_prefix("/").unwrap_or(Path::new(path)));
        let mut dir = Some(mount_point.join(relative));
        while let Some(here) = dir {
            let bytes = read(&here.join(file)).and_then(|text| {
                let text = text.trim();
                (text != "max").then(|| text.parse::<u64>().ok()).flatten()
            });
            if let Some(bytes) = bytes.filter(|&b| b < CGROUP_V1_UNLIMITED)
                && lowest.as_ref().is_none_or(|l| bytes < l.bytes)
            {
                lowest = Some(CgroupMemoryLimit {
                    dir: here.clone(),
                    file,
                    bytes,
                });
            }
            dir = here
                .parent()
                .filter(|parent| parent.starts_with(&mount_point))
                .map(Path::to_path_buf);
        }
    }
    lowest
}

/// The root and mount point of the cgroup v2 hierarchy (`v2`) or of the v1 hierarchy of
/// the memory controller, from `/proc/self/mountinfo`.
fn cgroup_mount(mountinfo: &str, v2: bool) -> Option<(&str, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (fstype, _source, options) = (fs.next()?, fs.next()?, fs.next()?);
        let wanted = match v2 {
            true => fstype == "cgroup2",
            false => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
        };
        let mut fields = mount.split(' ');
        let root = fields.nth(3)?;
        let point = fields.next()?;
        // Spaces and the like are octal escapes there (`\040`).
        wanted.then(|| (root, PathBuf::from(unescape_mount_path(point))))
    })
}

fn unescape_mount_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        if let Some(byte) = code {
            out.push(byte as char);
            rest = &rest[at + 4..];
        } else {
            out.push('\\');
            rest = &rest[at + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// What to add to an error caused, somewhere down its chain, by ENOMEM when a memory
/// limit is set (a BPF map or ring buffer the kernel could not allocate under it).
pub(crate) fn memory_limit_hint(error: &anyhow::Error) -> Option<MemoryLimits> {
    let out_of_memory = error.chain().any(|e| {
        e.downcast_ref::<io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ENOMEM))
    });
    let limits = out_of_memory.then(MemoryLimits::now)?;
    limits.any().then_some(limits)
}

/// `error`'s message and causes, joined by ": " as `{error:#}` joins them, but a cause
/// that its error already ends with (aya's "map error: failed to create map `X`", caused
/// by "failed to create map `X`") only once.
pub(crate) fn error_chain_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut last = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if !last.is_empty() && last.ends_with(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
        last = message;
    }
    text
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

    #[test]
    fn finds_the_lowest_cgroup_memory_limit_v1_and_v2() {
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                         35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                         41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let cgroups = "4:memory:/jobs/one/tlim\n0::/app\n";
        let files = std::collections::HashMap::from([
            (
                "/sys/fs/cgroup/memory/jobs/one/tlim/memory.limit_in_bytes",
                "33554432\n",
            ),
            (
                "/sys/fs/cgroup/memory/jobs/one/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
                "1073741824\n",
            ),
            ("/sys/fs/cgroup/unified/app/memory.max", "max\n"),
        ]);
        let read = |path: &Path| {
            files
                .get(path.to_str().unwrap())
                .map(std::string::ToString::to_string)
        };
        assert_eq!(
            cgroup_memory_limit(cgroups, mountinfo, read),
            Some(CgroupMemoryLimit {
                dir: "/sys/fs/cgroup/memory/jobs/one/tlim".into(),
                file: "memory.limit_in_bytes",
                bytes: 32 << 20,
            })
        );
        let v2_only = "22 1 0:21 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let files = std::collections::HashMap::from([
            ("/sys/fs/cgroup/user.slice/tlim/memory.max", "max\n"),
            ("/sys/fs/cgroup/user.slice/memory.max", "209715200\n"),
        ]);
        let read = |path: &Path| {
            files
                .get(path.to_str().unwrap())
                .map(std::string::ToString::to_string)
        };
        let limit = cgroup_memory_limit("0::/user.slice/tlim\n", v2_only, read).unwrap();
        assert_eq!(
            (limit.dir.to_str().unwrap(), limit.file, limit.bytes),
            ("/sys/fs/cgroup/user.slice", "memory.max", 200 << 20)
        );
        assert_eq!(cgroup_memory_limit("0::/\n", v2_only, |_| None), None);
        assert_eq!(
            unescape_mount_path("/mnt/with\\040space"),
            "/mnt/with space"
        );
    }

    #[test]
    fn memory_limits_name_the_limit_and_the_remedy() {
        let address_space = MemoryLimits {
            address_space: Some(200_000 * 1024),
            cgroup: None,
        };
        assert_eq!(
            address_space.to_string(),
            "tracer's address space is limited to 195.3 MiB (ulimit -v is 200000 KiB): raise \
             the limit, e.g. `ulimit -v unlimited`, and run tracer again"
        );
        let cgroup = MemoryLimits {
            address_space: None,
            cgroup: Some(CgroupMemoryLimit {
                dir: "/sys/fs/cgroup/tlim".into(),
                file: "memory.max",
                bytes: 32 << 20,
            }),
        };
        assert_eq!(
            cgroup.to_string(),
            "the memory cgroup /sys/fs/cgroup/tlim limits tracer to 32.0 MiB (memory.max): \
             raise that limit, or run tracer outside the cgroup, and run tracer again"
        );
        let both = MemoryLimits {
            address_space: Some(1 << 30),
            ..cgroup
        };
        assert!(both.to_string().contains(
            "(ulimit -v is 1048576 KiB) and the memory cgroup /sys/fs/cgroup/tlim limits it to \
             32.0 MiB (memory.max): raise the limit"
        ));
        assert!(!MemoryLimits::default().any());
    }

    #[test]
    fn a_cause_its_error_repeats_is_said_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to create map `STACKS`")]
        struct CreateError(#[source] io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("map error: {0}")]
        struct MapError(#[source] CreateError);
        let error = anyhow::Error::new(MapError(CreateError(io::Error::from_raw_os_error(
            libc::ENOMEM,
        ))))
        .context("loading the eBPF programs failed");
        assert_eq!(
            error_chain_text(&error),
            "loading the eBPF programs failed: map error: failed to create map `STACKS`: \
             Cannot allocate memory (os error 12)"
        );
        let plain = anyhow::anyhow!("no such process: 4").context("attaching");
        assert_eq!(error_chain_text(&plain), format!("{plain:#}"));
    }
}
