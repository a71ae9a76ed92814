//! Uprobe links pinned in the BPF filesystem while the keeper releases them, so that no
//! kill leaves a breakpoint behind.
//!
//! Removing a uprobe restores the target's instruction through `get_user_pages_remote`,
//! which fails while the removing task has a fatal signal pending. A keeper killed while
//! it closes a link (with the tracer, by `pkill -9`, a cgroup kill, `docker kill`) would
//! leave breakpoints and raised semaphores in the target for good, and the target dies of
//! SIGTRAP at the next breakpoint it runs into. A link whose last reference is a pin is
//! freed by a kernel worker once the pin is removed, and no signal reaches a kernel
//! worker: so the keeper releases a link by pinning it under a directory named after
//! itself, closing its descriptor and removing the pin. A keeper killed half-way leaves
//! pinned links attached and working, never half-removed, and the next tracer to start
//! releases the links of keepers that are gone ([`repair`]) and says what it did.
//!
//! The keeper pins the maps of processes held at `dlopen` and of the programs' switches
//! too: a repair switches the programs off and continues the processes still held.

use std::{
    fmt, io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use super::sys;

/// Where the BPF filesystem is mounted, by convention (systemd, bpftool, libbpf).
const BPF_FS: &str = "/sys/fs/bpf";
/// `BPF_FS_MAGIC` (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe4a11;
/// The directory of tracer's pins in [`BPF_FS`].
const PINS_DIR: &str = "tracer";
/// The name of a pinned link starts with this.
const LINK_PREFIX: &str = "link-";
/// The pinned map of processes held at `dlopen`.
const HELD_MAP: &str = "held";
/// The pinned map of the programs' switches (`tracer_common::control`).
const CONTROL_MAP: &str = "control";

/// Whether `path` is a mounted BPF filesystem.
fn is_bpf_fs(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain integers; all-zero is a valid value to overwrite.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and `stat` is writable; both outlive the call.
    let ret = unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) };
    ret == 0 && stat.f_type as i64 == BPF_FS_MAGIC
}

/// Mounts the BPF filesystem at its usual place unless it is there, as bpftool does: a
/// fresh machine without systemd's mount has none.
pub(crate) fn ensure_bpf_fs() -> io::Result<()> {
    let root = Path::new(BPF_FS);
    if is_bpf_fs(root) {
        return Ok(());
    }
    // SAFETY: every argument is a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Empties `held`, the map of processes the kernel recorded at `dlopen` or at a mapping,
/// and continues those it stopped; returns their PIDs. One only recorded runs: a
/// `SIGCONT` would run its handler for nothing.
pub(crate) fn continue_held(held: std::os::fd::BorrowedFd<'_>) -> Vec<u32> {
    let mut continued = Vec::new();
    for pid in sys::hash_keys_u32(held) {
        let stopped = sys::hash_lookup_u32(held, pid) == Some(tracer_common::held::STOPPED);
        let _ = sys::hash_delete_u32(held, pid);
        // SAFETY: kill has no memory preconditions; a pid that is gone fails harmlessly.
        if stopped && unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) } == 0 {
            continued.push(pid);
        }
    }
    continued
}

/// The start time of process `pid` in clock ticks since boot (field 22 of its stat).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::system::procfs::stat_field(&stat, 22)?.parse().ok()
}

/// The pins of one keeper: its directory, named by its process id and start time so a
/// later tracer can tell whether the keeper still runs.
pub(crate) struct KeeperPins {
    dir: PathBuf,
    links: usize,
}

