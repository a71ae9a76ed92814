//! Naming the addresses of captured stacks.
//!
//! The tracer stops when its target exits and only then symbolizes, so nothing here may
//! need the process to be alive at that point. [`ProcessMaps`] snapshots the executable
//! mappings while the process lives and opens every mapped file right away, preferably
//! through `/proc/PID/map_files/` (the exact file even across mount namespaces or after
//! it was deleted or replaced on disk). The open descriptors keep the files readable
//! after the process is gone; blazesym reads them through `/proc/self/fd/N`, with each
//! address given as a file offset, so no process state is consulted.
//!
//! A file many processes map (an executable, libc, ld.so) is opened once, not once per
//! process: snapshots share one descriptor of each file, by device and inode (see
//! `OpenFiles`). A service that starts thousands of short-lived processes costs the
//! tracer a descriptor per distinct file, and the files it may keep open are bounded by
//! its open-file limit.
//!
//! JIT-compiled code is named from the runtime's perf map (`/tmp/perf-PID.map`), also
//! opened early; once its process exited, the map is read and its descriptor closed.
//! Kernel addresses are named from `/proc/kallsyms`.
//!
//! A frame that cannot be named is shown as `module+0xOFFSET` (the offset in the mapped
//! file), or `[unknown]` outside any known mapping; frames are never dropped.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak, mpsc};
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use blazesym::{MaybeDefault, Pid};

use crate::stack::elf::ElfSymbols;
use crate::stack::jit::jitdump::JitSymbols;
use crate::system::procfs::{MapsEntry, parse_maps_line};

/// Name of frames that no mapping or symbol source can place.
pub const UNKNOWN: &str = "[unknown]";
/// Module of frames named from a JIT perf map.
const JIT_MODULE: &str = "[jit]";
const VDSO: &str = "[vdso]";

/// One symbolized stack frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled), `module+0xOFFSET`, or [`UNKNOWN`].
    pub name: String,
    /// File name of the object (`libc.so.6`), `[vdso]`, `[jit]`; `None` for the kernel
    /// and for unknown frames.
    pub module: Option<String>,
    /// True for a function inlined into the frame that follows it in the stack.
    pub inlined: bool,
    /// How far the address looked up is into the function, when a symbol named it (not
    /// for inlined functions).
    pub offset: Option<u64>,
}

impl Frame {
    fn unknown() -> Self {
        Self {
            name: UNKNOWN.to_string(),
            module: None,
            inlined: false,
            offset: None,
        }
    }

    fn module_offset(module: &str, offset: u64) -> Self {
        Self {
            name: format!("{module}+{offset:#x}"),
            module: Some(module.to_string()),
            inlined: false,
            offset: None,
        }
    }
}

/// Where an address lies in a [`ProcessMaps`] snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location<'a> {
    /// In a file mapping: the file's path (as the process saw it), its file name, and
    /// the address's offset in the file.
    File {
        path: &'a str,
        module: &'a str,
        file_offset: u64,
    },
    /// In the vDSO, at this offset from its start.
    Vdso { offset: u64 },
    /// In executable memory without a file: JIT code, or a mapping we do not name.
    Anonymous,
    /// In no executable mapping of the snapshot.
    Unmapped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Index into `ProcessMaps::objects`.
    Object(usize),
    Vdso,
    Anonymous,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    target: Target,
}

#[derive(Debug)]
struct MappedObject {
    /// Path as in the maps file, without ` (deleted)`.
    path: String,
    /// File name, shown as the frame's module.
    module: String,
    dev: String,
    inode: u64,
    /// Kept open so the file stays readable after the process exits or it is deleted;
    /// shared with every other snapshot that maps the same file.
    file: Option<Arc<File>>,
}

/// One file-backed executable mapping of a [`ProcessMaps`] snapshot.
#[derive(Clone, Copy, Debug)]
pub struct MappedFile<'a> {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of the mapping's first byte.
    pub offset: u64,
    /// Path as the process saw it, without ` (deleted)`.
    pub path: &'a str,
    pub dev: &'a str,
    pub inode: u64,
    /// The very file that was mapped, kept open; `None` if it could not be opened.
    pub file: Option<&'a File>,
}

/// A snapshot of a process's executable mappings and its JIT perf map, taken while it
/// runs so its stacks can be symbolized after it exits.
#[derive(Debug)]
pub struct ProcessMaps {
    pid: u32,
    /// Sorted by start, non-overlapping.
    mappings: Vec<Mapping>,
    objects: Vec<MappedObject>,
    perf_map: PerfMapSource,
    /// The code its JIT registered through the GDB JIT interface, as last read.
    gdb_jit: Option<GdbJit>,
    /// Set once a refresh found the process gone: nothing is read of it any more.
    exited: bool,
}

/// A process's GDB JIT descriptor and what was last read behind it.
#[derive(Debug)]
struct GdbJit {
    descriptor: u64,
    code: JitSymbols,
}

/// For each mapped file, by (device, inode): the link-time address of its GDB JIT
/// descriptor, if it has one. Each file's symbols are read once per run.
static GDB_JIT_DESCRIPTORS: LazyLock<std::sync::Mutex<DescriptorsByFile>> =
    LazyLock::new(Default::default);

/// Link-time descriptor addresses by (device, inode); `None` for a file without one.
type DescriptorsByFile = HashMap<(String, u64), Option<u64>>;

impl ProcessMaps {
    /// Reads `/proc/PID/maps` and opens every executable file mapped by `pid`.
    pub fn capture(pid: u32) -> io::Result<Self> {
        let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let mut snapshot = Self {
            pid,
            mappings: Vec::new(),
            objects: Vec::new(),
            perf_map: PerfMapSource::locate(pid),
            gdb_jit: None,
            exited: false,
        };
        snapshot.mappings = snapshot.add_entries(maps.lines().filter_map(parse_maps_line));
        snapshot.perf_map.open_if_missing();
        snapshot.read_gdb_jit();
        Ok(snapshot)
    }

    /// Re-reads the maps to pick up libraries loaded since (`dlopen`). Mappings that
    /// disappeared are kept unless new ones cover their addresses, so stacks recorded
    /// before a `dlclose` still resolve. Fails (leaving the snapshot as it was) once
    /// the process is gone; the first failure that says so marks it exited (see
    /// [`ProcessMaps::has_exited`]) and closes what only the live process needed.
    pub fn refresh(&mut self) -> io::Result<()> {
        if self.exited {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        let maps = match fs::read_to_string(format!("/proc/{}/maps", self.pid)) {
            Ok(maps) => maps,
            Err(e) => {
                if is_gone(&e) {
                    self.mark_exited();
                }
                return Err(e);
            }
        };
        self.merge_maps(&maps);
        self.perf_map.open_if_missing();
        self.read_gdb_jit();
        Ok(())
    }

    /// Whether a refresh found the process gone. Its mappings stay, to name its stacks.
    pub fn has_exited(&self) -> bool {
        self.exited
    }

    /// Notes that the process is gone: its perf map is read now and its descriptor
    /// closed, as nothing is added to it any more.
    fn mark_exited(&mut self) {
        self.exited = true;
        self.perf_map.read_and_close();
    }

    /// Replaces the mappings with those of `maps`, keeping old ones nothing new covers.
    fn merge_maps(&mut self, maps: &str) {
        let mut mappings = self.add_entries(maps.lines().filter_map(parse_maps_line));
        let stale: Vec<Mapping> = self
            .mappings
            .iter()
            .filter(|old| !overlaps_any(&mappings, old.start, old.end))
            .copied()
            .collect();
        mappings.extend(stale);
        mappings.sort_by_key(|m| m.start);
        self.mappings = mappings;
    }

    /// Reads the code registered through the GDB JIT interface again, finding the
    /// descriptor first if the process has one (see [`crate::stack::jit::gdb`]).
    fn read_gdb_jit(&mut self) {
        if self.gdb_jit.is_none() {
            self.gdb_jit = self.find_gdb_jit();
        }
        if let Some(jit) = &mut self.gdb_jit {
            // Opened for each read: no descriptor is held per process between reads.
            let Ok(mem) = File::open(format!("/proc/{}/mem", self.pid)) else {
                return;
            };
            let code = crate::stack::jit::gdb::registered_code(&mem, jit.descriptor);
            // A process gone reads as nothing: what was read before stays.
            if !code.is_empty() {
                jit.code = code;
            }
        }
    }

    fn find_gdb_jit(&self) -> Option<GdbJit> {
        let mut known = GDB_JIT_DESCRIPTORS.lock().ok()?;
        for mapping in self.mapped_files() {
            let key = (mapping.dev.to_string(), mapping.inode);
            let at = *known.entry(key).or_insert_with(|| {
                let symbols =
                    ElfSymbols::read(mapping.file?, &[crate::stack::jit::gdb::DESCRIPTOR])?;
                symbols.address(crate::stack::jit::gdb::DESCRIPTOR)
            });
            let Some(at) = at else {
                continue;
            };
            let symbols = ElfSymbols::read(mapping.file?, &[])?;
            let bias = symbols.load_bias(mapping.start, mapping.offset)?;
            return Some(GdbJit {
                descriptor: bias.wrapping_add(at),
                code: JitSymbols::default(),
            });
        }
        None
    }

    /// The name of the code at `addr` its JIT registered through the GDB JIT interface.
    fn gdb_jit_name(&self, addr: u64) -> Option<&str> {
        self.gdb_jit.as_ref()?.code.lookup(addr)
    }

    /// The jitdump file the process maps (see [`crate::stack::jit::jitdump`]), kept open.
    pub fn jitdump(&self) -> Option<&File> {
        self.objects
            .iter()
            .find(|o| crate::stack::jit::jitdump::is_jitdump_name(&o.module))
            .and_then(|o| o.file.as_deref())
    }

    /// The process this snapshot is of.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where `addr` lies in the snapshot.
    pub fn locate(&self, addr: u64) -> Location<'_> {
        let Some(mapping) = self.find(addr) else {
            return Location::Unmapped;
        };
        match mapping.target {
            Target::Object(index) => {
                let object = &self.objects[index];
                Location::File {
                    path: &object.path,
                    module: &object.module,
                    file_offset: addr - mapping.start + mapping.offset,
                }
            }
            Target::Vdso => Location::Vdso {
                offset: addr - mapping.start,
            },
            Target::Anonymous => Location::Anonymous,
        }
    }

