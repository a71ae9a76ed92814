//! Just enough of BTF (the kernel's type format) for what the eBPF programs need of the
//! running kernel without CO-RE: a struct member's offset (`task_struct` fields) and a type's
//! id (the `btf_trace_sched_switch` typedef a BTF tracepoint program is verified against).
//! aya parses BTF too, but all of it (tens of milliseconds for vmlinux) and keeps struct
//! members private; one linear scan here costs a few.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
const HEADER_MIN_LEN: usize = 24;
const KIND_STRUCT: u32 = 4;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;

#[derive(Debug, Error)]
pub(crate) enum BtfError {
    #[error("cannot read kernel BTF at {path} (is CONFIG_DEBUG_INFO_BTF enabled?)")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF struct {0} has no member {1}")]
    NoMember(String, String),
    #[error("kernel BTF has no typedef {0}")]
    NoTypedef(String),
    #[error("kernel BTF has no function {0}")]
    NoFunction(String),
}

/// BTF type information, read once and searched by name.
pub(crate) struct Btf {
    data: Bytes,
    /// Types found (or not) by earlier searches, by kind and name.
    found: Mutex<HashMap<(u32, String), Option<Found>>>,
}

/// Where a type found is in the types section.
#[derive(Clone, Copy)]
struct Found {
    id: u32,
    vlen: usize,
    kind_flag: bool,
    body_start: usize,
    body_len: usize,
}

enum Bytes {
    Owned(Vec<u8>),
    /// sysfs serves /sys/kernel/btf/vmlinux a page per read(); kernels since 6.16 let it be
    /// mapped, which reads nothing up front.
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m,
        }
    }
}

/// One type of the types section: its id, header fields and the bytes that follow.
struct TypeEntry<'a> {
    id: u32,
    vlen: usize,
    kind_flag: bool,
    body: &'a [u8],
}

