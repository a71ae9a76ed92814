//! What /proc says about a target process, and what it means when it says nothing: the
//! process exited (gone, or a zombie nobody reaped yet), never existed, or runs while /proc
//! hides it from tracer (the `hidepid` mount option). Every command tells these apart
//! here, so a vanished target is never reported as something else (a kernel feature
//! missing, an unreadable file).

use std::{
    io,
    path::{Component, Path, PathBuf},
};

use foldhash::HashMap;

use thiserror::Error;

/// Why a process's /proc entries cannot be read, when the process is the reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum ProcessError {
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
    pub(crate) fn check(pid: u32) -> Option<Self> {
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
    pub(crate) fn check_target(pid: u32) -> Option<Self> {
        Self::check(pid).map(Self::of_target)
    }

    /// This error for a target known to have existed: "no such process" means it exited.
    pub(crate) fn of_target(self) -> Self {
        match self {
            Self::NoSuch(pid) => Self::Exited(pid),
            other => other,
        }
    }
}

/// `error`, unless the target `pid` (known to have existed) is the reason it happened:
/// then that it exited or that /proc hides it.
pub(crate) fn target_error(pid: u32, error: impl Into<anyhow::Error>) -> anyhow::Error {
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

/// Field `n` of a `/proc/PID/stat` line, numbered as proc(5) numbers them (from 3: the
/// fields after the name). The name (field 2) may hold spaces and parentheses, so fields
/// count from its last `)`.
pub(crate) fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(n.checked_sub(3)?)
}

/// Whether process `pid` is stopped: by a signal (state `T`) or, under a debugger or
/// strace, in a tracing stop (`t`).
pub(crate) fn is_stopped(pid: u32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

/// The state letter of process `pid` (`R`, `S`, `T`, `Z`...), as /proc/PID/stat gives
/// it; `None` when there is no such process.
pub(crate) fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_field(&stat, 3)?.chars().next()
}

/// Every process now, by PID.
pub(crate) fn all_processes() -> Vec<u32> {
    numbered_entries(Path::new("/proc"))
}

/// The threads of process `pid` now (none if it is gone).
pub(crate) fn thread_ids(pid: u32) -> Vec<u32> {
    numbered_entries(Path::new(&format!("/proc/{pid}/task")))
}

/// Whether thread `tid` of process `tgid` still exists.
pub(crate) fn thread_exists(tgid: u32, tid: u32) -> bool {
    Path::new(&format!("/proc/{tgid}/task/{tid}")).exists()
}

/// Every process's parent now, as `(pid, parent)`.
pub(crate) fn parent_pids() -> Vec<(u32, u32)> {
    all_processes()
        .into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, stat_field(&stat, 4)?.parse().ok()?))
        })
        .collect()
}

/// The entries of `dir` named by a number (PIDs, thread ids).
fn numbered_entries(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process or thread name (`comm`) as read from `path`: bytes that are not UTF-8 (a
/// name is any 15 bytes) shown as U+FFFD rather than failing the read.
pub(crate) fn read_name(path: &Path) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

/// The title a process gave itself by rewriting its command line, as `ps` shows it
/// (PostgreSQL's `postgres: walwriter`, `postgres: app db [local] idle`): its first
/// argument when that starts with the process's name and a colon. `None` for a process
/// that did not (most keep their program's path there).
pub(crate) fn process_title(pid: u32, comm: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    parse_process_title(&cmdline, comm)
}

fn parse_process_title(cmdline: &[u8], comm: &str) -> Option<String> {
    let first = cmdline.split(|&b| b == 0).next()?;
    let title = String::from_utf8_lossy(first);
    let title = title.trim_end();
    (!comm.is_empty() && title.starts_with(&format!("{comm}: ")) && title.len() > comm.len() + 2)
        .then(|| title.to_string())
}

/// Process `pid`'s PID in its own PID namespace, when that is not ours (a process in a
/// container, seen from the host): the last number of the `NSpid:` line of its status.
pub(crate) fn namespace_pid(pid: u32) -> Option<u32> {
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
pub(crate) struct ThreadNames {
    names: HashMap<u32, String>,
    /// Threads seen lately, and when: a new thread often names itself just after it
    /// starts (its first sight may show the name it inherited), so it is read again.
    recent: HashMap<u32, std::time::Instant>,
}

/// How long after its first sight a thread's name is read again by
/// [`ThreadNames::add_new`].
const RENAMED_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

impl ThreadNames {
    /// Forgets threads `tids`.
    pub(crate) fn forget(&mut self, tids: &std::collections::HashSet<u32>) {
        self.names.retain(|tid, _| !tids.contains(tid));
        self.recent.retain(|tid, _| !tids.contains(tid));
    }

    /// Reads the names of every current thread of `pid` (threads seen before are kept).
    pub(crate) fn refresh(&mut self, pid: u32) {
        self.read(pid, |_, _| true);
    }

    /// Reads the names of the threads of `pid` not seen before, and again of those first
    /// seen less than [`RENAMED_WITHIN`] ago: one directory listing when there are none,
    /// so it can run often (short-lived threads are named too).
    pub(crate) fn add_new(&mut self, pid: u32) {
        let now = std::time::Instant::now();
        self.recent
            .retain(|_, seen| now.duration_since(*seen) < RENAMED_WITHIN);
        self.read(pid, |names, tid| {
            !names.names.contains_key(&tid) || names.recent.contains_key(&tid)
        });
    }

    /// Reads the names of the threads of `pid` that `wanted` picks.
    fn read(&mut self, pid: u32, wanted: impl Fn(&Self, u32) -> bool) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if !wanted(self, tid) {
                continue;
            }
            if let Ok(comm) = read_name(&task.path().join("comm"))
                && self.names.insert(tid, comm).is_none()
            {
                self.recent.insert(tid, std::time::Instant::now());
            }
        }
    }

    pub(crate) fn get(&self, tid: u32) -> Option<&str> {
        self.names.get(&tid).map(String::as_str)
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MapsEntry {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// The four permission characters, e.g. `r-xp`.
    pub perms: String,
    /// File offset mapped at `start`.
    pub offset: u64,
    /// `major:minor` of the device holding the file.
    pub dev: String,
    /// Inode of the file, 0 for anonymous memory.
    pub inode: u64,
    /// The file name, a pseudo-name like `[vdso]` or `[heap]`, or `None` for anonymous
    /// memory. A ` (deleted)` suffix is removed and recorded in `deleted`.
    pub path: Option<String>,
    /// The file was deleted (or replaced, e.g. by a package upgrade) after mapping, so
    /// the name no longer leads to the mapped contents.
    pub deleted: bool,
}

impl MapsEntry {
    /// Whether the mapping is executable: only those hold probe sites.
    pub(crate) fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }
}

/// Parses the text of `/proc/PID/maps`. Lines that do not parse are skipped rather than
/// failing the whole read, since the format is the kernel's and we only need a part.
pub(crate) fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

pub(crate) fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // Five space-separated fields, then the path padded with spaces; the path itself may
    // contain spaces, so it is everything after the padding.
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start_matches(' ');
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let dev = field()?;
    let inode = field()?;
    let (start, end) = range.split_once('-')?;
    if perms.len() != 4 {
        return None;
    }
    let mut path = rest.trim_start_matches(' ');
    let deleted = match path.strip_suffix(" (deleted)") {
        Some(stripped) => {
            path = stripped;
            true
        }
        None => false,
    };
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.to_owned(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_owned(),
        inode: inode.parse().ok()?,
        path: (!path.is_empty()).then(|| path.to_owned()),
        deleted,
    })
}

