//! Reading SystemTap SDT notes (`.note.stapsdt`) out of ELF files.

use std::fs::File;
use std::path::Path;

use object::elf;
use object::read::elf::{FileHeader, NoteIterator, ProgramHeader, SectionHeader};
use object::read::{ReadCache, ReadRef};
use object::{Endian, Endianness, FileKind};

use crate::Error;
use crate::validate::{Layout, NOP_NOP5, Segment, SiteOffsets, SiteProblem, validate};

/// Owner name of SDT notes.
const NOTE_OWNER: &[u8] = b"stapsdt";
/// Note type of version-3 SDT notes (three address words); older types have another
/// layout and are skipped.
const NT_STAPSDT: u32 = 3;
const NOTE_SECTION: &[u8] = b".note.stapsdt";
const BASE_SECTION: &[u8] = b".stapsdt.base";

/// One probe site as recorded in the ELF file, with addresses already adjusted and
/// checked against the file's segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtNote {
    /// The probe's provider, e.g. `python`, `hotspot`, `julia`.
    pub provider: String,
    /// The probe's name as in the note, with `__` where DTrace scripts write `-`.
    pub name: String,
    /// Virtual address of the probe's nop, adjusted for a moved `.stapsdt.base`.
    pub pc: u64,
    /// Virtual address of the semaphore (adjusted like `pc`); `None` when the probe has
    /// no semaphore and always fires.
    pub semaphore: Option<u64>,
    /// The raw argument spec, e.g. `-4@%edi 8@-16(%rbp)`; empty for probes without
    /// arguments.
    pub arg_spec: String,
    /// File offset of the note's header, to find it with `readelf -n` or `xxd`.
    pub note_offset: u64,
    /// The file offsets to attach the uprobe at and of the semaphore the kernel counts
    /// (`ref_ctr_offset`), or why the note's addresses must not be attached (see
    /// [`validate`](super::validate)).
    pub location: Result<SiteOffsets, SiteProblem>,
}

impl UsdtNote {
    /// Offset in the file to attach the uprobe at; `None` for an invalid site.
    pub fn file_offset(&self) -> Option<u64> {
        self.location.as_ref().ok().map(|o| o.probe)
    }

    /// The address the uprobe is placed at: `pc`, or the 5-byte nop after it (see
    /// [`NOP_NOP5`]).
    pub fn attach_pc(&self) -> u64 {
        let nop5 = self.location.as_ref().is_ok_and(|at| at.nop5);
        self.pc + u64::from(nop5)
    }

    /// File offset of the 2-byte semaphore counter; `None` without a semaphore or for an
    /// invalid site.
    pub fn semaphore_file_offset(&self) -> Option<u64> {
        self.location.as_ref().ok().and_then(|o| o.semaphore)
    }
}

/// The fields of one note descriptor exactly as stored, before any adjustment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteDesc {
    /// Link-time address of the probe site.
    pub pc: u64,
    /// Link-time address of `.stapsdt.base` when the note was written.
    pub base: u64,
    /// Link-time address of the semaphore, 0 when there is none.
    pub semaphore: u64,
    /// First string: the provider.
    pub provider: String,
    /// Second string: the probe name.
    pub name: String,
    /// Third string: the argument spec, possibly empty.
    pub arg_spec: String,
}

