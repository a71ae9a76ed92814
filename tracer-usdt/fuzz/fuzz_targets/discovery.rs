//! Whole-object discovery: bytes as an ELF file through everything `tracer` reads of it
//! before attaching — ELF header, program headers (segments, RELRO), section headers and
//! names (`.stapsdt.base`, `.note.stapsdt`), the notes, the `.stapsdt.base` adjustment,
//! the validation of every site against the segments, the argument specs. Besides "no
//! panics", checks that what passes validation is something the kernel can be given.
//!
//! The first byte picks the input's shape: even, the rest is the whole file; odd, the
//! rest is a list of (offset, byte) patches applied to a small valid executable with five
//! notes (so that mutations start from an object that parses this far).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tracer_usdt::test_elf::{BASE_OFF, PROBES_OFF, TEXT_OFF, VADDR, sdt, sdt_at, tiny_elf};
use tracer_usdt::{parse_arg_specs, parse_notes};

/// The patched template: 64- or 32-bit, notes with and without semaphores, one with its
/// base moved, one pointing at its own ELF header.
fn template(is_64: bool) -> Vec<u8> {
    let base = VADDR + BASE_OFF;
    let mut notes = sdt(is_64, base, 0, None, b"p\0plain\0\0");
    notes.extend(sdt(
        is_64,
        base,
        2,
        Some(1),
        b"p\0guarded\0-4@%edi 8@-8(%rbp)\0",
    ));
    notes.extend(sdt(is_64, base - 0x100, 4, Some(2), b"p\0moved\08@%rax\0"));
    notes.extend(sdt_at(is_64, VADDR, 0, b"p\0header\0\0"));
    notes.extend(sdt_at(
        is_64,
        VADDR + TEXT_OFF,
        VADDR + PROBES_OFF + 1,
        b"q\0odd\0\0",
    ));
    tiny_elf(is_64, &notes)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let object = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut object = template(mode & 2 == 0);
        for patch in rest.chunks_exact(3) {
            let at = usize::from(u16::from_le_bytes([patch[0], patch[1]])) % object.len();
            object[at] = patch[2];
        }
        object
    };
    let Ok(notes) = parse_notes(Path::new("fuzz-input"), &object) else {
        return;
    };
    let file_len = object.len() as u64;
    for note in &notes {
        assert!(!note.provider.is_empty() && !note.name.is_empty());
        assert!(note.note_offset < file_len, "the note is in the file");
        if let Ok(offsets) = &note.location {
            // The kernel refuses uprobe offsets past the file, and misaligned semaphores.
            assert!(offsets.probe < file_len, "{note:?}");
            assert_eq!(
                offsets.semaphore.is_some(),
                note.semaphore.is_some(),
                "{note:?}"
            );
            if let (Some(offset), Some(address)) = (offsets.semaphore, note.semaphore) {
                assert!(offset % 2 == 0 && address % 2 == 0, "{note:?}");
            }
            assert_eq!(note.file_offset(), Some(offsets.probe));
        } else {
            assert_eq!(note.file_offset(), None);
        }
        let _ = parse_arg_specs(&note.arg_spec);
    }
});