    /// The file-backed executable mappings of the snapshot, sorted by start (for
    /// unwinding, which reads each file's unwind tables).
    pub fn mapped_files(&self) -> impl Iterator<Item = MappedFile<'_>> {
        self.mappings.iter().filter_map(|m| match m.target {
            Target::Object(index) => {
                let object = &self.objects[index];
                Some(MappedFile {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: &object.path,
                    dev: &object.dev,
                    inode: object.inode,
                    file: object.file.as_deref(),
                })
            }
            Target::Vdso | Target::Anonymous => None,
        })
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        let after = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings[..after].last()?;
        (addr < mapping.end).then_some(mapping)
    }

    /// Turns executable entries into sorted mappings, opening files not seen before.
    fn add_entries(&mut self, entries: impl Iterator<Item = MapsEntry>) -> Vec<Mapping> {
        let mut mappings = Vec::new();
        for entry in entries.filter(|e| e.is_executable() && e.start < e.end) {
            let target = if entry.path.as_deref().is_some_and(|p| p.starts_with('/')) {
                Target::Object(self.object_index(&entry))
            } else if entry.path.as_deref() == Some(VDSO) {
                Target::Vdso
            } else {
                Target::Anonymous
            };
            mappings.push(Mapping {
                start: entry.start,
                end: entry.end,
                offset: entry.offset,
                target,
            });
        }
        mappings.sort_by_key(|m| m.start);
        mappings
    }

    fn object_index(&mut self, entry: &MapsEntry) -> usize {
        let path = entry.path.as_deref().unwrap_or_default();
        let known = self
            .objects
            .iter()
            .position(|o| o.inode == entry.inode && o.dev == entry.dev && o.path == path);
        if let Some(index) = known {
            return index;
        }
        let module = Path::new(path).file_name().map_or_else(
            || path.to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        self.objects.push(MappedObject {
            path: path.to_string(),
            module,
            dev: entry.dev.clone(),
            inode: entry.inode,
            file: OpenFiles::open(self.pid, entry),
        });
        self.objects.len() - 1
    }

    #[cfg(test)]
    fn from_maps_text(pid: u32, maps: &str) -> Self {
        let mut snapshot = Self {
            pid,
            mappings: Vec::new(),
            objects: Vec::new(),
            perf_map: PerfMapSource::default(),
            gdb_jit: None,
            exited: false,
        };
        snapshot.mappings = snapshot.add_entries(maps.lines().filter_map(parse_maps_line));
        snapshot
    }
}

fn overlaps_any(sorted: &[Mapping], start: u64, end: u64) -> bool {
    let after = sorted.partition_point(|m| m.start < end);
    sorted[..after].iter().any(|m| m.end > start)
}

/// Whether `error`, reading a process's /proc files, means the process is gone (and
/// not, say, that the tracer is out of file descriptors).
fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH)
}

/// The mapped files open now, by (device, inode as the maps file shows them): one
/// descriptor of each file, however many processes map it. A file is closed when the
/// last snapshot holding it is dropped.
#[derive(Debug, Default)]
struct OpenFiles {
    by_file: HashMap<(String, u64), Weak<File>>,
    /// Whether the warning that the budget is spent was given (once per run).
    warned: bool,
}

/// Every snapshot's mapped files, one registry for the whole run (snapshots are taken
/// by several commands and threads).
static OPEN_FILES: LazyLock<Mutex<OpenFiles>> = LazyLock::new(Default::default);

impl OpenFiles {
    /// The file behind an executable mapping of `pid`: the descriptor already open for
    /// the same file if there is one, else a new one unless the budget is spent (see
    /// [`mapped_file_budget`]). `None` leaves its frames named `module+0xOFFSET`.
    fn open(pid: u32, entry: &MapsEntry) -> Option<Arc<File>> {
        let key = (entry.dev.clone(), entry.inode);
        let mut open = OPEN_FILES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = open.by_file.get(&key).and_then(Weak::upgrade) {
            return Some(file);
        }
        // Files no snapshot holds any more are closed already: forget them.
        open.by_file.retain(|_, file| file.strong_count() > 0);
        let budget = mapped_file_budget();
        if open.by_file.len() >= budget {
            if !open.warned {
                open.warned = true;
                log::warn!(
                    "{budget} mapped files open, half the open-file limit: the frames of \
                     files mapped from now on are named by offset (raise `ulimit -n` to \
                     name them)"
                );
            }
            return None;
        }
        let file = Arc::new(open_mapped_file(pid, entry)?);
        open.by_file.insert(key, Arc::downgrade(&file));
        Some(file)
    }
}

/// How many mapped files the snapshots may keep open: half the open-file limit, so that
/// the rest (BPF maps, programs and links, perf events, /proc reads, the report's files)
/// always has room.
fn mapped_file_budget() -> usize {
    let limit = crate::system::oserror::OpenFileLimit::now(false);
    limit.soft.map_or(usize::MAX, |soft| {
        usize::try_from(soft / 2).unwrap_or(usize::MAX)
    })
}

/// Opens the file behind an executable mapping of `pid`.
fn open_mapped_file(pid: u32, entry: &MapsEntry) -> Option<File> {
    // Exactly the mapped file, in any mount namespace, even deleted; needs
    // CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE), which the tracer has as root.
    let map_file = format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end);
    if let Some(file) = open_regular(Path::new(&map_file)) {
        return Some(file);
    }
    let path = entry.path.as_deref()?;
    if entry.deleted {
        return None;
    }
    // The path as the process sees it, in its mount namespace.
    if let Some(file) = open_regular(Path::new(&format!("/proc/{pid}/root{path}"))) {
        return Some(file);
    }
    // Our own view of the path: only trustworthy if it is the same file.
    let file = open_regular(Path::new(path))?;
    (file.metadata().ok()?.ino() == entry.inode).then_some(file)
}

/// Opens a regular file for reading. `O_NONBLOCK` so a FIFO swapped in cannot hang us;
/// anything but a regular file is refused, since blazesym reopens it without that flag.
fn open_regular(path: &Path) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// One JIT symbol of a perf map: code in `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PerfMapEntry {
    start: u64,
    end: u64,
    name: String,
}

/// A parsed perf map (`START SIZE name` lines, hexadecimal), sorted by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PerfMap {
    entries: Vec<PerfMapEntry>,
}

/// Parses a JIT perf map. Malformed lines are skipped; when code was compiled again at
/// the same address, the later line wins.
pub fn parse_perf_map(text: &str) -> PerfMap {
    let hex = |s: &str| {
        let s = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        u64::from_str_radix(s, 16).ok()
    };
    let mut entries: Vec<PerfMapEntry> = text
        .lines()
        .filter_map(|line| {
            let (start, rest) = line.trim_start().split_once(char::is_whitespace)?;
            let (size, name) = rest.trim_start().split_once(char::is_whitespace)?;
            let (start, size, name) = (hex(start)?, hex(size)?, name.trim());
            (size > 0 && !name.is_empty()).then(|| PerfMapEntry {
                start,
                end: start.saturating_add(size),
                name: name.to_string(),
            })
        })
        .collect();
    // Stable, so entries at the same start stay in file order; keep the last of each.
    entries.sort_by_key(|e| e.start);
    let mut deduped: Vec<PerfMapEntry> = Vec::with_capacity(entries.len());
    for entry in entries {
        match deduped.last_mut() {
            Some(last) if last.start == entry.start => *last = entry,
            _ => deduped.push(entry),
        }
    }
    PerfMap { entries: deduped }
}

impl PerfMap {
    /// The symbol whose code holds `addr` (the nearest one starting at or below it).
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let after = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries[..after].last()?;
        (addr < entry.end).then_some(entry.name.as_str())
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True without symbols.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Where the target's perf map is and, once it exists, an open descriptor to it.
#[derive(Debug, Default)]
struct PerfMapSource {
    file: Option<File>,
    /// The map as read when its process was found gone, after which `file` is closed:
    /// an exited process writes nothing more, and its descriptor is given back.
    at_exit: Option<PerfMap>,
    /// `/tmp/perf-N.map` through the target's root, while the target lives.
    live_path: Option<PathBuf>,
    /// The same file through our own /tmp, usable after exit when the target shares our
    /// mount and pid namespaces.
    fallback_path: Option<PathBuf>,
    /// Owner the file must have (besides root): the target's.
    owner_uid: Option<u32>,
}

impl PerfMapSource {
    fn locate(pid: u32) -> Self {
        // The runtime names the file after its pid as seen in its own pid namespace.
        let ns_pid = fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| parse_ns_pid(&status))
            .unwrap_or(pid);
        let same_mount_ns = match (
            fs::read_link("/proc/self/ns/mnt"),
            fs::read_link(format!("/proc/{pid}/ns/mnt")),
        ) {
            (Ok(ours), Ok(theirs)) => ours == theirs,
            _ => false,
        };
        Self {
            file: None,
            at_exit: None,
            live_path: Some(PathBuf::from(format!(
                "/proc/{pid}/root/tmp/perf-{ns_pid}.map"
            ))),
            fallback_path: (same_mount_ns && ns_pid == pid)
                .then(|| PathBuf::from(format!("/tmp/perf-{pid}.map"))),
            owner_uid: fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()),
        }
    }

    fn open_if_missing(&mut self) {
        if self.file.is_none() && self.at_exit.is_none() {
            self.file = self
                .live_path
                .as_deref()
                .and_then(|path| self.open_checked(path));
        }
    }

    /// Reads the map through its descriptor, if one is open, and closes the descriptor.
    fn read_and_close(&mut self) {
        if let Some(file) = self.file.take() {
            self.at_exit = read_perf_map(&file).ok();
        }
    }

    /// The perf map through our own /tmp, for when the runtime created it after the
    /// last capture or refresh and the target is gone.
    fn open_fallback(&self) -> Option<File> {
        self.fallback_path
            .as_deref()
            .and_then(|path| self.open_checked(path))
    }

    /// /tmp is world-writable: only trust a regular file, not reached through a
    /// symlink, owned by root or the target.
    fn open_checked(&self, path: &Path) -> Option<File> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let meta = file.metadata().ok()?;
        let owner_ok = meta.uid() == 0 || Some(meta.uid()) == self.owner_uid;
        (meta.is_file() && owner_ok).then_some(file)
    }
}