/// Decodes a version-3 `stapsdt` note descriptor: pc, base and semaphore as address-sized
/// words (4 bytes in 32-bit ELF, 8 in 64-bit) in the file's byte order, then provider,
/// name and argument spec as NUL-terminated strings. Bytes after the third NUL (padding)
/// are ignored. On failure returns why, for the caller to wrap with the file and offset.
pub fn parse_note_desc(
    desc: &[u8],
    is_64: bool,
    little_endian: bool,
) -> Result<NoteDesc, &'static str> {
    let word = if is_64 { 8 } else { 4 };
    if desc.len() < 3 * word {
        return Err("descriptor too short for its three address words");
    }
    let read_word = |i: usize| {
        let bytes = &desc[i * word..(i + 1) * word];
        let mut buf = [0u8; 8];
        if little_endian {
            buf[..word].copy_from_slice(bytes);
            u64::from_le_bytes(buf)
        } else {
            buf[8 - word..].copy_from_slice(bytes);
            u64::from_be_bytes(buf)
        }
    };
    let (pc, base, semaphore) = (read_word(0), read_word(1), read_word(2));

    let mut rest = &desc[3 * word..];
    let mut next_string = |what: &'static str| -> Result<String, &'static str> {
        let nul = rest.iter().position(|&b| b == 0).ok_or(what)?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| "string is not valid UTF-8")?;
        rest = &rest[nul + 1..];
        Ok(s.to_owned())
    };
    let provider = next_string("provider is not NUL-terminated")?;
    let name = next_string("probe name is not NUL-terminated")?;
    let arg_spec = next_string("argument spec is not NUL-terminated")?;
    if provider.is_empty() || name.is_empty() {
        return Err("empty provider or probe name");
    }
    Ok(NoteDesc {
        pc,
        base,
        semaphore,
        provider,
        name,
        arg_spec,
    })
}

/// Reads every version-3 SDT note of an ELF file. A file without `.note.stapsdt` gives
/// an empty list; whether that is an error is the caller's call. Each note's addresses
/// are checked against the file's segments ([`UsdtNote::location`]); a note that cannot
/// be decoded at all fails the whole file.
///
/// Only the headers and the few sections needed are read, not the whole file, because
/// the interesting libraries (libjvm.so) are tens of megabytes.
pub fn read_notes(path: &Path) -> Result<Vec<UsdtNote>, Error> {
    // Checked before opening: opening a FIFO would block, and a directory opens fine
    // but cannot be read.
    let metadata = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !metadata.is_file() {
        return Err(Error::NotElf {
            path: path.to_path_buf(),
        });
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let cache = ReadCache::new(file);
    parse_object(path, &cache, metadata.len())
}

/// [`read_notes`] of an object already in memory (`path` only names it in errors).
pub fn parse_notes(path: &Path, data: &[u8]) -> Result<Vec<UsdtNote>, Error> {
    parse_object(path, data, data.len() as u64)
}

fn parse_object<'data, R: ReadRef<'data>>(
    path: &Path,
    data: R,
    file_len: u64,
) -> Result<Vec<UsdtNote>, Error> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => read_elf::<elf::FileHeader64<Endianness>, _>(path, data, file_len),
        Ok(FileKind::Elf32) => read_elf::<elf::FileHeader32<Endianness>, _>(path, data, file_len),
        // Too short to hold a magic number, another object format, a directory...
        _ => Err(Error::NotElf {
            path: path.to_path_buf(),
        }),
    }
}