impl Btf {
    /// Reads the BTF at `path` (normally `/sys/kernel/btf/vmlinux`).
    pub(crate) fn read(path: &Path) -> Result<Self, BtfError> {
        let error = |source| BtfError::Read {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(error)?;
        // SAFETY: kernel BTF never changes while the kernel runs; for other files a
        // concurrent writer could change what is read, never memory safety beyond that
        // (the parser bounds-checks every access).
        // The kernel maps it private and read-only only.
        let data = match unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) } {
            Ok(map) => Bytes::Mapped(map),
            Err(_) => Bytes::Owned(std::fs::read(path).map_err(error)?),
        };
        Sections::parse(&data)?;
        Ok(Self::of(data))
    }

    fn of(data: Bytes) -> Self {
        Self {
            data,
            found: Mutex::new(HashMap::new()),
        }
    }

    /// Raw little-endian BTF bytes; the header is checked here, the types when searched.
    #[cfg(test)]
    pub(crate) fn from_bytes(data: Vec<u8>) -> Result<Self, BtfError> {
        Sections::parse(&data)?;
        Ok(Self::of(Bytes::Owned(data)))
    }

    /// Finds the structs, typedefs and functions named, all in one scan of the types, for
    /// the searches that follow (each would scan up to its type otherwise).
    pub(crate) fn look_up_at_once(
        &self,
        structs: &[&str],
        typedefs: &[&str],
        functions: &[&str],
    ) -> Result<(), BtfError> {
        let btf = Sections::parse(&self.data)?;
        let mut found = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A few names: a list is quicker to search than a map.
        let mut wanted: Vec<(u32, &str)> = [
            (KIND_STRUCT, structs),
            (KIND_TYPEDEF, typedefs),
            (KIND_FUNC, functions),
        ]
        .into_iter()
        .flat_map(|(kind, names)| names.iter().map(move |&name| (kind, name)))
        .filter(|(kind, name)| !found.contains_key(&(*kind, name.to_string())))
        .collect();
        let kinds: Vec<u32> = wanted.iter().map(|&(kind, _)| kind).collect();
        self.scan(&btf, &kinds, |kind, name, entry| {
            let before = wanted.len();
            // A name asked for twice is wanted once: the first type of that name.
            wanted.retain(|&w| w != (kind, name));
            if wanted.len() < before {
                found.insert((kind, name.to_string()), Some(entry));
            }
            !wanted.is_empty()
        })?;
        for (kind, name) in wanted {
            found.insert((kind, name.to_string()), None);
        }
        Ok(())
    }

    /// Byte offsets of `members` of `struct name`.
    pub(crate) fn member_offsets(
        &self,
        name: &str,
        members: &[&str],
    ) -> Result<Vec<u32>, BtfError> {
        let btf = Sections::parse(&self.data)?;
        let found = self
            .find(&btf, KIND_STRUCT, name)?
            .ok_or_else(|| BtfError::NoStruct(name.into()))?;
        members
            .iter()
            .map(|member| {
                for i in 0..found.vlen {
                    let m = &found.body[i * 12..i * 12 + 12];
                    if btf.string(u32_at(m, 0)?)? == *member {
                        let offset = u32_at(m, 8)?;
                        // With kind_flag, the high 8 bits hold a bitfield size.
                        let bits = if found.kind_flag {
                            offset & 0x00ff_ffff
                        } else {
                            offset
                        };
                        return Ok(bits / 8);
                    }
                }
                Err(BtfError::NoMember(name.into(), (*member).into()))
            })
            .collect()
    }

    /// The type id of `typedef name`.
    pub(crate) fn typedef_id(&self, name: &str) -> Result<u32, BtfError> {
        let btf = Sections::parse(&self.data)?;
        Ok(self
            .find(&btf, KIND_TYPEDEF, name)?
            .ok_or_else(|| BtfError::NoTypedef(name.into()))?
            .id)
    }

    /// The type id of function `name` (`bpf_iter_task`, which a task iterator program is
    /// verified against).
    pub(crate) fn function_id(&self, name: &str) -> Result<u32, BtfError> {
        let btf = Sections::parse(&self.data)?;
        Ok(self
            .find(&btf, KIND_FUNC, name)?
            .ok_or_else(|| BtfError::NoFunction(name.into()))?
            .id)
    }

    /// The first type of `kind` called `name`.
    fn find<'a>(
        &self,
        btf: &Sections<'a>,
        kind: u32,
        name: &str,
    ) -> Result<Option<TypeEntry<'a>>, BtfError> {
        let entry = |found: Found| TypeEntry {
            id: found.id,
            vlen: found.vlen,
            kind_flag: found.kind_flag,
            body: &btf.types[found.body_start..found.body_start + found.body_len],
        };
        let known = self
            .found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(kind, name.to_string()))
            .copied();
        if let Some(known) = known {
            return Ok(known.map(entry));
        }
        let mut first = None;
        self.scan(btf, &[kind], |entry_kind, entry_name, found| {
            if entry_kind == kind && entry_name == name {
                first = Some(found);
            }
            first.is_none()
        })?;
        Ok(first.map(entry))
    }

    /// Calls `each` with the kind, name and place of every named type of the `kinds`, in
    /// id order, while it returns true.
    fn scan(
        &self,
        btf: &Sections<'_>,
        kinds: &[u32],
        mut each: impl FnMut(u32, &str, Found) -> bool,
    ) -> Result<(), BtfError> {
        let mut types = btf.types;
        // Type ids start at 1 (0 is void) and follow the order of the section.
        let mut id = 1;
        while types.len() >= 12 {
            let name_off = u32_at(types, 0)?;
            let info = u32_at(types, 4)?;
            let entry_kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = trailing_len(entry_kind, vlen)?;
            if types.len() < 12 + extra {
                return Err(BtfError::Malformed("truncated type"));
            }
            if kinds.contains(&entry_kind) && name_off != 0 {
                let found = Found {
                    id,
                    vlen,
                    kind_flag: info >> 31 == 1,
                    body_start: btf.types.len() - types.len() + 12,
                    body_len: extra,
                };
                if !each(entry_kind, btf.string(name_off)?, found) {
                    return Ok(());
                }
            }
            types = &types[12 + extra..];
            id += 1;
        }
        Ok(())
    }
}

struct Sections<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

impl<'a> Sections<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        if data.len() < HEADER_MIN_LEN || u16::from_le_bytes([data[0], data[1]]) != BTF_MAGIC {
            return Err(BtfError::Malformed(
                "bad magic (big-endian BTF is not supported)",
            ));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let section = |off: usize, len: usize| {
            let start = hdr_len
                .checked_add(off)
                .ok_or(BtfError::Malformed("offset overflow"))?;
            data.get(start..start + len)
                .ok_or(BtfError::Malformed("section out of bounds"))
        };
        Ok(Self {
            types: section(u32_at(data, 8)? as usize, u32_at(data, 12)? as usize)?,
            strings: section(u32_at(data, 16)? as usize, u32_at(data, 20)? as usize)?,
        })
    }

    fn string(&self, offset: u32) -> Result<&'a str, BtfError> {
        let rest = self
            .strings
            .get(offset as usize..)
            .ok_or(BtfError::Malformed("bad name"))?;
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(BtfError::Malformed("bad name"))?;
        std::str::from_utf8(&rest[..end]).map_err(|_| BtfError::Malformed("non-UTF-8 name"))
    }
}