/// The innermost pid from the `NSpid:` line of `/proc/PID/status`.
fn parse_ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// A target's perf map as parsed, with the file size it was parsed at (the runtime
/// appends, so a new size means new symbols).
#[derive(Debug, Default)]
struct CachedPerfMap {
    /// Opened through the fallback path when the snapshot has no descriptor; tried once.
    fallback: Option<Option<File>>,
    parsed_len: Option<u64>,
    map: PerfMap,
}

/// Names user and kernel stack addresses. Caches parsed symbol files, so keep one for
/// the whole report. Not `Send`: blazesym's caches use `Rc`.
#[derive(Debug)]
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    perf_maps: HashMap<u32, CachedPerfMap>,
    /// Each process's jitdump as last parsed, and the length it had then.
    jitdumps: HashMap<u32, (u64, JitSymbols)>,
    /// Objects (device, inode) whose symbols could not be read: warned about once, not
    /// retried. Not keyed by our fd path: fd numbers are reused.
    unreadable: HashSet<(String, u64)>,
    /// The device and inode of the file this process runs, once looked up (`Some(None)`:
    /// none, so every file is named with its debug information).
    own_executable: Option<Option<(u64, u64)>>,
    /// Our own vDSO, which is the target's too (one image per kernel).
    own_vdso: Option<Option<(u64, u64)>>,
    /// Whether /proc/kallsyms shows real addresses; checked once.
    kallsyms_usable: Option<bool>,
    kernel_failed: bool,
    /// Frames per (pid, lookup address) and per kernel address, named once; looked up
    /// for every frame of every stack, so with a fast hash.
    user_cache: foldhash::HashMap<(u32, u64), Rc<[Frame]>>,
    kernel_cache: foldhash::HashMap<u64, Vec<Frame>>,
    /// What each file offset of each object (device, inode) is named (`None`: no symbol
    /// there), so that a library many processes map (libc) is named once for all.
    /// Shared with `user_cache`: the same frames for every process, not a copy each.
    object_cache: foldhash::HashMap<ObjectOffset, Option<Rc<[Frame]>>>,
    /// The one descriptor of each object (the snapshots'), whose `/proc/self/fd` path
    /// blazesym is given for every process that maps it: it parses each file once. Held
    /// here too, so the path stays valid for as long as blazesym may read it.
    shared_files: HashMap<(String, u64), Arc<File>>,
    /// A second symbolizer, for big profiles of several objects, and the objects
    /// (device, inode) each symbolizer has named: an object stays with the one that
    /// parsed it.
    naming_thread: Option<NamingThread>,
    on_naming_thread: HashSet<(String, u64)>,
    on_main_symbolizer: HashSet<(String, u64)>,
    /// A symbolizer of kallsyms on a thread of its own, once [`StackSymbolizer::prepare`]
    /// started it: it keeps kallsyms parsed for every request.
    kernel_thread: Option<KernelNamingThread>,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    /// A symbolizer that demangles Rust and C++ names and expands inlined functions
    /// where debug information has them.
    pub fn new() -> Self {
        Self {
            symbolizer: new_blazesym(),
            perf_maps: HashMap::new(),
            jitdumps: HashMap::new(),
            unreadable: HashSet::new(),
            own_executable: None,
            own_vdso: None,
            kallsyms_usable: None,
            kernel_failed: false,
            user_cache: foldhash::HashMap::default(),
            kernel_cache: foldhash::HashMap::default(),
            object_cache: foldhash::HashMap::default(),
            shared_files: HashMap::new(),
            naming_thread: None,
            on_naming_thread: HashSet::new(),
            on_main_symbolizer: HashSet::new(),
            kernel_thread: None,
        }
    }

    /// Starts parsing, on the naming threads and [`PREPARE_DELAY`] from now, what naming
    /// stacks of the processes of `maps` will need: kallsyms, and the symbols and debug
    /// information of the files nearly every stack of theirs runs through, each process's
    /// executable and C library (libc's separate debug information alone is about
    /// 100 ms; at most [`PREPARED_FILES`] files). A stopping tracer then makes its user
    /// wait for lookups, not for parsing. Names are the same with or without it; the
    /// other files are parsed at the stop, as only some are reached (parsed, each holds
    /// megabytes).
    pub fn prepare<'m>(&mut self, maps: impl IntoIterator<Item = &'m ProcessMaps>) {
        if self.kernel_thread.is_none() && self.kallsyms_usable() {
            self.kernel_thread = KernelNamingThread::start();
        }
        let own_executable = self.own_executable();
        let mut files: Vec<((String, u64), ElfFile, u64)> = Vec::new();
        'processes: for maps in maps {
            let executable = fs::metadata(format!("/proc/{}/exe", maps.pid))
                .ok()
                .map(|m| m.ino());
            for (index, object) in maps.objects.iter().enumerate() {
                if Some(object.inode) != executable && !is_c_library(&object.module) {
                    continue;
                }
                let key = (object.dev.clone(), object.inode);
                let taken = self.on_main_symbolizer.contains(&key)
                    || self.on_naming_thread.contains(&key)
                    || files.iter().any(|(k, _, _)| *k == key);
                if taken
                    || object
                        .file
                        .as_ref()
                        .is_some_and(|f| is_same_file(f, own_executable))
                {
                    continue;
                }
                // Where its code starts: a place to look up, to have it all parsed.
                let code = maps
                    .mappings
                    .iter()
                    .find(|m| m.target == Target::Object(index))
                    .map(|m| m.offset);
                if let (Some(file), Some(offset)) = (self.elf_file(object, own_executable), code) {
                    files.push((key, file, offset));
                    if files.len() == PREPARED_FILES {
                        break 'processes;
                    }
                }
            }
        }
        if files.is_empty() {
            return;
        }
        if self.naming_thread.is_none() {
            self.naming_thread = NamingThread::start();
        }
        let Some(thread) = &self.naming_thread else {
            return;
        };
        let keys: Vec<(String, u64)> = files.iter().map(|(key, _, _)| key.clone()).collect();
        let request = files.into_iter().map(|(_, file, offset)| (file, offset));
        if thread
            .jobs
            .send(NamingRequest::Prepare(request.collect()))
            .is_ok()
        {
            // Named there from now on: where they are parsed.
            self.on_naming_thread.extend(keys);
        }
    }

    /// Names a user stack of the process `maps` was captured from.
    ///
    /// `addrs` is innermost first, as the kernel records stacks: `addrs[0]` is the
    /// instruction pointer, the rest are return addresses, which are looked up one byte
    /// earlier so they land in the call instruction (and its inlining context) rather
    /// than whatever follows it. A zero address ends the stack (stack maps are
    /// zero-padded). Inlined functions come as extra frames before the function they
    /// were inlined into, so the result stays innermost first.
    pub fn user_frames(&mut self, maps: &ProcessMaps, addrs: &[u64]) -> Vec<Frame> {
        let stacks = self.user_stacks(maps, &[addrs]);
        stacks.into_iter().flatten().cloned().collect()
    }

    /// Names many user stacks of the process `maps` was captured from, each as
    /// [`StackSymbolizer::user_frames`] would. Profiles are many stacks over few distinct
    /// addresses: each address is named once, all in one batch per mapped object, as
    /// every call into blazesym has a fixed cost that stack-by-stack calls pay over and
    /// over; and the frames are lent, not copied per stack.
    pub fn user_stacks(&mut self, maps: &ProcessMaps, stacks: &[&[u64]]) -> Vec<Vec<&Frame>> {
        let named = self.user_addresses(maps, stacks);
        stacks
            .iter()
            .map(|addrs| {
                lookups(addrs)
                    .flat_map(|(lookup, _)| named.frames(lookup))
                    .collect()
            })
            .collect()
    }

    /// Names every address of `stacks` (as [`StackSymbolizer::user_stacks`] does) and
    /// lends the frames of each, for callers that make something of each distinct
    /// address once rather than of each frame of each stack.
    pub fn user_addresses(&mut self, maps: &ProcessMaps, stacks: &[&[u64]]) -> UserAddresses<'_> {
        let pid = maps.pid();
        let mut missing: Vec<(u64, u64)> = stacks
            .iter()
            .flat_map(|addrs| lookups(addrs))
            .filter(|(lookup, _)| !self.user_cache.contains_key(&(pid, *lookup)))
            .collect();
        missing.sort_unstable();
        missing.dedup_by_key(|(lookup, _)| *lookup);
        if !missing.is_empty() {
            let named = self.resolve_user(maps, &missing);
            for ((lookup, _), frames) in missing.into_iter().zip(named) {
                self.user_cache.insert((pid, lookup), frames);
            }
        }
        UserAddresses {
            pid,
            cache: &self.user_cache,
        }
    }

    /// Names each (lookup address, original address) pair: every frame it stands for,
    /// inlined ones first.
    fn resolve_user(&mut self, maps: &ProcessMaps, addrs: &[(u64, u64)]) -> Vec<Rc<[Frame]>> {
        let mut slots: Vec<Option<Rc<[Frame]>>> = vec![None; addrs.len()];
        let mut by_object: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        let mut vdso: Vec<(usize, u64)> = Vec::new();
        for (slot, &(lookup, _)) in addrs.iter().enumerate() {
            match maps
                .find(lookup)
                .map(|m| (m.target, lookup - m.start + m.offset))
            {
                Some((Target::Object(index), file_offset)) => {
                    by_object
                        .entry(index)
                        .or_default()
                        .push((slot, file_offset));
                }
                Some((Target::Vdso, offset)) => vdso.push((slot, offset)),
                Some((Target::Anonymous, _)) | None => {}
            }
        }

        // Each file's offsets not named yet, all named at once: a file mapped under two
        // paths (a hard link, a bind mount) is one file to name.
        let mut work: Vec<(usize, Vec<u64>)> = Vec::new();
        let mut work_of_file: HashMap<(&str, u64), usize> = HashMap::new();
        for (&index, wanted) in &by_object {
            let object = &maps.objects[index];
            let at = *work_of_file
                .entry((object.dev.as_str(), object.inode))
                .or_insert_with(|| {
                    work.push((index, Vec::new()));
                    work.len() - 1
                });
            work[at]
                .1
                .extend(wanted.iter().map(|&(_, offset)| offset).filter(|&offset| {
                    !self
                        .object_cache
                        .contains_key(&(object.dev.clone(), object.inode, offset))
                }));
        }
        for (_, offsets) in &mut work {
            offsets.sort_unstable();
            offsets.dedup();
        }
        work.retain(|(_, offsets)| !offsets.is_empty());
        let symbols = self.symbolize_objects(maps, &work);
        for ((index, offsets), symbols) in work.into_iter().zip(symbols) {
            let object = &maps.objects[index];
            for (offset, symbol) in offsets.into_iter().zip(symbols) {
                let frames = symbol.map(|sym| frames_of(&sym, Some(&object.module)).into());
                self.object_cache
                    .insert((object.dev.clone(), object.inode, offset), frames);
            }
        }
        for (index, wanted) in by_object {
            let object = &maps.objects[index];
            for (slot, offset) in wanted {
                if let Some(frames) =
                    &self.object_cache[&(object.dev.clone(), object.inode, offset)]
                {
                    slots[slot] = Some(Rc::clone(frames));
                }
            }
        }
        if !vdso.is_empty() {
            for ((slot, _), sym) in vdso.iter().zip(self.symbolize_vdso(&vdso)) {
                if let Some(sym) = sym {
                    slots[*slot] = Some(frames_of(&sym, Some(VDSO)).into());
                }
            }
        }

        slots
            .into_iter()
            .zip(addrs)
            .map(|(named, &(lookup, addr))| {
                named.unwrap_or_else(|| {
                    if let Some((name, module)) = crate::stack::frame_tokens::frame(lookup) {
                        return Rc::from([Frame {
                            name,
                            module: Some(module.to_string()),
                            inlined: false,
                            offset: None,
                        }]);
                    }
                    let frame = match self.jit_name(maps, lookup) {
                        Some(name) => Frame {
                            name,
                            module: Some(JIT_MODULE.to_string()),
                            inlined: false,
                            offset: None,
                        },
                        None => fallback_frame(maps.locate(addr)),
                    };
                    Rc::from([frame])
                })
            })
            .collect()
    }

    /// Names a kernel stack (innermost first; see [`StackSymbolizer::user_frames`] for
    /// the conventions) from /proc/kallsyms. Without real addresses there (not root, or
    /// `kptr_restrict`), every frame is [`UNKNOWN`].
    pub fn kernel_frames(&mut self, addrs: &[u64]) -> Vec<Frame> {
        let stacks = self.kernel_stacks(&[addrs]);
        stacks.into_iter().flatten().cloned().collect()
    }

    /// Names many kernel stacks, each as [`StackSymbolizer::kernel_frames`] would, each
    /// distinct address once and all in one batch (see [`StackSymbolizer::user_stacks`]).
    pub fn kernel_stacks(&mut self, stacks: &[&[u64]]) -> Vec<Vec<&Frame>> {
        let missing = self.unnamed_kernel_addresses(stacks.iter().copied());
        if !missing.is_empty() {
            // Either symbolizer keeps kallsyms parsed for the next call.
            let named = match &self.kernel_thread {
                Some(_) => self.name_kernel_apart(missing).wait(),
                None => missing.name_with(&self.symbolizer),
            };
            self.add_kernel_names(named);
        }
        static UNKNOWN_FRAME: LazyLock<Frame> = LazyLock::new(Frame::unknown);
        let unknown = |addrs: &&[u64]| vec![&*UNKNOWN_FRAME; until_zero(addrs).len()];
        if self.kallsyms_usable != Some(true) || self.kernel_failed {
            return stacks.iter().map(unknown).collect();
        }
        let cache = &self.kernel_cache;
        stacks
            .iter()
            .map(|addrs| {
                lookups(addrs)
                    .flat_map(|(lookup, _)| &cache[&lookup])
                    .collect()
            })
            .collect()
    }

    /// The distinct addresses of `stacks` not named yet, to name with
    /// [`KernelAddresses::name`], on another thread if wanted, and to hand back to
    /// [`StackSymbolizer::add_kernel_names`]. Empty when kernel frames cannot be named
    /// (no addresses in /proc/kallsyms, or naming failed before).
    pub fn unnamed_kernel_addresses<'s>(
        &mut self,
        stacks: impl IntoIterator<Item = &'s [u64]>,
    ) -> KernelAddresses {
        if !self.kallsyms_usable() || self.kernel_failed {
            return KernelAddresses(Vec::new());
        }
        let mut missing: Vec<u64> = stacks
            .into_iter()
            .flat_map(lookups)
            .map(|(lookup, _)| lookup)
            .filter(|lookup| !self.kernel_cache.contains_key(lookup))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        KernelAddresses(missing)
    }

    /// Whether /proc/kallsyms shows real addresses (warned about once if not).
    fn kallsyms_usable(&mut self) -> bool {
        *self.kallsyms_usable.get_or_insert_with(|| {
            let usable = kallsyms_has_addresses();
            if !usable {
                log::warn!("/proc/kallsyms hides kernel addresses; kernel frames stay unnamed");
            }
            usable
        })
    }

    /// Names `addresses` on another thread (the kernel naming thread once
    /// [`StackSymbolizer::prepare`] started it, one of their own otherwise) while the caller
    /// goes on; what [`PendingKernelNames::wait`] returns goes to
    /// [`StackSymbolizer::add_kernel_names`].
    pub fn name_kernel_apart(&mut self, addresses: KernelAddresses) -> PendingKernelNames {
        let (reply, named) = mpsc::channel();
        let sent = match &self.kernel_thread {
            Some(thread) => thread.jobs.send((addresses, reply)).map_err(|e| e.0),
            None => Err((addresses, reply)),
        };
        if let Err((addresses, reply)) = sent {
            self.kernel_thread = None;
            std::thread::spawn(move || {
                let _ = reply.send(addresses.name());
            });
        }
        PendingKernelNames(named)
    }

    /// Keeps the names [`KernelAddresses::name`] gave; after a failure, kernel frames
    /// stay unnamed.
    pub fn add_kernel_names(&mut self, named: KernelNames) {
        match named.0 {
            Ok(named) => self.kernel_cache.extend(named),
            Err(err) => {
                log::warn!("cannot symbolize kernel stacks: {err}");
                self.kernel_failed = true;
            }
        }
    }

    /// The device and inode of the file this process runs.
    fn own_executable(&mut self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt as _;
        *self.own_executable.get_or_insert_with(|| {
            fs::metadata("/proc/self/exe")
                .ok()
                .map(|m| (m.dev(), m.ino()))
        })
    }

    /// Symbols for the file offsets of each mapped object of `work` (its index in
    /// `maps.objects`, its offsets); `None` where it has none. With many offsets in more
    /// than one object, the objects are shared out between this symbolizer and the one
    /// of the [`NamingThread`] (by offsets, the most first), and an object stays with the
    /// one it was given to: each file is parsed once, and a stopping tracer makes its
    /// user wait for naming.
    fn symbolize_objects(
        &mut self,
        maps: &ProcessMaps,
        work: &[(usize, Vec<u64>)],
    ) -> Vec<Vec<Option<Sym<'static>>>> {
        let own_executable = self.own_executable();
        let files: Vec<Option<ElfFile>> = work
            .iter()
            .map(|(index, _)| self.elf_file(&maps.objects[*index], own_executable))
            .collect();
        // An object named on the naming thread before is named there again (its file is
        // parsed there); new ones go to the side with fewer offsets, most first, once
        // there are enough to share.
        let key = |i: usize| {
            let object = &maps.objects[work[i].0];
            (object.dev.clone(), object.inode)
        };
        let mut on_thread: Vec<bool> = (0..work.len())
            .map(|i| self.on_naming_thread.contains(&key(i)))
            .collect();
        let total: usize = work.iter().map(|(_, offsets)| offsets.len()).sum();
        if total >= SHARED_NAMING_OFFSETS {
            let load = |on: bool, sides: &[bool]| -> usize {
                (0..work.len())
                    .filter(|&i| sides[i] == on)
                    .map(|i| work[i].1.len())
                    .sum()
            };
            let mut by_size: Vec<usize> = (0..work.len())
                .filter(|&i| !on_thread[i] && !self.on_main_symbolizer.contains(&key(i)))
                .collect();
            by_size.sort_by_key(|&i| std::cmp::Reverse(work[i].1.len()));
            let (mut here, mut there) = (load(false, &on_thread), load(true, &on_thread));
            for i in by_size {
                if there < here {
                    on_thread[i] = true;
                    there += work[i].1.len();
                } else {
                    here += work[i].1.len();
                }
            }
        }
        if on_thread.contains(&true) && self.naming_thread.is_none() {
            self.naming_thread = NamingThread::start();
        }
        let thread_jobs: Vec<(usize, ElfFile, Vec<u64>)> = (0..work.len())
            .filter(|&i| on_thread[i])
            .filter_map(|i| Some((i, files[i].clone()?, work[i].1.clone())))
            .collect();
        let sent = match (&self.naming_thread, thread_jobs.is_empty()) {
            (Some(thread), false) => thread.jobs.send(NamingRequest::Name(thread_jobs)).is_ok(),
            _ => false,
        };
        let mut named: Vec<Option<ObjectSymbols>> = vec![None; work.len()];
        for i in 0..work.len() {
            if !on_thread[i] || !sent {
                named[i] = files[i].as_ref().map(|file| {
                    file.symbolize(&self.symbolizer, &work[i].1)
                        .map_err(|err| err.to_string())
                });
                self.on_main_symbolizer.insert(key(i));
            }
        }
        if sent && let Some(thread) = &self.naming_thread {
            for (i, symbols) in thread.named.recv().unwrap_or_default() {
                named[i] = Some(symbols);
            }
            for i in (0..work.len()).filter(|&i| on_thread[i]) {
                self.on_naming_thread.insert(key(i));
            }
        }
        named
            .into_iter()
            .enumerate()
            .map(|(i, symbols)| match symbols {
                Some(Ok(symbols)) => symbols,
                Some(Err(err)) => {
                    // Not an ELF file (e.g. a JIT's memfd) or unreadable: fall back, once.
                    let object = &maps.objects[work[i].0];
                    let path = crate::system::text::escape_text(&object.path);
                    log::warn!("cannot read symbols of {path}: {err}");
                    self.unreadable.insert(key(i));
                    vec![None; work[i].1.len()]
                }
                // Unreadable, or lost with the naming thread: unnamed.
                None => vec![None; work[i].1.len()],
            })
            .collect()
    }

    /// `object`'s file as blazesym is to read it, through our one descriptor of it;
    /// `None` if it cannot be read.
    fn elf_file(
        &mut self,
        object: &MappedObject,
        own_executable: Option<(u64, u64)>,
    ) -> Option<ElfFile> {
        let key = (object.dev.clone(), object.inode);
        if self.unreadable.contains(&key) {
            return None;
        }
        if !self.shared_files.contains_key(&key)
            && let Some(file) = &object.file
        {
            self.shared_files.insert(key.clone(), Arc::clone(file));
        }
        let file = self.shared_files.get(&key)?;
        Some(ElfFile {
            path: format!("/proc/self/fd/{}", file.as_raw_fd()),
            // The tracer's own frames (a system-wide profile has them) are named from its
            // symbol table alone: its debug information is tens of megabytes to parse
            // while the user waits for the report.
            debug_syms: !is_same_file(file, own_executable),
        })
    }

    /// Symbols for offsets into the target's vDSO, looked up in ours: the kernel maps
    /// the same image into every process, so only the base differs.
    fn symbolize_vdso(&mut self, wanted: &[(usize, u64)]) -> Vec<Option<Sym<'static>>> {
        let own = *self.own_vdso.get_or_insert_with(|| {
            let maps = fs::read_to_string("/proc/self/maps").ok()?;
            maps.lines()
                .filter_map(parse_maps_line)
                .find(|e| e.path.as_deref() == Some(VDSO))
                .map(|e| (e.start, e.end))
        });
        let Some((start, end)) = own else {
            return vec![None; wanted.len()];
        };
        let addrs: Vec<u64> = wanted.iter().map(|&(_, offset)| start + offset).collect();
        if addrs.iter().any(|&a| a >= end) {
            return vec![None; wanted.len()];
        }
        let mut process = Process::new(Pid::Slf);
        process.map_files = false;
        process.perf_map = false;
        match self
            .symbolizer
            .symbolize(&Source::Process(process), Input::AbsAddr(&addrs))
        {
            Ok(symbols) => symbols
                .into_iter()
                .map(|s| s.into_sym().map(Sym::into_owned))
                .collect(),
            Err(err) => {
                log::debug!("cannot symbolize vDSO addresses: {err}");
                vec![None; wanted.len()]
            }
        }
    }

    /// The JIT symbol at `addr` from the target's perf map or, failing that, its jitdump,
    /// each re-read when it grew.
    fn jit_name(&mut self, maps: &ProcessMaps, addr: u64) -> Option<String> {
        self.perf_map_name(maps, addr)
            .or_else(|| self.jitdump_name(maps, addr))
            .or_else(|| maps.gdb_jit_name(addr).map(str::to_string))
    }

    fn jitdump_name(&mut self, maps: &ProcessMaps, addr: u64) -> Option<String> {
        let file = maps.jitdump()?;
        let len = file.metadata().ok()?.len();
        let (parsed_len, symbols) = self.jitdumps.entry(maps.pid).or_default();
        if *parsed_len != len {
            let mut bytes = Vec::new();
            let mut reader = file;
            reader.seek(SeekFrom::Start(0)).ok()?;
            reader.read_to_end(&mut bytes).ok()?;
            *symbols = JitSymbols::parse(&bytes).unwrap_or_default();
            *parsed_len = len;
        }
        symbols.lookup(addr).map(str::to_string)
    }

    fn perf_map_name(&mut self, maps: &ProcessMaps, addr: u64) -> Option<String> {
        let map = match &maps.perf_map.at_exit {
            Some(map) => map,
            None => self.open_perf_map(maps)?,
        };
        // HotSpot's template interpreter is one blob: its frames are interpreted methods.
        map.lookup(addr).map(|name| match name {
            "Interpreter" => "[interpreted]".to_string(),
            name => name.to_string(),
        })
    }

    /// The perf map of `maps`'s process read through its descriptor (or, without one,
    /// through our own /tmp), parsed again whenever it grew.
    fn open_perf_map(&mut self, maps: &ProcessMaps) -> Option<&PerfMap> {
        let CachedPerfMap {
            fallback,
            parsed_len,
            map,
        } = self.perf_maps.entry(maps.pid).or_default();
        let file = match &maps.perf_map.file {
            Some(file) => file,
            None => fallback
                .get_or_insert_with(|| maps.perf_map.open_fallback())
                .as_ref()?,
        };
        let len = file.metadata().ok()?.len();
        if *parsed_len != Some(len) {
            *map = read_perf_map(file).unwrap_or_default();
            *parsed_len = Some(len);
        }
        Some(map)
    }
}

