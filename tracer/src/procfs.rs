//! What /proc says about a target process, and what it means when it says nothing: the
//! process exited (gone, or a zombie nobody reaped yet), never existed, or runs while /proc
//! hides it from tracer (the `hidepid` mount option). Every command tells these apart
//! here, so a vanished target is never reported as something else (a kernel feature
//! missing, an unreadable file).

use std::{io, path::Path};

use foldhash::HashMap;

use thiserror::Error;

/// Why a process's /proc entries cannot be read, when the process is the reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProcessError {
    /// The process existed (tracer watched it) and has exited since, or is a zombie.
    #[error("process {0} exited")]
    Exited(u32),
    /// There is no process with this PID (never was, or exited before tracer looked).
    #[error("no such process: {0}")]
    NoSuch(u32),
    /// The process exists, but /proc does not show it to tracer.
    #[error(
        "process {pid} is running, but /proc hides it from tracer ({}): remount /proc with \
         `mount -o remount,hidepid=0 /proc`, or run tracer as root, with CAP_SYS_PTRACE, or \
         as a member of {}",
        match options.is_empty() {
            true => "the hidepid mount option".to_string(),
            false => format!("mounted with {}", options.join(",")),
        },
        match options.iter().find_map(|o| o.strip_prefix("gid=")) {
            Some(gid) => format!("group {gid} (/proc's gid= option)"),
            None => "the group given by /proc's gid= mount option".to_string(),
        }
    )]
    Hidden {
        pid: u32,
        /// /proc's `hidepid=` and `gid=` mount options, as this process sees them.
        options: Vec<String>,
    },
}

impl ProcessError {
    /// What is wrong with process `pid`, if anything: `None` while it runs and /proc
    /// shows it (then an error reading its entries has another cause).
    pub fn check(pid: u32) -> Option<Self> {
        match state(pid) {
            State::Visible => None,
            State::Zombie => Some(Self::Exited(pid)),
            State::Absent => Some(Self::NoSuch(pid)),
            State::Hidden => Some(Self::Hidden {
                pid,
                options: proc_mount_options(
                    &std::fs::read_to_string("/proc/self/mounts").unwrap_or_default(),
                )
                .unwrap_or_default()
                .into_iter()
                .map(str::to_string)
                .collect(),
            }),
        }
    }

    /// [`ProcessError::check`] for a target known to have existed (tracer holds a pidfd
    /// of it): if it is not there any more, it exited.
    pub fn check_target(pid: u32) -> Option<Self> {
        Self::check(pid).map(Self::of_target)
    }

    /// This error for a target known to have existed: "no such process" means it exited.
    pub fn of_target(self) -> Self {
        match self {
            Self::NoSuch(pid) => Self::Exited(pid),
            other => other,
        }
    }
}

/// `error`, unless the target `pid` (known to have existed) is the reason it happened:
/// then that it exited or that /proc hides it.
pub fn target_error(pid: u32, error: impl Into<anyhow::Error>) -> anyhow::Error {
    // A process in the middle of exiting loses its files (/proc/PID/exe, its maps) a
    // moment before it shows as a zombie: give it that moment (this is an error path).
    for _ in 0..20 {
        if let Some(gone) = ProcessError::check_target(pid) {
            return gone.into();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    error.into()
}

/// How process `pid` looks through /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Running (or stopped, sleeping...), and /proc shows it.
    Visible,
    /// Exited, not reaped yet: /proc shows little (no executable, no maps).
    Zombie,
    /// No such process.
    Absent,
    /// Exists, but /proc hides it: absent from /proc (`hidepid=invisible`) or there and
    /// unreadable (`hidepid=noaccess`; /proc/PID/stat is otherwise readable by anyone).
    Hidden,
}

fn state(pid: u32) -> State {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) if is_zombie(&stat) => State::Zombie,
        Ok(_) => State::Visible,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => State::Hidden,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            if exists(pid) {
                State::Hidden
            } else {
                State::Absent
            }
        }
        // Out of file descriptors, say: nothing is known against the process.
        Err(_) => State::Visible,
    }
}

/// Whether a process `pid` exists, asked of the kernel rather than of /proc: signal 0
/// checks without sending anything, and EPERM means it exists (someone else's).
fn exists(pid: u32) -> bool {
    // Negative values would name process groups; PIDs never get this high.
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill has no memory preconditions; signal 0 sends nothing.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether a /proc/PID/stat line is a zombie's (or a dead task's): the state after the
/// name, which may itself hold spaces and parentheses.
fn is_zombie(stat: &[u8]) -> bool {
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    let state = stat[close + 1..].iter().find(|b| !b.is_ascii_whitespace());
    matches!(state, Some(b'Z' | b'X' | b'x'))
}

/// The `hidepid=` and `gid=` options of the last mount on /proc in `mounts` (the format
/// of /proc/self/mounts), `None` when nothing is mounted there.
fn proc_mount_options(mounts: &str) -> Option<Vec<&str>> {
    let options = mounts.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let (_, target, kind, options) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        (target == "/proc" && kind == "proc").then_some(options)
    })?;
    Some(
        options
            .split(',')
            .filter(|o| o.starts_with("hidepid=") || o.starts_with("gid="))
            .collect(),
    )
}