fn read_elf<'data, Elf, R>(path: &Path, data: R, file_len: u64) -> Result<Vec<UsdtNote>, Error>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let bad_elf = |source| Error::BadElf {
        path: path.to_path_buf(),
        source,
    };
    let header = Elf::parse(data).map_err(bad_elf)?;
    let endian = header.endian().map_err(bad_elf)?;
    let sections = header.sections(endian, data).map_err(bad_elf)?;
    let mut layout = Layout {
        file_len,
        ..Layout::default()
    };
    for ph in header.program_headers(endian, data).map_err(bad_elf)? {
        match ph.p_type(endian) {
            elf::PT_LOAD => layout.loads.push(Segment {
                vaddr: ph.p_vaddr(endian).into(),
                memsz: ph.p_memsz(endian).into(),
                offset: ph.p_offset(endian).into(),
                filesz: ph.p_filesz(endian).into(),
                flags: ph.p_flags(endian),
            }),
            elf::PT_GNU_RELRO => {
                layout.relro = Some((ph.p_vaddr(endian).into(), ph.p_memsz(endian).into()));
            }
            _ => {}
        }
    }
    // Where `.stapsdt.base` really is; notes record where it was when they were written,
    // and the difference is how far prelink or a later link step moved everything.
    let actual_base = sections
        .section_by_name(endian, BASE_SECTION)
        .map(|(_, s)| s.sh_addr(endian).into());

    let mut notes = Vec::new();
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_NOTE
            || sections.section_name(endian, section) != Ok(NOTE_SECTION)
        {
            continue;
        }
        let section_offset: u64 = section.sh_offset(endian).into();
        let note_offset = |pos: usize| section_offset.wrapping_add(pos as u64);
        let malformed = |pos: usize, reason: String| Error::MalformedNote {
            path: path.to_path_buf(),
            offset: note_offset(pos),
            reason,
        };
        let section_data = section
            .data(endian, data)
            .map_err(|_| malformed(0, "note section extends past the end of the file".into()))?;
        let align = section.sh_addralign(endian);
        let align_bytes: u64 = align.into();
        // `NoteIterator` rounds alignments below 4 up to 4; mirror that to track offsets.
        let align_bytes = align_bytes.max(4) as usize;
        let mut iter = NoteIterator::<Elf>::new(endian, align, section_data)
            .map_err(|e| malformed(0, e.to_string()))?;
        // Offset within the section of the note being parsed, for error messages.
        let mut pos = 0usize;
        loop {
            let note = match iter.next() {
                Ok(Some(note)) => note,
                Ok(None) => break,
                Err(e) => return Err(malformed(pos, e.to_string())),
            };
            let note_pos = pos;
            let desc = note.desc();
            // The descriptor is a subslice of the section data, so its address tells
            // where the next note starts.
            let desc_end = desc.as_ptr() as usize - section_data.as_ptr() as usize + desc.len();
            pos = desc_end.next_multiple_of(align_bytes);
            if note.name() != NOTE_OWNER || note.n_type(endian) != NT_STAPSDT {
                continue;
            }
            let raw = parse_note_desc(desc, header.is_type_64(), endian.is_little_endian())
                .map_err(|reason| malformed(note_pos, reason.to_owned()))?;
            let pc = adjust_for_base(raw.pc, raw.base, actual_base);
            let semaphore =
                (raw.semaphore != 0).then(|| adjust_for_base(raw.semaphore, raw.base, actual_base));
            notes.push(UsdtNote {
                provider: raw.provider,
                name: raw.name,
                pc,
                semaphore,
                arg_spec: raw.arg_spec,
                note_offset: note_offset(note_pos),
                location: validate(&layout, pc, semaphore).map(|at| {
                    let code = data.read_bytes_at(at.probe, NOP_NOP5.len() as u64);
                    at.prefer_nop5(code.unwrap_or_default())
                }),
            });
        }
    }
    Ok(notes)
}