/// Reads a perf map through an already open descriptor, ignoring a last line that the
/// runtime may still be writing.
fn read_perf_map(mut file: &File) -> io::Result<PerfMap> {
    file.seek(SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    Ok(parse_perf_map(&String::from_utf8_lossy(&bytes[..complete])))
}

/// An offset into the file of a mapped object: (device, inode, file offset).
type ObjectOffset = (String, u64, u64);

/// Names to look up above which the objects are shared out between two threads.
const SHARED_NAMING_OFFSETS: usize = 4096;

/// How long after [`StackSymbolizer::prepare`] its parsing starts: the launch and the
/// first reads of the rings go first.
const PREPARE_DELAY: Duration = Duration::from_millis(300);

/// The files [`StackSymbolizer::prepare`] parses at most (each costs memory).
const PREPARED_FILES: usize = 8;

/// Whether a mapped file named `module` is a C library: glibc's (`libc.so.6`, or
/// `libc-2.31.so` before 2.34) or musl's (`libc.musl-x86_64.so.1`, `ld-musl-x86_64.so.1`).
fn is_c_library(module: &str) -> bool {
    module.starts_with("libc.so")
        || module.starts_with("libc-")
        || module.starts_with("libc.musl-")
        || module.starts_with("ld-musl-")
}

/// A blazesym symbolizer that demangles Rust and C++ names and expands inlined functions
/// where debug information has them.
fn new_blazesym() -> Symbolizer {
    Symbolizer::builder()
        // Names are demangled in `frames_of`, only those that are mangled.
        .enable_demangling(false)
        .enable_code_info(true)
        .enable_inlined_fns(true)
        // Our paths are /proc/self/fd/N, and a number can be reused for another file
        // after a snapshot is dropped: let blazesym notice the change.
        .enable_auto_reload(true)
        .build()
}

/// A blazesym symbolizer for kernel addresses (kallsyms names functions).
fn kernel_blazesym() -> Symbolizer {
    Symbolizer::builder().enable_demangling(false).build()
}

/// A mapped object's file as blazesym is to read it.
#[derive(Clone, Debug)]
struct ElfFile {
    /// `/proc/self/fd/N` of our descriptor of it.
    path: String,
    /// Read its debug information, not only its symbol table.
    debug_syms: bool,
}

impl ElfFile {
    /// Symbols for file offsets `offsets`; `None` where it has none.
    fn symbolize(
        &self,
        symbolizer: &Symbolizer,
        offsets: &[u64],
    ) -> Result<Vec<Option<Sym<'static>>>, blazesym::Error> {
        let mut elf = Elf::new(&self.path);
        elf.debug_syms = self.debug_syms;
        let symbols = symbolizer.symbolize(&Source::Elf(elf), Input::FileOffset(offsets))?;
        Ok(symbols
            .into_iter()
            .map(|s| s.into_sym().map(Sym::into_owned))
            .collect())
    }
}