/// A process or thread name (`comm`) as read from `path`: bytes that are not UTF-8 (a
/// name is any 15 bytes) shown as U+FFFD rather than failing the read.
pub fn read_name(path: &Path) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

/// Process `pid`'s PID in its own PID namespace, when that is not ours (a process in a
/// container, seen from the host): the last number of the `NSpid:` line of its status.
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_namespace_pid(&status)
}

fn parse_namespace_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let numbers: Vec<u32> = line
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers.as_slice() {
        [_, .., inner] => Some(*inner),
        _ => None,
    }
}

/// Names of a process's threads, remembered while it runs.
#[derive(Debug, Default)]
pub struct ThreadNames {
    names: HashMap<u32, String>,
}

impl ThreadNames {
    /// Reads the names of every current thread of `pid` (threads seen before are kept).
    pub fn refresh(&mut self, pid: u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Ok(comm) = read_name(&task.path().join("comm")) {
                self.names.insert(tid, comm);
            }
        }
    }

    /// Reads the names of the threads of `pid` not seen before: one directory listing
    /// when there are none, so it can run often (short-lived threads are named too).
    pub fn add_new(&mut self, pid: u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if self.names.contains_key(&tid) {
                continue;
            }
            if let Ok(comm) = read_name(&task.path().join("comm")) {
                self.names.insert(tid, comm);
            }
        }
    }

    pub fn get(&self, tid: u32) -> Option<&str> {
        self.names.get(&tid).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_in_a_namespace_below_has_two_pids() {
        let status = "Name:\tgc-demo\nTgid:\t31418\nNSpid:\t31418\t8\nPPid:\t1\n";
        assert_eq!(parse_namespace_pid(status), Some(8));
        assert_eq!(parse_namespace_pid("NSpid:\t31418\n"), None);
        assert_eq!(parse_namespace_pid("Name:\tx\n"), None);
        assert_eq!(namespace_pid(std::process::id()), None);
    }

    #[test]
    fn tells_zombies_from_the_living() {
        assert!(is_zombie(b"42 (a) b (c)) Z 1 42 42"));
        assert!(is_zombie(b"42 (x) X 1"));
        assert!(!is_zombie(b"42 (Z) S 1 42 42"));
        assert!(!is_zombie(b"42 (a) Z) R 1"));
        assert!(!is_zombie(b"garbage"));
    }

    #[test]
    fn this_process_is_visible_and_a_huge_pid_absent() {
        assert_eq!(ProcessError::check(std::process::id()), None);
        assert_eq!(
            ProcessError::check(u32::MAX - 1),
            Some(ProcessError::NoSuch(u32::MAX - 1))
        );
        assert_eq!(
            ProcessError::check(4194304),
            Some(ProcessError::NoSuch(4194304))
        );
        assert_eq!(
            ProcessError::check_target(4194304),
            Some(ProcessError::Exited(4194304))
        );
        assert_eq!(ProcessError::check(0), Some(ProcessError::NoSuch(0)));
    }

    #[test]
    fn a_zombie_has_exited() {
        // SAFETY: the child only calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(0) };
        }
        let pid = pid as u32;
        // Not reaped yet: a zombie, once it has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ProcessError::check(pid).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(ProcessError::check(pid), Some(ProcessError::Exited(pid)));
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        assert_eq!(
            ProcessError::check_target(pid),
            Some(ProcessError::Exited(pid))
        );
    }

    #[test]
    fn names_the_hidepid_options() {
        let mounts = "proc /proc proc rw,relatime 0 0\n\
                      sysfs /sys sysfs rw 0 0\n\
                      proc /proc proc rw,relatime,gid=27,hidepid=invisible 0 0\n";
        assert_eq!(
            proc_mount_options(mounts),
            Some(vec!["gid=27", "hidepid=invisible"])
        );
        assert_eq!(proc_mount_options("sysfs /sys sysfs rw 0 0\n"), None);
        let hidden = |options: &[&str]| {
            ProcessError::Hidden {
                pid: 7,
                options: options.iter().map(|o| o.to_string()).collect(),
            }
            .to_string()
        };
        let text = hidden(&["hidepid=invisible"]);
        assert!(
            text.starts_with(
                "process 7 is running, but /proc hides it from tracer (mounted with \
                 hidepid=invisible): remount /proc with `mount -o remount,hidepid=0 /proc`"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("the group given by /proc's gid= mount option"),
            "{text}"
        );
        let text = hidden(&["gid=27", "hidepid=noaccess"]);
        assert!(
            text.contains("(mounted with gid=27,hidepid=noaccess)"),
            "{text}"
        );
        assert!(
            text.ends_with("as a member of group 27 (/proc's gid= option)"),
            "{text}"
        );
        assert!(hidden(&[]).contains("(the hidepid mount option)"));
    }

    #[test]
    fn names_read_lossily() {
        let dir = std::env::temp_dir().join(format!("tracer-procfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("comm");
        std::fs::write(&file, b"a\xffb\x1b\n").unwrap();
        assert_eq!(read_name(&file).unwrap(), "a\u{fffd}b\x1b");
        let own = read_name(Path::new("/proc/self/comm")).unwrap();
        assert!(!own.is_empty() && !own.ends_with('\n'));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