/// Moves a link-time address by however far `.stapsdt.base` moved. Without the section,
/// or with a note that recorded no base, there is nothing to compare against, so the
/// address is taken as is.
fn adjust_for_base(addr: u64, note_base: u64, actual_base: Option<u64>) -> u64 {
    match actual_base {
        Some(actual) if note_base != 0 && actual != 0 => {
            addr.wrapping_add(actual.wrapping_sub(note_base))
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_elf::{
        BASE_OFF, BSS_SIZE, NOTES_OFF, PROBES_OFF, TEXT_OFF, VADDR, descriptor as desc, note, sdt,
        sdt_at, tiny_elf,
    };

    #[test]
    fn parses_64_bit_descriptor() {
        let d = desc(
            [0x4287f3, 0x8cc5a0, 0xa8426e],
            true,
            true,
            &[b"python\0gc__start\0-4@112(%rsp)\0"],
        );
        let n = parse_note_desc(&d, true, true).unwrap();
        assert_eq!(
            n,
            NoteDesc {
                pc: 0x4287f3,
                base: 0x8cc5a0,
                semaphore: 0xa8426e,
                provider: "python".into(),
                name: "gc__start".into(),
                arg_spec: "-4@112(%rsp)".into(),
            }
        );
    }

    #[test]
    fn parses_32_bit_and_big_endian_descriptors() {
        let d = desc([0x1000, 0x2000, 0], false, true, &[b"p\0n\0\0"]);
        let n = parse_note_desc(&d, false, true).unwrap();
        assert_eq!((n.pc, n.base, n.semaphore), (0x1000, 0x2000, 0));
        assert_eq!((n.provider.as_str(), n.name.as_str()), ("p", "n"));
        assert_eq!(n.arg_spec, "");

        let d = desc([0x1000, 0x2000, 0x3000], false, false, &[b"p\0n\0\0"]);
        let n = parse_note_desc(&d, false, false).unwrap();
        assert_eq!((n.pc, n.base, n.semaphore), (0x1000, 0x2000, 0x3000));

        let d = desc([0x1000, 0x2000, 0x3000], true, false, &[b"p\0n\0\0"]);
        let n = parse_note_desc(&d, true, false).unwrap();
        assert_eq!((n.pc, n.base, n.semaphore), (0x1000, 0x2000, 0x3000));
    }

    #[test]
    fn ignores_padding_after_strings() {
        let d = desc([1, 2, 3], true, true, &[b"p\0n\08@%rdi\0\0\0\0"]);
        assert_eq!(parse_note_desc(&d, true, true).unwrap().arg_spec, "8@%rdi");
    }

    #[test]
    fn rejects_truncated_descriptors() {
        let d = desc([1, 2, 3], true, true, &[b"p\0n\0\0"]);
        for len in 0..24 {
            assert_eq!(
                parse_note_desc(&d[..len], true, true).unwrap_err(),
                "descriptor too short for its three address words"
            );
        }
        // 32-bit words are only 12 bytes; 64-bit interpretation of them is too short.
        let d32 = desc([1, 2, 3], false, true, &[b"p\0n\0\0"]);
        assert!(parse_note_desc(&d32[..12], true, true).is_err());
    }

    #[test]
    fn rejects_missing_nuls() {
        let cases: [(&[u8], &str); 4] = [
            (b"", "provider is not NUL-terminated"),
            (b"python", "provider is not NUL-terminated"),
            (b"python\0gc", "probe name is not NUL-terminated"),
            (b"python\0gc\08@%rdi", "argument spec is not NUL-terminated"),
        ];
        for (strings, reason) in cases {
            let d = desc([1, 2, 3], true, true, &[strings]);
            assert_eq!(parse_note_desc(&d, true, true).unwrap_err(), reason);
        }
    }

    #[test]
    fn rejects_empty_names_and_bad_utf8() {
        let d = desc([1, 2, 3], true, true, &[b"\0n\0\0"]);
        assert!(parse_note_desc(&d, true, true).is_err());
        let d = desc([1, 2, 3], true, true, &[b"p\0\0\0"]);
        assert!(parse_note_desc(&d, true, true).is_err());
        let d = desc([1, 2, 3], true, true, &[b"p\xff\0n\0\0"]);
        assert_eq!(
            parse_note_desc(&d, true, true).unwrap_err(),
            "string is not valid UTF-8"
        );
    }

    #[test]
    fn base_adjustment() {
        // Section moved up by 0x1000 (prelink): pc moves with it.
        assert_eq!(adjust_for_base(0x4000, 0x8000, Some(0x9000)), 0x5000);
        // Moved down.
        assert_eq!(adjust_for_base(0x4000, 0x8000, Some(0x7000)), 0x3000);
        // Not moved.
        assert_eq!(adjust_for_base(0x4000, 0x8000, Some(0x8000)), 0x4000);
        // Nothing to compare with.
        assert_eq!(adjust_for_base(0x4000, 0x8000, None), 0x4000);
        assert_eq!(adjust_for_base(0x4000, 0, Some(0x9000)), 0x4000);
    }

    #[test]
    fn non_elf_files_are_not_elf() {
        let dir = TempDir::new("not-elf");
        for (name, contents) in [
            ("empty", &b""[..]),
            ("script", &b"#!/bin/sh\necho hi\n"[..]),
            ("short-magic", &b"\x7fEL"[..]),
        ] {
            let path = dir.file(name, contents);
            let err = read_notes(&path).unwrap_err();
            assert!(matches!(err, Error::NotElf { .. }), "{name}: {err}");
            assert_eq!(
                err.to_string(),
                format!("not an ELF file: {}", path.display())
            );
        }
        // A magic number followed by garbage is ELF, but broken.
        let path = dir.file("bad-header", b"\x7fELF\x02\x01\x01\0garbage");
        assert!(matches!(
            read_notes(&path).unwrap_err(),
            Error::BadElf { .. } | Error::NotElf { .. }
        ));
        // Neither a directory nor a FIFO is an ELF file (and opening the FIFO must not
        // block waiting for a writer).
        assert!(matches!(
            read_notes(&dir.0).unwrap_err(),
            Error::NotElf { .. }
        ));
        let fifo = dir.0.join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_notes(&fifo).unwrap_err(),
            Error::NotElf { .. }
        ));
        let missing = read_notes(Path::new("/nonexistent/usdt-test")).unwrap_err();
        assert!(matches!(missing, Error::Io { .. }), "{missing}");
    }

    #[test]
    fn elf_without_notes_gives_empty_list() {
        // The test binary itself is ELF and carries no SDT notes.
        let exe = std::env::current_exe().unwrap();
        assert_eq!(read_notes(&exe).unwrap(), vec![]);
    }

    /// A scratch directory per test (tests run in parallel), removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(test: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("tracer-usdt-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn file(&self, name: &str, bytes: &[u8]) -> std::path::PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reads_synthetic_elf_64_and_32() {
        let dir = TempDir::new("synthetic");
        for is_64 in [true, false] {
            let base = VADDR + BASE_OFF;
            let mut notes = sdt(is_64, base, 4, Some(1), b"prov\0first\0-4@%edi\0");
            // Notes of other owners and older stapsdt types are skipped.
            notes.extend(note(b"GNU", 3, b"ignored!"));
            notes.extend(note(NOTE_OWNER, 2, b"old layout"));
            notes.extend(sdt(is_64, base, 8, None, b"prov\0second\0\0"));
            let path = dir.file(
                &format!("tiny{}", if is_64 { 64 } else { 32 }),
                &tiny_elf(is_64, &notes),
            );
            let got = read_notes(&path).unwrap_or_else(|e| panic!("{e}"));
            let second_note = NOTES_OFF
                + (notes.len() - sdt(is_64, base, 8, None, b"prov\0second\0\0").len()) as u64;
            assert_eq!(
                got,
                vec![
                    UsdtNote {
                        provider: "prov".into(),
                        name: "first".into(),
                        pc: VADDR + TEXT_OFF + 4,
                        semaphore: Some(VADDR + PROBES_OFF + 2),
                        arg_spec: "-4@%edi".into(),
                        note_offset: NOTES_OFF,
                        location: Ok(SiteOffsets {
                            probe: TEXT_OFF + 4,
                            semaphore: Some(PROBES_OFF + 2),
                            nop5: false,
                        }),
                    },
                    UsdtNote {
                        provider: "prov".into(),
                        name: "second".into(),
                        pc: VADDR + TEXT_OFF + 8,
                        semaphore: None,
                        arg_spec: String::new(),
                        note_offset: second_note,
                        location: Ok(SiteOffsets {
                            probe: TEXT_OFF + 8,
                            semaphore: None,
                            nop5: false,
                        }),
                    },
                ],
                "is_64 = {is_64}"
            );
            assert_eq!(got[0].file_offset(), Some(TEXT_OFF + 4));
            assert_eq!(got[0].semaphore_file_offset(), Some(PROBES_OFF + 2));
        }
    }

    #[test]
    fn synthetic_elf_base_moved() {
        // The notes were written when .stapsdt.base was 0x3000 lower or 0x100 higher
        // (prelink moved the file); the reader must move pc and semaphore with it.
        let dir = TempDir::new("moved");
        for note_base in [VADDR + BASE_OFF - 0x3000, VADDR + BASE_OFF + 0x100] {
            let notes = sdt(true, note_base, 6, Some(3), b"p\0moved\08@%rax\0");
            let path = dir.file("tiny-moved", &tiny_elf(true, &notes));
            let n = &read_notes(&path).unwrap()[0];
            assert_eq!(
                (n.pc, n.file_offset()),
                (VADDR + TEXT_OFF + 6, Some(TEXT_OFF + 6))
            );
            assert_eq!(n.semaphore, Some(VADDR + PROBES_OFF + 6));
            assert_eq!(n.semaphore_file_offset(), Some(PROBES_OFF + 6));
        }
    }

    #[test]
    fn synthetic_elf_malformed_notes() {
        let base = VADDR + BASE_OFF;
        let good = sdt(true, base, 0, None, b"p\0ok\0\0");
        let dir = TempDir::new("malformed");

        // Second note lacks its argument spec's NUL: the error points at that note.
        let mut notes = good.clone();
        notes.extend(sdt(true, base, 1, None, b"p\0bad\08@%rdi"));
        let path = dir.file("tiny-nonul", &tiny_elf(true, &notes));
        let err = read_notes(&path).unwrap_err();
        let expected = format!(
            "malformed note in {} at offset {:#x}: argument spec is not NUL-terminated",
            path.display(),
            NOTES_OFF + good.len() as u64
        );
        assert_eq!(err.to_string(), expected);

        // A note header claiming more descriptor than the section holds.
        let mut notes = good.clone();
        let mut truncated = sdt(true, base, 1, None, b"p\0cut\0\0");
        truncated.truncate(20);
        notes.extend(truncated);
        let path = dir.file("tiny-truncated", &tiny_elf(true, &notes));
        match read_notes(&path).unwrap_err() {
            Error::MalformedNote { offset, .. } => {
                assert_eq!(offset, NOTES_OFF + good.len() as u64);
            }
            other => panic!("{other}"),
        }

        // Notes whose addresses are wrong still decode: the file is read, and each such
        // site says what is wrong with it, for the caller to refuse or skip.
        let text = VADDR + TEXT_OFF;
        let probes = VADDR + PROBES_OFF;
        let cases: [(u64, u64, &[u8]); 6] = [
            (text, 0, b"p\0fine\0\0"),
            (0x10, 0, b"p\0nowhere\0\0"),
            (probes, 0, b"p\0in_data\0\0"),
            (text, text + 2, b"p\0sem_in_text\0\0"),
            (text, probes + 1, b"p\0sem_misaligned\0\0"),
            (text, 0x7fff_0000, b"p\0sem_nowhere\0\0"),
        ];
        let mut notes = Vec::new();
        for (pc, sem, strings) in cases {
            notes.extend(sdt_at(true, pc, sem, strings));
        }
        let path = dir.file("tiny-bad-addresses", &tiny_elf(true, &notes));
        let got = read_notes(&path).unwrap_or_else(|e| panic!("{e}"));
        let problems: Vec<(&str, Option<String>)> = got
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    n.location.clone().err().map(|p| p.to_string()),
                )
            })
            .collect();
        let code = format!("segment [{VADDR:#x}, {:#x}) r-x", VADDR + PROBES_OFF);
        let data = format!("segment [{probes:#x}, {:#x}) rw-", probes + 8 + BSS_SIZE);
        assert_eq!(
            problems,
            vec![
                ("fine", None),
                (
                    "nowhere",
                    Some("probe address 0x10 is in no loadable segment".into())
                ),
                (
                    "in_data",
                    Some(format!(
                        "probe address {probes:#x} is not code: it is in {data}, which is not \
                         executable"
                    ))
                ),
                (
                    "sem_in_text",
                    Some(format!(
                        "semaphore {:#x} is in {code}, which is not writable",
                        text + 2
                    ))
                ),
                (
                    "sem_misaligned",
                    Some(format!("semaphore {:#x} is not 2-byte aligned", probes + 1))
                ),
                (
                    "sem_nowhere",
                    Some("semaphore 0x7fff0000 is in no loadable segment".into())
                ),
            ]
        );
        // Each note knows where it is in the file.
        let mut offset = NOTES_OFF;
        for (n, (pc, sem, strings)) in got.iter().zip(cases) {
            assert_eq!(n.note_offset, offset, "{}", n.name);
            offset += sdt_at(true, pc, sem, strings).len() as u64;
        }
    }

    #[test]
    fn in_memory_objects_read_like_files() {
        let notes = sdt(true, VADDR + BASE_OFF, 2, Some(0), b"p\0n\08@%rdi\0");
        let elf = tiny_elf(true, &notes);
        let dir = TempDir::new("in-memory");
        let path = dir.file("tiny", &elf);
        assert_eq!(
            parse_notes(&path, &elf).unwrap(),
            read_notes(&path).unwrap()
        );
        // Cut short, the same object loses its notes (or its headers), but never panics.
        for len in [0, 4, 64, 200, NOTES_OFF as usize + 10, elf.len() - 1] {
            let _ = parse_notes(&path, &elf[..len]);
        }
    }

    /// Checks against `readelf -n /usr/bin/python3.11` and `readelf -S` on the machine
    /// this was written on (Debian's python3.11, non-PIE): gc__start at 0x4287f3,
    /// semaphore 0xa8426e in `.probes` (addr 0xa84260, offset 0x683260).
    #[test]
    fn reads_python_notes() {
        let path = Path::new("/usr/bin/python3.11");
        if !path.exists() {
            eprintln!("{} not installed; skipping", path.display());
            return;
        }
        let notes = read_notes(path).unwrap();
        assert!(notes.iter().all(|n| n.provider == "python"));
        let malformed: Vec<&UsdtNote> = notes.iter().filter(|n| n.location.is_err()).collect();
        assert!(malformed.is_empty(), "{malformed:?}");
        let file_len = std::fs::metadata(path).unwrap().len();
        let gc_start = notes.iter().find(|n| n.name == "gc__start").unwrap();
        let sem_off = gc_start
            .semaphore_file_offset()
            .expect("gc__start has a semaphore");
        assert!(gc_start.semaphore.is_some());
        assert!(sem_off + 2 <= file_len);
        let probe_off = gc_start.file_offset().expect("gc__start is valid");
        assert!(probe_off < file_len);
        for n in &notes {
            // Every python probe is semaphore-guarded.
            assert!(n.semaphore_file_offset().is_some(), "{n:?}");
        }
        for name in ["gc__done", "function__entry", "function__return", "line"] {
            assert!(notes.iter().any(|n| n.name == name), "missing {name}");
        }

        // The probe site is a nop, and the semaphore a 2-byte counter that is zero in
        // the file: check the bytes at both offsets.
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(bytes[probe_off as usize], 0x90, "nop at probe site");
        assert_eq!(&bytes[sem_off as usize..sem_off as usize + 2], &[0, 0]);

        if gc_start.pc == 0x4287f3 {
            // The exact build that was checked against readelf.
            assert_eq!(probe_off, 0x287f3);
            assert_eq!(gc_start.semaphore, Some(0xa8426e));
            assert_eq!(sem_off, 0x68326e);
            assert_eq!(gc_start.arg_spec, "-4@112(%rsp)");
        }
    }

    /// What real linkers and distributions produce must pass validation: every note of
    /// the installed providers (the JVM's and CPython's libraries, libstdc++) is valid.
    #[test]
    fn real_providers_notes_are_all_valid() {
        let files = [
            "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
        ];
        for file in files.map(Path::new).into_iter().filter(|f| f.exists()) {
            let notes = read_notes(file).unwrap();
            assert!(!notes.is_empty(), "{}", file.display());
            let malformed: Vec<String> = notes
                .iter()
                .filter_map(|n| n.location.as_ref().err())
                .map(ToString::to_string)
                .collect();
            assert!(malformed.is_empty(), "{}: {malformed:?}", file.display());
        }
    }
}