/// Objects to name: (index in the caller's list, file, file offsets).
type NamingJob = Vec<(usize, ElfFile, Vec<u64>)>;

/// What the [`NamingThread`] is asked.
#[derive(Debug)]
enum NamingRequest {
    /// Parse these files (an offset of each is looked up, its name not wanted), while no
    /// job waits, from [`PREPARE_DELAY`] after the thread started: no reply.
    Prepare(Vec<(ElfFile, u64)>),
    /// Name these: one reply.
    Name(NamingJob),
}

/// Symbols for the offsets of an object (`None` where it has none), or why it has none.
type ObjectSymbols = Result<Vec<Option<Sym<'static>>>, String>;

/// A blazesym symbolizer on a thread of its own, living as long as the
/// [`StackSymbolizer`] that started it: blazesym's caches are `Rc`, so a symbolizer stays
/// on the thread that made it, and keeps what it parsed for the next request.
#[derive(Debug)]
struct NamingThread {
    jobs: mpsc::Sender<NamingRequest>,
    named: mpsc::Receiver<Vec<(usize, ObjectSymbols)>>,
}

impl NamingThread {
    /// `None` if no thread can be started: everything is then named on the caller's.
    fn start() -> Option<Self> {
        let (jobs, requests) = mpsc::channel::<NamingRequest>();
        let (replies, named) = mpsc::channel();
        let prepare_from = Instant::now() + PREPARE_DELAY;
        std::thread::Builder::new()
            .name("tracer-naming".into())
            .spawn(move || {
                let symbolizer = new_blazesym();
                let mut to_prepare: Vec<(ElfFile, u64)> = Vec::new();
                // Ends when the StackSymbolizer (the sender) is dropped.
                while let Some(request) = next_request(
                    &requests,
                    &mut to_prepare,
                    prepare_from,
                    |(file, offset)| {
                        let _ = file.symbolize(&symbolizer, &[offset]);
                    },
                ) {
                    match request {
                        NamingRequest::Prepare(files) => {
                            // Kept in order, taken from the end.
                            to_prepare.extend(files.into_iter().rev());
                        }
                        NamingRequest::Name(job) => {
                            // Naming is what the stop waits for: what was not parsed yet
                            // is parsed as it is named.
                            to_prepare.clear();
                            let reply = job
                                .into_iter()
                                .map(|(i, file, offsets)| {
                                    let symbols = file.symbolize(&symbolizer, &offsets);
                                    (i, symbols.map_err(|err| err.to_string()))
                                })
                                .collect();
                            if replies.send(reply).is_err() {
                                break;
                            }
                        }
                    }
                }
            })
            .ok()?;
        Some(Self { jobs, named })
    }
}

