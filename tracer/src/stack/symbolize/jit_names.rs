//! Names of JIT-compiled code: from the runtime's perf map, its jitdump, or what it
//! registered through the GDB JIT interface.
//!
//! The perf map (`/tmp/perf-PID.map`) is opened while its process lives. Once the process
//! exited, the map is read and its descriptor closed. A perf map or jitdump that grew is
//! parsed again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::stack::jit::jitdump::JitSymbols;

use super::{ProcessMaps, StackSymbolizer};

/// One JIT symbol of a perf map: code in `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PerfMapEntry {
    start: u64,
    end: u64,
    name: String,
}

/// A parsed perf map (`START SIZE name` lines, hexadecimal), sorted by start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PerfMap {
    entries: Vec<PerfMapEntry>,
}

/// Parses a JIT perf map. Malformed lines are skipped; when code was compiled again at
/// the same address, the later line wins.
pub(crate) fn parse_perf_map(text: &str) -> PerfMap {
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
    pub(crate) fn lookup(&self, addr: u64) -> Option<&str> {
        let after = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries[..after].last()?;
        (addr < entry.end).then_some(entry.name.as_str())
    }

    /// Number of symbols.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// True without symbols.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Where the target's perf map is and, once it exists, an open descriptor to it.
#[derive(Debug, Default)]
pub(super) struct PerfMapSource {
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
    pub(super) fn locate(pid: u32) -> Self {
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

    pub(super) fn open_if_missing(&mut self) {
        if self.file.is_none() && self.at_exit.is_none() {
            self.file = self
                .live_path
                .as_deref()
                .and_then(|path| self.open_checked(path));
        }
    }

    /// Reads the map through its descriptor, if one is open, and closes the descriptor.
    pub(super) fn read_and_close(&mut self) {
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

/// Reads a perf map through an already open descriptor, ignoring a last line that the
/// runtime may still be writing.
fn read_perf_map(mut file: &File) -> io::Result<PerfMap> {
    file.seek(SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    Ok(parse_perf_map(&String::from_utf8_lossy(&bytes[..complete])))
}

/// A target's perf map as parsed, with the file size it was parsed at (the runtime
/// appends, so a new size means new symbols).
#[derive(Debug, Default)]
pub(super) struct CachedPerfMap {
    /// Opened through the fallback path when the snapshot has no descriptor; tried once.
    fallback: Option<Option<File>>,
    parsed_len: Option<u64>,
    map: PerfMap,
}

impl StackSymbolizer {
    /// The JIT symbol at `addr` from the target's perf map or, failing that, its jitdump,
    /// each re-read when it grew.
    pub(super) fn jit_name(&mut self, maps: &ProcessMaps, addr: u64) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::super::frames::JIT_MODULE;
    use super::super::test_support::MAPS;
    use super::*;

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
}
