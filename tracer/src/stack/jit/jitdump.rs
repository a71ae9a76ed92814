//! The jitdump files runtimes write for `perf inject --jit` (V8's `--perf-prof`,
//! CPython's `-X perf_jit`, .NET, Julia): a header, then records, among them one per
//! piece of code compiled (its address, size and name) and one per piece moved. A runtime
//! maps its file into its own memory so that perf finds it; the tracer finds it there too.
//!
//! Layout (perf's `jitdump-specification.txt`): a header of at least 40 bytes (magic
//! `JiTD`, version, header size, ...), then records, each a 16-byte prefix (id, total
//! size, timestamp) and a body.

use std::collections::BTreeMap;

const MAGIC: u32 = 0x4A69_5444;
const HEADER_MIN: usize = 40;
const PREFIX: usize = 16;
const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;

/// Whether a mapped file's name is a jitdump's (`jit-PID.dump`).
pub(crate) fn is_jitdump_name(file_name: &str) -> bool {
    file_name
        .strip_prefix("jit-")
        .and_then(|rest| rest.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// The code a jitdump names, by start address: (end, name). Code loaded later at an
/// address replaces what was there.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct JitSymbols {
    by_start: BTreeMap<u64, (u64, String)>,
}

impl JitSymbols {
    /// Parses a jitdump (or as much of it as was written): `None` if it is none.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if u32_at(0)? != MAGIC {
            return None;
        }
        let header = (u32_at(8)? as usize).max(HEADER_MIN);
        let mut symbols = Self::default();
        let mut at = header;
        while let (Some(id), Some(size)) = (u32_at(at), u32_at(at + 4)) {
            let size = size as usize;
            let Some(record) = bytes.get(at..at.saturating_add(size)) else {
                break;
            };
            if size < PREFIX {
                break;
            }
            let body = &record[PREFIX..];
            match id {
                CODE_LOAD => symbols.load(body),
                CODE_MOVE => symbols.moved(body),
                _ => {}
            }
            at += size;
        }
        Some(symbols)
    }

    /// `JIT_CODE_LOAD`: pid, tid, vma, code address, code size, code index, name.
    fn load(&mut self, body: &[u8]) {
        let (Some(addr), Some(size)) = (u64_at(body, 16), u64_at(body, 24)) else {
            return;
        };
        let Some(name) = body
            .get(40..)
            .and_then(|rest| rest.split(|&b| b == 0).next())
        else {
            return;
        };
        self.insert(addr, size, String::from_utf8_lossy(name).into_owned());
    }

    /// `JIT_CODE_MOVE`: pid, tid, vma, old address, new address, code size, code index.
    fn moved(&mut self, body: &[u8]) {
        let (Some(old), Some(new), Some(size)) =
            (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32))
        else {
            return;
        };
        if let Some((_, name)) = self.by_start.remove(&old) {
            self.insert(new, size, name);
        }
    }

    /// Names the code at `start`, `size` bytes, replacing whatever it overlaps.
    pub(crate) fn insert(&mut self, start: u64, size: u64, name: String) {
        let end = start.saturating_add(size.max(1));
        let overlapping: Vec<u64> = self
            .by_start
            .range(..end)
            .rev()
            .take_while(|(_, (other_end, _))| *other_end > start)
            .map(|(&other, _)| other)
            .collect();
        for other in overlapping {
            self.by_start.remove(&other);
        }
        self.by_start.insert(start, (end, name));
    }

    /// The name of the code at `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<&str> {
        let (_, (end, name)) = self.by_start.range(..=addr).next_back()?;
        (addr < *end).then_some(name.as_str())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_start.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut h = Vec::new();
        for word in [MAGIC, 1, 40, 62, 0, 1234] {
            h.extend_from_slice(&word.to_le_bytes());
        }
        h.extend_from_slice(&[0; 16]);
        h
    }

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&id.to_le_bytes());
        r.extend_from_slice(&((PREFIX + body.len()) as u32).to_le_bytes());
        r.extend_from_slice(&7u64.to_le_bytes());
        r.extend_from_slice(body);
        r
    }

    fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        let mut b = vec![0u8; 8];
        for word in [addr, addr, size, 1] {
            b.extend_from_slice(&word.to_le_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(&[0x90; 4]);
        record(CODE_LOAD, &b)
    }

    #[test]
    fn names_loaded_and_moved_code_and_stops_at_a_cut_record() {
        let mut file = header();
        file.extend(load(0x1000, 0x100, "JS:*hot /a.js:1"));
        file.extend(load(0x2000, 0x10, "Builtin:Add"));
        let mut moved = vec![0u8; 8];
        for word in [0x2000u64, 0x2000, 0x3000, 0x10, 2] {
            moved.extend_from_slice(&word.to_le_bytes());
        }
        file.extend(record(CODE_MOVE, &moved));
        let whole = JitSymbols::parse(&file).unwrap();
        assert_eq!(whole.lookup(0x1080), Some("JS:*hot /a.js:1"));
        assert_eq!(whole.lookup(0x1100), None);
        assert_eq!(whole.lookup(0x2008), None);
        assert_eq!(whole.lookup(0x300f), Some("Builtin:Add"));
        // A record still being written is left for the next read.
        let cut = JitSymbols::parse(&file[..file.len() - 3]).unwrap();
        assert_eq!(cut.len(), 2);
        assert_eq!(cut.lookup(0x2008), Some("Builtin:Add"));
    }

    #[test]
    fn code_loaded_again_replaces_what_it_overlaps() {
        let mut file = header();
        file.extend(load(0x1000, 0x100, "old"));
        file.extend(load(0x1080, 0x100, "new"));
        let symbols = JitSymbols::parse(&file).unwrap();
        assert_eq!(symbols.lookup(0x1010), None);
        assert_eq!(symbols.lookup(0x1090), Some("new"));
    }

    #[test]
    fn only_jitdumps_are_taken() {
        assert!(JitSymbols::parse(b"not a jitdump at all, no").is_none());
        assert!(is_jitdump_name("jit-17251.dump"));
        assert!(!is_jitdump_name("jit-.dump") && !is_jitdump_name("perf-1.map"));
    }
}
