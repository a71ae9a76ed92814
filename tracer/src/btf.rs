//! Just enough of BTF (the kernel's type format) to find a struct member's offset in the
//! running kernel, so the eBPF programs can read `task_struct` fields without CO-RE.
//! aya parses BTF too but keeps struct members private.

use std::path::Path;

use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
const HEADER_MIN_LEN: usize = 24;
const KIND_STRUCT: u32 = 4;

#[derive(Debug, Error)]
pub enum BtfError {
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
}

/// Byte offset of `member` in `struct name`, read from the BTF at `path`
/// (normally `/sys/kernel/btf/vmlinux`).
pub fn member_offset_in_file(path: &Path, name: &str, member: &str) -> Result<u32, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read {
        path: path.display().to_string(),
        source,
    })?;
    member_offset(&data, name, member)
}

/// Byte offsets of several members of `struct name`, reading the BTF file once.
pub fn member_offsets_in_file(
    path: &Path,
    name: &str,
    members: &[&str],
) -> Result<Vec<u32>, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read {
        path: path.display().to_string(),
        source,
    })?;
    members
        .iter()
        .map(|member| member_offset(&data, name, member))
        .collect()
}

/// Byte offset of `member` in `struct name` within raw BTF bytes (little-endian).
pub fn member_offset(data: &[u8], name: &str, member: &str) -> Result<u32, BtfError> {
    let btf = Sections::parse(data)?;
    let mut types = btf.types;
    while types.len() >= 12 {
        let name_off = u32_at(types, 0)?;
        let info = u32_at(types, 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        let extra = trailing_len(kind, vlen)?;
        let body = types
            .get(12..12 + extra)
            .ok_or(BtfError::Malformed("truncated type"))?;
        if kind == KIND_STRUCT && btf.string(name_off)? == name {
            for i in 0..vlen {
                let m = &body[i * 12..i * 12 + 12];
                if btf.string(u32_at(m, 0)?)? == member {
                    let offset = u32_at(m, 8)?;
                    // With kind_flag, the high 8 bits hold a bitfield size.
                    let bits = if kind_flag {
                        offset & 0x00ff_ffff
                    } else {
                        offset
                    };
                    return Ok(bits / 8);
                }
            }
            return Err(BtfError::NoMember(name.into(), member.into()));
        }
        types = &types[12 + extra..];
    }
    Err(BtfError::NoStruct(name.into()))
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

    /// A tiny BTF blob: `struct s { int a; int b; }` plus an INT type.
    fn tiny_btf() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0".to_vec();
        let mut types = Vec::new();
        let push = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        // [1] INT "int" size 4
        push(&mut types, 1);
        push(&mut types, 1 << 24);
        push(&mut types, 4);
        push(&mut types, 32);
        // [2] STRUCT "s" vlen 2 size 8: a at bit 0, b at bit 32
        push(&mut types, 5);
        push(&mut types, (4 << 24) | 2);
        push(&mut types, 8);
        for (name, bits) in [(7u32, 0u32), (9, 32)] {
            push(&mut types, name);
            push(&mut types, 1);
            push(&mut types, bits);
        }
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
    fn finds_member_offsets() {
        let btf = tiny_btf();
        assert_eq!(member_offset(&btf, "s", "a").unwrap(), 0);
        assert_eq!(member_offset(&btf, "s", "b").unwrap(), 4);
        assert!(matches!(
            member_offset(&btf, "s", "c"),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            member_offset(&btf, "t", "a"),
            Err(BtfError::NoStruct(..))
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(member_offset(b"not btf at all, no no no", "s", "a").is_err());
        let mut btf = tiny_btf();
        btf.truncate(40);
        assert!(member_offset(&btf, "s", "a").is_err());
    }

    #[test]
    fn reads_the_running_kernel() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: this kernel has no BTF at {}", path.display());
            return;
        }
        let pid = member_offset_in_file(path, "task_struct", "pid").unwrap();
        let tgid = member_offset_in_file(path, "task_struct", "tgid").unwrap();
        assert_eq!(tgid, pid + 4, "pid and tgid are adjacent in task_struct");
        let both = member_offsets_in_file(path, "task_struct", &["pid", "tgid"]).unwrap();
        assert_eq!(both, [pid, tgid]);
    }
}
