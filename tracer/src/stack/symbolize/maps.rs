//! Snapshots of a process's executable mappings, taken while it runs.
//!
//! A snapshot tells where an address lies: in a mapped file, in the vDSO, in anonymous
//! memory or nowhere. It keeps the files it maps open (see `open_files`). It reads the
//! code the process's JIT registered through the GDB JIT interface.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use crate::stack::elf::ElfSymbols;
use crate::stack::jit::jitdump::JitSymbols;
use crate::system::procfs::{MapsEntry, parse_maps_line};

use super::frames::VDSO;
use super::jit_names::PerfMapSource;
use super::open_files::OpenFiles;

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
pub(super) enum Target {
    /// Index into `ProcessMaps::objects`.
    Object(usize),
    Vdso,
    Anonymous,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mapping {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) offset: u64,
    pub(super) target: Target,
}

#[derive(Clone, Debug)]
pub(super) struct MappedObject {
    /// Path as in the maps file, without ` (deleted)`.
    pub(super) path: String,
    /// File name, shown as the frame's module.
    pub(super) module: String,
    pub(super) dev: String,
    pub(super) inode: u64,
    /// Kept open so the file stays readable after the process exits or it is deleted;
    /// shared with every other snapshot that maps the same file.
    pub(super) file: Option<Arc<File>>,
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
    pub(super) pid: u32,
    /// Sorted by start, non-overlapping.
    pub(super) mappings: Vec<Mapping>,
    pub(super) objects: Vec<MappedObject>,
    pub(super) perf_map: PerfMapSource,
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
        let maps = read_maps(pid)?;
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

    /// The mappings of a process forked from this one that is gone before they could be
    /// read: at its fork they were a copy of these. It is marked exited, with no perf map
    /// or JIT code of its own.
    pub fn inherited_by(&self, child: u32) -> Self {
        Self {
            pid: child,
            mappings: self.mappings.clone(),
            objects: self.objects.clone(),
            perf_map: PerfMapSource::default(),
            gdb_jit: None,
            exited: true,
        }
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
        let maps = match read_maps(self.pid) {
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

    /// [`ProcessMaps::refresh`] without reading the maps, for a process whose new
    /// mappings the kernel tells of (each then read by [`ProcessMaps::refresh`]): what
    /// its JIT compilers wrote since is read, and whether it is gone.
    pub fn refresh_jit(&mut self) -> io::Result<()> {
        if self.exited {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        if let Err(e) = fs::metadata(format!("/proc/{}", self.pid)) {
            if is_gone(&e) {
                self.mark_exited();
            }
            return Err(e);
        }
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
    pub(super) fn mark_exited(&mut self) {
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
    pub(super) fn gdb_jit_name(&self, addr: u64) -> Option<&str> {
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

    pub(super) fn find(&self, addr: u64) -> Option<&Mapping> {
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
    pub(super) fn from_maps_text(pid: u32, maps: &str) -> Self {
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
/// `/proc/PID/maps`, failing with `ESRCH` when it is empty: a process that has exited
/// (a zombie not yet reaped) has no memory left, and a kernel thread never had any.
fn read_maps(pid: u32) -> io::Result<String> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    match maps.trim().is_empty() {
        true => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        false => Ok(maps),
    }
}

fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::MAPS;
    use super::*;

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
    fn a_zombie_has_no_mappings_to_capture_and_counts_as_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let mut maps = ProcessMaps::capture(child.id()).unwrap();
        child.kill().unwrap();
        // Not reaped: it stays a zombie, its /proc entry there, its maps empty.
        let stat = format!("/proc/{}/stat", child.id());
        while !fs::read_to_string(&stat).unwrap().contains(") Z ") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let error = ProcessMaps::capture(child.id()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ESRCH));
        assert!(maps.refresh().is_err());
        assert!(maps.has_exited());
        child.wait().unwrap();
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
}