/// Bytes that follow the 12-byte common header of a BTF type of `kind`.
fn trailing_len(kind: u32, vlen: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
        3 => 12,                      // ARRAY
        4 | 5 | 15 | 19 => vlen * 12, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => vlen * 8,           // ENUM, FUNC_PROTO
        2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
        _ => return Err(BtfError::Malformed("unknown type kind")),
    })
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    let bytes = data
        .get(at..at + 4)
        .ok_or(BtfError::Malformed("truncated"))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob: `int`, `struct s { int a; int b; }`, `typedef struct s t` and a
    /// function `f`.
    fn tiny_btf() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0t\0f\0".to_vec();
        let mut types = Vec::new();
        let push = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        // [1] INT "int" size 4
        push(&mut types, 1);
        push(&mut types, 1 << 24);
        push(&mut types, 4);
        push(&mut types, 32);
        // [2] STRUCT "s" vlen 2 size 8: a at bit 0, b at bit 32
        push(&mut types, 5);
        push(&mut types, (KIND_STRUCT << 24) | 2);
        push(&mut types, 8);
        for (name, bits) in [(7u32, 0u32), (9, 32)] {
            push(&mut types, name);
            push(&mut types, 1);
            push(&mut types, bits);
        }
        // [3] TYPEDEF "t" -> [2]
        push(&mut types, 11);
        push(&mut types, KIND_TYPEDEF << 24);
        push(&mut types, 2);
        // [4] FUNC "f" (its prototype would be type 0: void)
        push(&mut types, 13);
        push(&mut types, KIND_FUNC << 24);
        push(&mut types, 0);
        let mut data = Vec::new();
        data.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        push(&mut data, 24);
        push(&mut data, 0);
        push(&mut data, types.len() as u32);
        push(&mut data, types.len() as u32);
        push(&mut data, strings.len() as u32);
        data.extend(types);
        data.extend(strings);
        data
    }

    #[test]
    fn finds_member_offsets_and_type_ids() {
        let btf = Btf::from_bytes(tiny_btf()).unwrap();
        assert!(matches!(
            btf.member_offsets("s", &["a", "c"]),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            btf.member_offsets("t", &["a"]),
            Err(BtfError::NoStruct(..))
        ));
        assert_finds_the_tiny_types(&btf);
    }

    /// Types looked up at once are found as a search of each finds them, names missing
    /// stay missing, and searches for others still scan.
    #[test]
    fn looked_up_at_once_as_one_by_one() {
        let btf = Btf::from_bytes(tiny_btf()).unwrap();
        btf.look_up_at_once(&["s", "s", "nope"], &["t", "s"], &["f"])
            .unwrap();
        assert_eq!(btf.found.lock().unwrap().len(), 5);
        assert!(matches!(
            btf.member_offsets("nope", &["a"]),
            Err(BtfError::NoStruct(..))
        ));
        assert_finds_the_tiny_types(&btf);
    }

    /// The members, typedef and function of [`tiny_btf`], and no type of the wrong kind.
    fn assert_finds_the_tiny_types(btf: &Btf) {
        assert_eq!(btf.member_offsets("s", &["b", "a"]).unwrap(), [4, 0]);
        assert_eq!(btf.typedef_id("t").unwrap(), 3);
        assert!(matches!(btf.typedef_id("s"), Err(BtfError::NoTypedef(..))));
        assert_eq!(btf.function_id("f").unwrap(), 4);
        assert!(matches!(
            btf.function_id("t"),
            Err(BtfError::NoFunction(..))
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::from_bytes(b"not btf at all, no no no".to_vec()).is_err());
        let mut data = tiny_btf();
        data.truncate(40);
        assert!(Btf::from_bytes(data).is_err());
    }

    #[test]
    fn reads_the_running_kernel() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: this kernel has no BTF at {}", path.display());
            return;
        }
        let btf = Btf::read(path).unwrap();
        let [pid, tgid] = btf.member_offsets("task_struct", &["pid", "tgid"]).unwrap()[..] else {
            unreachable!("two members asked, two offsets returned")
        };
        assert_eq!(tgid, pid + 4, "pid and tgid are adjacent in task_struct");
        assert!(btf.typedef_id("btf_trace_sched_switch").unwrap() > 0);
        assert!(btf.function_id("bpf_iter_task").unwrap() > 0);
    }
}