/// The next request on `requests`; while none comes and there is something `to_prepare`
/// (from `prepare_from` on), prepares it with `prepare`, one at a time. `None` once the
/// sender is gone.
fn next_request<R, P>(
    requests: &mpsc::Receiver<R>,
    to_prepare: &mut Vec<P>,
    prepare_from: Instant,
    mut prepare: impl FnMut(P),
) -> Option<R> {
    loop {
        if to_prepare.is_empty() {
            return requests.recv().ok();
        }
        let wait = prepare_from.saturating_duration_since(Instant::now());
        match requests.recv_timeout(wait) {
            Ok(request) => return Some(request),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(item) = to_prepare.pop() {
                    prepare(item);
                }
            }
        }
    }
}

/// Kernel addresses to name, and where to send their names.
type KernelJob = (KernelAddresses, mpsc::Sender<KernelNames>);

/// A symbolizer of kallsyms on a thread of its own, which parses kallsyms
/// [`PREPARE_DELAY`] after it starts unless a request comes first, and keeps it parsed.
#[derive(Debug)]
struct KernelNamingThread {
    jobs: mpsc::Sender<KernelJob>,
}

impl KernelNamingThread {
    fn start() -> Option<Self> {
        let (jobs, requests) = mpsc::channel::<KernelJob>();
        let prepare_from = Instant::now() + PREPARE_DELAY;
        std::thread::Builder::new()
            .name("tracer-kernel-naming".into())
            .spawn(move || {
                let symbolizer = kernel_blazesym();
                // Any address has kallsyms parsed; its name is not wanted.
                let mut to_prepare = vec![KernelAddresses(vec![u64::MAX])];
                while let Some((addresses, reply)) =
                    next_request(&requests, &mut to_prepare, prepare_from, |addresses| {
                        let _ = addresses.name_with(&symbolizer);
                    })
                {
                    to_prepare.clear();
                    let _ = reply.send(addresses.name_with(&symbolizer));
                }
            })
            .ok()?;
        Some(Self { jobs })
    }
}

/// Kernel names being found on another thread (see [`StackSymbolizer::name_kernel_apart`]).
pub struct PendingKernelNames(mpsc::Receiver<KernelNames>);

impl PendingKernelNames {
    pub fn wait(self) -> KernelNames {
        self.0
            .recv()
            .unwrap_or_else(|_| KernelNames(Err("the kernel naming thread ended".to_string())))
    }
}

/// The frames of the addresses of one process that [`StackSymbolizer::user_addresses`]
/// named.
pub struct UserAddresses<'c> {
    pid: u32,
    cache: &'c foldhash::HashMap<(u32, u64), Rc<[Frame]>>,
}

impl<'c> UserAddresses<'c> {
    /// The frames of lookup address `lookup` (see [`lookup_addresses`]), inlined ones
    /// first; each address has at least one.
    pub fn frames(&self, lookup: u64) -> &'c [Frame] {
        &self.cache[&(self.pid, lookup)]
    }
}

/// The addresses a stack's frames are named at, innermost first: the instruction
/// pointer, then each return address less one (so it lands in its call), up to the
/// first zero.
pub fn lookup_addresses(addrs: &[u64]) -> impl Iterator<Item = u64> + '_ {
    lookups(addrs).map(|(lookup, _)| lookup)
}

/// The (lookup address, address) of each frame of a stack as the kernel records it
/// (innermost first, zero-padded): return addresses point after the call, so all but the
/// first are looked up one byte earlier, inside the call instruction.
fn lookups(addrs: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
    until_zero(addrs).iter().enumerate().map(|(index, &addr)| {
        let lookup = if index == 0 {
            addr
        } else {
            addr.saturating_sub(1)
        };
        (lookup, addr)
    })
}

fn until_zero(addrs: &[u64]) -> &[u64] {
    let end = addrs.iter().position(|&a| a == 0).unwrap_or(addrs.len());
    &addrs[..end]
}

/// Whether `file` is the file of device and inode `id`.
fn is_same_file(file: &File, id: Option<(u64, u64)>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    id.is_some() && file.metadata().ok().map(|m| (m.dev(), m.ino())) == id
}

/// Kernel addresses to name (see [`StackSymbolizer::unnamed_kernel_addresses`]).
#[derive(Debug, Default)]
pub struct KernelAddresses(Vec<u64>);

/// What [`KernelAddresses::name`] found.
#[derive(Debug)]
pub struct KernelNames(Result<Vec<(u64, Vec<Frame>)>, String>);

impl KernelAddresses {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names the addresses from /proc/kallsyms with a symbolizer of its own, so that it
    /// can run on another thread while user stacks are named (a [`StackSymbolizer`] is
    /// not `Send`).
    pub fn name(self) -> KernelNames {
        self.name_with(&kernel_blazesym())
    }

    fn name_with(self, symbolizer: &Symbolizer) -> KernelNames {
        if self.0.is_empty() {
            return KernelNames(Ok(Vec::new()));
        }
        // vmlinux images are rarely installed and slow to parse; kallsyms names
        // functions.
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        let named = symbolizer
            .symbolize(&source, Input::AbsAddr(&self.0))
            .map(|symbols| {
                self.0
                    .iter()
                    .zip(symbols)
                    .map(|(&addr, symbolized)| {
                        let frames = match symbolized {
                            Symbolized::Sym(sym) => frames_of(&sym, None),
                            Symbolized::Unknown(_) => vec![Frame::unknown()],
                        };
                        (addr, frames)
                    })
                    .collect()
            })
            .map_err(|err| err.to_string());
        KernelNames(named)
    }
}

/// The frames of one symbolized address, innermost first: blazesym lists inlined
/// calls outermost first, after the function that contains them.
fn frames_of(sym: &Sym<'_>, module: Option<&str>) -> Vec<Frame> {
    let frame = |name: &str, inlined, offset| Frame {
        name: demangle(name),
        module: module.map(str::to_string),
        inlined,
        offset,
    };
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, true, None))
        .collect();
    frames.push(frame(&sym.name, false, Some(sym.offset as u64)));
    frames
}

/// `name` demangled when it is a mangled Rust (legacy `_ZN...E` or v0 `_R...`) or C++
/// (`_Z...`) name, without Rust's hash; any other name as it is (a C function `f` is not
/// the type `float`).
pub fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") && !name.starts_with("_R") && !name.starts_with("__Z") {
        return name.to_string();
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