impl KeeperPins {
    /// The pins directory of this process, created (with the BPF filesystem mounted if it
    /// was not).
    pub(crate) fn create() -> io::Result<Self> {
        ensure_bpf_fs()?;
        let pid = std::process::id();
        let ticks = start_ticks(pid).ok_or_else(|| io::Error::other("no start time"))?;
        let dir = Path::new(BPF_FS)
            .join(PINS_DIR)
            .join(format!("keeper-{pid}-{ticks}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, links: 0 })
    }

    /// Pins `link`; returns the pin's path, to remove when the link is released.
    pub(crate) fn pin_link(&mut self, link: std::os::fd::BorrowedFd<'_>) -> io::Result<PathBuf> {
        let path = self.dir.join(format!("{LINK_PREFIX}{}", self.links));
        sys::pin_object(link, &path)?;
        self.links += 1;
        Ok(path)
    }

    /// Pins the map of processes held at `dlopen`.
    pub(crate) fn pin_held(&self, map: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        sys::pin_object(map, &self.dir.join(HELD_MAP))
    }

    /// Pins the map of the programs' switches.
    pub(crate) fn pin_control(&self, map: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        sys::pin_object(map, &self.dir.join(CONTROL_MAP))
    }

    /// Removes what is left in the directory and the directory itself.
    pub(crate) fn remove(self) {
        let _ = release_dir(&self.dir);
    }
}

/// What releasing a keeper's pins did.
#[derive(Debug, Default)]
pub(crate) struct Released {
    /// The links released (each a file's uprobes).
    pub links: Vec<sys::UprobeMultiLinkInfo>,
    /// Links whose pins went, without their details.
    pub unknown_links: usize,
    /// The processes continued, held at `dlopen` when the keeper went.
    pub continued: Vec<u32>,
}

impl Released {
    pub(crate) fn is_empty(&self) -> bool {
        self.links.is_empty() && self.unknown_links == 0 && self.continued.is_empty()
    }
}

impl fmt::Display for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sites: u64 = self.links.iter().map(|l| u64::from(l.count)).sum();
        let mut files: Vec<String> = self
            .links
            .iter()
            .map(|l| match l.pid {
                0 => l.path.display().to_string(),
                pid => format!("{} in process {pid}", l.path.display()),
            })
            .collect();
        files.sort();
        files.dedup();
        write!(
            f,
            "{} probe links ({sites} sites",
            self.links.len() + self.unknown_links
        )?;
        if !files.is_empty() {
            write!(f, ": {}", files.join(", "))?;
        }
        write!(f, ")")?;
        if !self.continued.is_empty() {
            write!(
                f,
                " and continued {} processes held at dlopen",
                self.continued.len()
            )?;
        }
        Ok(())
    }
}

/// Releases every pin in `dir`, then `dir`: the programs are switched off first, the
/// links' uprobes are removed by the kernel's workers, and the processes still held at
/// `dlopen` are continued.
pub(crate) fn release_dir(dir: &Path) -> io::Result<Released> {
    let mut released = Released::default();
    if let Ok(control) = sys::pinned_object(&dir.join(CONTROL_MAP)) {
        let _ = sys::array_set_u32(control.as_fd(), tracer_common::control::STOPPED, 1);
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(LINK_PREFIX) {
            continue;
        }
        match sys::pinned_object(&path).and_then(|link| sys::uprobe_multi_link_info(link.as_fd())) {
            Ok(info) => released.links.push(info),
            Err(_) => released.unknown_links += 1,
        }
        std::fs::remove_file(&path)?;
    }
    if let Ok(held) = sys::pinned_object(&dir.join(HELD_MAP)) {
        released.continued = continue_held(held.as_fd());
    }
    for map in [HELD_MAP, CONTROL_MAP] {
        let _ = std::fs::remove_file(dir.join(map));
    }
    std::fs::remove_dir(dir)?;
    Ok(released)
}

/// Releases the pins of keeper `pid` (one that died while its tracer runs).
pub(crate) fn release_keeper(pid: u32) -> io::Result<Released> {
    let root = Path::new(BPF_FS).join(PINS_DIR);
    let prefix = format!("keeper-{pid}-");
    let mut released = Released::default();
    for entry in std::fs::read_dir(&root)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let one = release_dir(&entry.path())?;
            released.links.extend(one.links);
            released.unknown_links += one.unknown_links;
            released.continued.extend(one.continued);
        }
    }
    Ok(released)
}

/// One keeper's pins that [`repair`] released.
pub(crate) struct Repaired {
    pub keeper: u32,
    pub released: Released,
}

/// Releases the pins of every keeper that no longer runs (killed with its tracer, say),
/// and continues any keeper found stopped. Nothing to do, or no BPF filesystem: empty.
pub(crate) fn repair() -> Vec<Repaired> {
    let root = Path::new(BPF_FS).join(PINS_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut repaired = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, ticks)) = name
            .to_str()
            .and_then(|n| n.strip_prefix("keeper-"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, ticks)| Some((pid.parse::<u32>().ok()?, ticks.parse::<u64>().ok()?)))
        else {
            continue;
        };
        let zombie = matches!(crate::system::procfs::process_state(pid), Some('Z' | 'X'));
        if start_ticks(pid) == Some(ticks) && !zombie {
            // A keeper never stops by itself: one stopped by a signal would hold its links
            // (and its tracer) for good.
            if crate::system::procfs::is_stopped(pid) {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
            }
            continue;
        }
        match release_dir(&entry.path()) {
            Ok(released) => repaired.push(Repaired {
                keeper: pid,
                released,
            }),
            Err(e) => log::warn!(
                "cannot release the probes a killed tracer left in {}: {e}",
                entry.path().display()
            ),
        }
    }
    repaired
}