/// `path` as a name that outlives the process it goes through: `/proc/PID/root/REST` is
/// `/REST` when process PID sees the files as we do (the same mount namespace and root
/// directory). A uprobe attached through `/proc/PID/root` fails once PID exits, and one
/// of a set of targets (a JVM among several) may exit at any time. Any other path, or a
/// process in a container of its own, is kept as it is.
pub(crate) fn lasting_path(path: &Path) -> PathBuf {
    let mut parts = path.components();
    let (Some(Component::RootDir), Some(proc), Some(pid), Some(root)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return path.to_path_buf();
    };
    let pid = pid.as_os_str().to_string_lossy();
    if proc.as_os_str() != "proc"
        || root.as_os_str() != "root"
        || pid.parse::<u32>().is_err()
        || !sees_files_as_we_do(&pid)
    {
        return path.to_path_buf();
    }
    Path::new("/").join(parts.as_path())
}

/// Whether process `pid` has our mount namespace and root directory.
fn sees_files_as_we_do(pid: &str) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let same = |entry: &str| {
        let theirs = std::fs::metadata(format!("/proc/{pid}/{entry}"));
        let ours = std::fs::metadata(format!("/proc/self/{entry}"));
        matches!((theirs, ours), (Ok(t), Ok(o)) if (t.dev(), t.ino()) == (o.dev(), o.ino()))
    };
    same("ns/mnt") && same("root")
}

/// The tracer's own CPU time so far (user and system, every thread) in seconds, and its
/// resident memory in bytes.
pub(crate) fn own_usage() -> (f64, u64) {
    // SAFETY: an all-zero rusage is valid; getrusage only writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    // statm: size resident shared ... in pages.
    let resident_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    (cpu, resident_pages * page)
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_through_a_process_that_sees_files_as_we_do_outlive_it() {
        let own = format!("/proc/{}/root/usr/lib/x.so", std::process::id());
        assert_eq!(lasting_path(Path::new(&own)), Path::new("/usr/lib/x.so"));
        for kept in [
            "/usr/lib/x.so",
            "/proc/self/exe",
            "/proc/4294967295/root/usr/lib/x.so",
            "/proc/1x/root/usr/lib/x.so",
            "./proc/1/root/x",
        ] {
            assert_eq!(lasting_path(Path::new(kept)), Path::new(kept), "{kept}");
        }
    }

    use super::*;

    #[test]
    fn a_title_is_a_rewritten_first_argument_starting_with_the_name() {
        let title = |cmdline: &[u8], comm| parse_process_title(cmdline, comm);
        assert_eq!(
            title(b"postgres: walwriter \0\0\0", "postgres").as_deref(),
            Some("postgres: walwriter")
        );
        assert_eq!(
            title(b"postgres: app db [local] idle\0", "postgres").as_deref(),
            Some("postgres: app db [local] idle")
        );
        assert_eq!(title(b"/usr/bin/python3\0app.py\0", "python3"), None);
        assert_eq!(title(b"postgres\0-D\0/data\0", "postgres"), None);
        assert_eq!(title(b"postgres: \0", "postgres"), None);
    }

    #[test]
    fn reads_stat_fields_after_any_name() {
        let line = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 \
                    123456 1000 100 18446744073709551615";
        assert_eq!(stat_field(line, 22), Some("123456"));
        assert_eq!(stat_field(line, 4), Some("1"));
        assert_eq!(stat_field(line, 3), Some("S"));
        assert_eq!(stat_field("garbage", 22), None);
        let me = std::process::id();
        assert!(all_processes().contains(&me));
        assert!(thread_ids(me).contains(&me));
        assert!(thread_exists(me, me));
        let parent = std::os::unix::process::parent_id();
        assert!(parent_pids().contains(&(me, parent)));
    }

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
                options: options
                    .iter()
                    .map(std::string::ToString::to_string)
                    .collect(),
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