/// The frame for an address no symbol source could name.
fn fallback_frame(location: Location<'_>) -> Frame {
    match location {
        Location::File {
            module,
            file_offset,
            ..
        } => Frame::module_offset(module, file_offset),
        Location::Vdso { offset } => Frame::module_offset(VDSO, offset),
        Location::Anonymous => Frame {
            name: format!("{UNKNOWN} (anonymous memory)"),
            ..Frame::unknown()
        },
        Location::Unmapped => Frame::unknown(),
    }
}

/// True when /proc/kallsyms lists real (non-zero) addresses.
fn kallsyms_has_addresses() -> bool {
    // Only the head: the kernel takes ~0.1 s to print the whole file, and blazesym reads
    // it again anyway to name the addresses.
    let Ok(file) = File::open("/proc/kallsyms") else {
        return false;
    };
    io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .take(100)
        .any(|line| {
            line.split_whitespace()
                .next()
                .and_then(|addr| u64::from_str_radix(addr, 16).ok())
                .is_some_and(|a| a != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a02000 r--p 00000000 fd:01 1234                       /usr/bin/app
55d0c8a02000-55d0c8a05000 r-xp 00002000 fd:01 1234                       /usr/bin/app
7f0000000000-7f0000010000 rwxp 00000000 00:00 0 
7f1000000000-7f1000020000 r-xp 00028000 fd:01 5678                       /opt/lib with space/libfoo.so.1 (deleted)
7fff00000000-7fff00002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn locates_addresses_in_a_snapshot() {
        let maps = ProcessMaps::from_maps_text(1, MAPS);
        assert_eq!(
            maps.locate(0x55d0c8a02010),
            Location::File {
                path: "/usr/bin/app",
                module: "app",
                file_offset: 0x2010
            }
        );
        assert_eq!(
            maps.locate(0x7f1000000100),
            Location::File {
                path: "/opt/lib with space/libfoo.so.1",
                module: "libfoo.so.1",
                file_offset: 0x28100
            }
        );
        assert_eq!(maps.locate(0x7f0000000042), Location::Anonymous);
        assert_eq!(
            maps.locate(0x7fff00000123),
            Location::Vdso { offset: 0x123 }
        );
        // Not executable, between mappings, at an end (exclusive), below everything.
        assert_eq!(maps.locate(0x55d0c8a00010), Location::Unmapped);
        assert_eq!(maps.locate(0x55d0c8a05000), Location::Unmapped);
        assert_eq!(maps.locate(0x10), Location::Unmapped);
        assert_eq!(maps.locate(u64::MAX), Location::Unmapped);
    }

    #[test]
    fn only_mangled_names_are_demangled() {
        // One-letter C functions are not C++ builtin types.
        for c in ["f", "i", "w", "main", "gc_collect_main", "Z", "R"] {
            assert_eq!(demangle(c), c);
        }
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_Znot_really"), "_Znot_really");
    }

    #[test]
    fn unreadable_objects_fall_back_to_module_offset() {
        // None of these files exist, so nothing can be opened or named.
        let maps = ProcessMaps::from_maps_text(std::process::id(), MAPS);
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(
            &maps,
            &[
                0x7f1000000100,
                0x55d0c8a02011,
                0x7f0000000042,
                0x10,
                0,
                0x55d0c8a02011,
            ],
        );
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        // Offsets are of the address itself, not of the adjusted lookup address. Anonymous
        // memory (JIT code no source names) says so; an address mapped nowhere does not.
        assert_eq!(
            names,
            [
                "libfoo.so.1+0x28100",
                "app+0x2011",
                "[unknown] (anonymous memory)",
                UNKNOWN
            ]
        );
        assert_eq!(frames[0].module.as_deref(), Some("libfoo.so.1"));
        assert_eq!(frames[2].module, None);
    }

    #[test]
    fn refresh_keeps_unloaded_libraries() {
        let mut maps = ProcessMaps::from_maps_text(1, MAPS);
        let fresh = "\
55d0c8a02000-55d0c8a05000 r-xp 00002000 fd:01 1234                       /usr/bin/app
7f1000010000-7f1000030000 r-xp 00000000 fd:01 9999                       /usr/lib/libnew.so
";
        maps.merge_maps(fresh);
        // The same file keeps its object; libfoo overlaps libnew and is replaced.
        assert_eq!(maps.objects.len(), 3);
        assert!(matches!(maps.locate(0x7f1000000100), Location::Unmapped));
        assert!(matches!(
            maps.locate(0x7f1000010000),
            Location::File {
                module: "libnew.so",
                ..
            }
        ));
        assert!(matches!(maps.locate(0x7fff00000000), Location::Vdso { .. }));
    }

    #[test]
    fn snapshots_share_one_descriptor_per_file() {
        let first = ProcessMaps::capture(std::process::id()).unwrap();
        let second = ProcessMaps::capture(std::process::id()).unwrap();
        let mut shared = 0;
        for object in &second.objects {
            let Some(file) = &object.file else {
                continue;
            };
            let same = first
                .objects
                .iter()
                .find(|o| o.dev == object.dev && o.inode == object.inode)
                .and_then(|o| o.file.as_ref());
            assert!(
                same.is_some_and(|same| Arc::ptr_eq(same, file)),
                "{} opened twice",
                object.path
            );
            shared += 1;
        }
        assert!(shared > 0, "no file opened: {:?}", second.objects);
    }

    #[test]
    fn a_process_found_gone_is_marked_exited_and_keeps_its_mappings() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let mut maps = ProcessMaps::capture(child.id()).unwrap();
        assert!(maps.refresh().is_ok());
        assert!(!maps.has_exited());
        // Counted after the refresh: the capture may have come before the child's exec.
        let mapped = maps.mapped_files().count();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(maps.refresh().is_err());
        assert!(maps.has_exited());
        assert_eq!(maps.mapped_files().count(), mapped);
        assert!(maps.mapped_files().all(|m| m.file.is_some()));
    }

    #[test]
    fn parses_perf_maps() {
        let map = parse_perf_map(
            "7f3a4c001000 40 LazyCompile:~foo /app/main.js:1\n\
             0x7f3a4c002000 0x20 Builtin: ArgumentsAdaptor\n\
             not a line\n\
             7f3a4c003000 zz bad size\n\
             7f3a4c004000 0 empty\n\
             7f3a4c001000 40 LazyCompile:*foo /app/main.js:1\n",
        );
        assert_eq!(map.len(), 2);
        assert_eq!(
            map.lookup(0x7f3a4c001000),
            Some("LazyCompile:*foo /app/main.js:1")
        );
        assert_eq!(
            map.lookup(0x7f3a4c00103f),
            Some("LazyCompile:*foo /app/main.js:1")
        );
        assert_eq!(map.lookup(0x7f3a4c001040), None);
        assert_eq!(
            map.lookup(0x7f3a4c002010),
            Some("Builtin: ArgumentsAdaptor")
        );
        assert_eq!(map.lookup(0x7f3a4c000fff), None);
        assert!(parse_perf_map("").is_empty());
    }

    #[test]
    fn names_jit_frames_from_the_perf_map() {
        let dir = std::env::temp_dir().join(format!("tracer-perfmap-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf-1.map");
        // The last line is incomplete: the runtime is still writing it.
        fs::write(
            &path,
            "7f0000000000 100 jitted_fn\n7f0000000100 100 half_wri",
        )
        .unwrap();
        let mut maps = ProcessMaps::from_maps_text(std::process::id(), MAPS);
        maps.perf_map = PerfMapSource {
            fallback_path: Some(path),
            owner_uid: Some(fs::metadata(&dir).unwrap().uid()),
            ..Default::default()
        };
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &[0x7f0000000042, 0x7f0000000142]);
        assert_eq!(frames[0].name, "jitted_fn");
        assert_eq!(frames[0].module.as_deref(), Some(JIT_MODULE));
        assert_eq!(frames[1].name, "[unknown] (anonymous memory)");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_exited_process_keeps_its_perf_map_read_not_open() {
        let dir = std::env::temp_dir().join(format!("tracer-perfmap-exit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf-2.map");
        fs::write(&path, "7f0000000000 100 jitted_fn\n").unwrap();
        let mut maps = ProcessMaps::from_maps_text(std::process::id(), MAPS);
        maps.perf_map = PerfMapSource {
            file: Some(File::open(&path).unwrap()),
            ..Default::default()
        };
        maps.mark_exited();
        assert!(maps.perf_map.file.is_none());
        // Gone from disk too: what was read at the exit names the frame.
        fs::remove_dir_all(dir).unwrap();
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &[0x7f0000000042]);
        assert_eq!(frames[0].name, "jitted_fn");
    }

    #[test]
    fn parses_ns_pid() {
        let status = "Name:\tjava\nTgid:\t4242\nNSpid:\t4242\t17\nPPid:\t1\n";
        assert_eq!(parse_ns_pid(status), Some(17));
        assert_eq!(parse_ns_pid("NSpid:\t99\n"), Some(99));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
    }

    #[inline(never)]
    fn symbolization_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
    }

    #[test]
    fn names_a_function_of_this_binary() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let target = symbolization_target as fn(u64) -> u64 as usize as u64;
        assert!(symbolization_target(3) != 0);
        let mut symbolizer = StackSymbolizer::new();
        // As the leaf, and as a return address inside the function (looked up at -1).
        let frames = symbolizer.user_frames(&maps, &[target + 1, target + 2]);
        let outer: Vec<&Frame> = frames.iter().filter(|f| !f.inlined).collect();
        assert_eq!(outer.len(), 2, "{frames:?}");
        for frame in outer {
            assert!(frame.name.ends_with("symbolization_target"), "{frame:?}");
            assert!(
                !frame.name.contains("17h"),
                "demangled without hash: {frame:?}"
            );
            let exe = std::env::current_exe().unwrap();
            assert_eq!(
                frame.module.as_deref(),
                exe.file_name().and_then(|n| n.to_str()),
                "{frame:?}"
            );
        }
    }

    unsafe extern "C" {
        /// glibc's backtrace(3): the simplest way to get return addresses in a test.
        fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
    }

    #[inline(never)]
    fn return_addresses() -> Vec<u64> {
        let mut buffer = [std::ptr::null_mut(); 8];
        // SAFETY: the buffer holds as many entries as we pass as its size.
        let depth = unsafe { backtrace(buffer.as_mut_ptr(), buffer.len() as libc::c_int) };
        buffer[..depth.max(0) as usize]
            .iter()
            .map(|&p| p as u64)
            .collect()
    }

    #[inline(always)]
    fn inlined_helper() -> Vec<u64> {
        std::hint::black_box(return_addresses())
    }

    #[inline(never)]
    fn calls_inlined_helper() -> Vec<u64> {
        std::hint::black_box(inlined_helper())
    }

    #[test]
    // Inlining is only recorded in DWARF: the release profile keeps line tables for this
    // crate (see the workspace Cargo.toml).
    fn expands_inlined_functions() {
        let stack = calls_inlined_helper();
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let mut symbolizer = StackSymbolizer::new();
        symbolizer.own_executable = Some(None);
        let frames = symbolizer.user_frames(&maps, &stack);
        let names: Vec<(&str, bool)> = frames
            .iter()
            .map(|f| (f.name.rsplit("::").next().unwrap(), f.inlined))
            .collect();
        let helper = names
            .iter()
            .position(|&n| n == ("inlined_helper", true))
            .unwrap_or_else(|| panic!("no inlined frame in {frames:#?}"));
        assert_eq!(names[helper + 1], ("calls_inlined_helper", false));
        assert_eq!(names[helper - 1], ("return_addresses", false));
    }

    /// The tracer's own frames are named from its symbol table: no inlined frames.
    #[test]
    fn names_its_own_frames_from_the_symbol_table() {
        let stack = calls_inlined_helper();
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let frames = StackSymbolizer::new().user_frames(&maps, &stack);
        assert!(frames.iter().all(|f| !f.inlined), "{frames:#?}");
        assert!(
            frames
                .iter()
                .any(|f| f.name.ends_with("calls_inlined_helper")),
            "{frames:#?}"
        );
    }

    /// Many addresses in two objects are shared out between two symbolizers: each named
    /// as it is in batches too small to share, and each object, once given to one, stays
    /// with it (its file parsed once), also in a later batch of new addresses.
    #[test]
    fn names_many_addresses_in_two_objects_as_few_at_a_time() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let ours = symbolization_target as fn(u64) -> u64 as usize as u64;
        let libc = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let batch = |first: u64| -> Vec<Vec<u64>> {
            (first..first + SHARED_NAMING_OFFSETS as u64 / 2 + 100)
                .flat_map(|i| [vec![ours + i * 4], vec![libc + i * 4, ours + i * 2]])
                .collect()
        };
        let mut symbolizer = StackSymbolizer::new();
        symbolizer.own_executable = Some(None);
        let mut reference = StackSymbolizer::new();
        reference.own_executable = Some(None);
        for first in [0, SHARED_NAMING_OFFSETS as u64] {
            let stacks = batch(first);
            let stacks: Vec<&[u64]> = stacks.iter().map(Vec::as_slice).collect();
            let shared: Vec<Vec<Frame>> = symbolizer
                .user_stacks(&maps, &stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect();
            let mut few_at_a_time: Vec<Vec<Frame>> = Vec::new();
            for batch in stacks.chunks(SHARED_NAMING_OFFSETS / 8) {
                few_at_a_time.extend(
                    reference
                        .user_stacks(&maps, batch)
                        .into_iter()
                        .map(|frames| frames.into_iter().cloned().collect()),
                );
            }
            assert_eq!(shared, few_at_a_time, "batch from {first}");
            assert!(
                shared
                    .iter()
                    .flatten()
                    .any(|f| f.module.as_deref().is_some_and(|m| m.starts_with("libc")))
            );
            assert!(
                !symbolizer.on_naming_thread.is_empty(),
                "nothing shared out"
            );
            assert!(
                symbolizer
                    .on_naming_thread
                    .is_disjoint(&symbolizer.on_main_symbolizer),
                "an object parsed by both symbolizers"
            );
        }
        assert!(reference.on_naming_thread.is_empty());
    }

    #[test]
    fn prepared_objects_are_named_where_they_were_parsed_and_alike() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let ours = symbolization_target as fn(u64) -> u64 as usize as u64;
        let libc = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let stacks: Vec<Vec<u64>> = (0..64).map(|i| vec![libc + i * 4, ours + i * 2]).collect();
        let stacks: Vec<&[u64]> = stacks.iter().map(Vec::as_slice).collect();
        let named = |symbolizer: &mut StackSymbolizer| -> Vec<Vec<Frame>> {
            symbolizer
                .user_stacks(&maps, &stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect()
        };
        let mut plain = StackSymbolizer::new();
        plain.own_executable = Some(None);
        let expected = named(&mut plain);
        // Named before the preparation starts, and again once it had time to run.
        for wait in [Duration::ZERO, PREPARE_DELAY * 2] {
            let mut prepared = StackSymbolizer::new();
            prepared.own_executable = Some(None);
            prepared.prepare([&maps]);
            std::thread::sleep(wait);
            assert_eq!(named(&mut prepared), expected, "after {wait:?}");
            assert!(prepared.on_naming_thread.len() >= 2, "after {wait:?}");
            assert!(
                prepared.on_main_symbolizer.is_empty(),
                "an object prepared on the naming thread was parsed on the caller's"
            );
        }
        // Kernel addresses, where kallsyms shows them (as root).
        let kernel: Vec<u64> = fs::read_to_string("/proc/kallsyms")
            .unwrap()
            .lines()
            .filter_map(|line| u64::from_str_radix(line.split(' ').next()?, 16).ok())
            .filter(|&addr| addr != 0)
            .step_by(5000)
            .map(|addr| addr + 1)
            .collect();
        let kernel_stacks: Vec<&[u64]> = kernel.chunks(4).collect();
        let kernel_names = |symbolizer: &mut StackSymbolizer| -> Vec<Vec<Frame>> {
            symbolizer
                .kernel_stacks(&kernel_stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect()
        };
        let expected = kernel_names(&mut StackSymbolizer::new());
        let mut prepared = StackSymbolizer::new();
        prepared.prepare([&maps]);
        assert_eq!(prepared.kernel_thread.is_some(), !kernel.is_empty());
        std::thread::sleep(PREPARE_DELAY * 2);
        assert_eq!(kernel_names(&mut prepared), expected);
    }

    #[test]
    fn names_this_processs_libc() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let getpid = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &[getpid]);
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert!(frames[0].name.contains("getpid"), "{frames:?}");
        assert!(
            frames[0]
                .module
                .as_deref()
                .is_some_and(|m| m.starts_with("libc")),
            "{frames:?}"
        );
    }

    #[test]
    fn names_vdso_functions() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let Some(vdso) = maps.mappings.iter().find(|m| m.target == Target::Vdso) else {
            eprintln!("skipped: no vDSO mapped");
            return;
        };
        // Probe the whole image; some of it is code of the exported clock functions.
        let addrs: Vec<u64> = (vdso.start..vdso.end).step_by(16).collect();
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &addrs);
        assert_eq!(frames.len(), addrs.len());
        assert!(
            frames.iter().all(|f| f.module.as_deref() == Some(VDSO)),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|f| f.name.contains("gettime")),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|f| f.name.starts_with("[vdso]+0x")),
            "{frames:?}"
        );
    }

    #[test]
    fn survives_the_process_exiting() {
        // A short-lived child: capture its maps, let it exit, then symbolize.
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        // Give exec time to replace the forked image.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut maps = ProcessMaps::capture(child.id()).unwrap();
        let libc_text = fs::read_to_string(format!("/proc/{}/maps", child.id()))
            .unwrap()
            .lines()
            .filter_map(parse_maps_line)
            .find(|e| e.is_executable() && e.path.as_deref().is_some_and(|p| p.contains("libc")))
            .map(|e| e.start);
        child.wait().unwrap();
        assert!(maps.refresh().is_err(), "the process is gone");
        let Some(libc_text) = libc_text else {
            eprintln!("skipped: /bin/sleep does not map libc dynamically");
            return;
        };
        let mut symbolizer = StackSymbolizer::new();
        // Somewhere well inside libc's text: named, or at least libc+offset.
        let frames = symbolizer.user_frames(&maps, &[libc_text + 0x1000]);
        assert!(
            frames[0]
                .module
                .as_deref()
                .is_some_and(|m| m.starts_with("libc")),
            "{frames:?}"
        );
        assert!(
            !frames[0].name.contains('+'),
            "named after exit: {frames:?}"
        );
    }

    #[test]
    fn kernel_frames() {
        let mut symbolizer = StackSymbolizer::new();
        if !kallsyms_has_addresses() {
            eprintln!("skipped: /proc/kallsyms hides addresses (not root)");
            assert_eq!(
                symbolizer.kernel_frames(&[0xffffffff81000000]),
                [Frame::unknown()]
            );
            return;
        }
        let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap();
        let (addr, name) = kallsyms
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                (kind.eq_ignore_ascii_case("t") && name == "schedule").then_some((addr, name))
            })
            .next()
            .expect("schedule in kallsyms");
        let frames = symbolizer.kernel_frames(&[addr + 1, addr + 2, 0, 5]);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[0].name, name);
        assert_eq!(frames[1].name, name);
        assert_eq!(symbolizer.kernel_frames(&[1]), [Frame::unknown()]);
    }
}
