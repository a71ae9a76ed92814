//! Tiny ELF executables with hand-written `.note.stapsdt` notes, built byte by byte: for
//! the unit tests, and as the seed the `discovery` fuzz target mutates. Self-contained
//! (only `object`'s constants); built with the `test-elf` feature outside this crate.
//!
//! Layout (little-endian, 32- or 64-bit): the code segment (r-x) maps the file from
//! offset 0 at [`VADDR`], with probe sites (nops) at [`TEXT_OFF`] and the `.stapsdt.base`
//! byte at [`BASE_OFF`]; the data segment (rw-) maps `.probes`, four 2-byte semaphore
//! slots at [`PROBES_OFF`], followed in memory by [`BSS_SIZE`] zero-filled bytes on the
//! same page. The notes follow at [`NOTES_OFF`] (not loaded), then the section headers.
// Fixtures: not every test uses every constant and builder.
#![allow(dead_code)]

use object::elf;

/// Owner name of SDT notes.
pub const NOTE_OWNER: &[u8] = b"stapsdt";
/// Note type of version-3 SDT notes.
pub const NT_STAPSDT: u32 = 3;

pub const VADDR: u64 = 0x400000;
pub const TEXT_OFF: u64 = 0x200;
pub const BASE_OFF: u64 = 0x210;
pub const PROBES_OFF: u64 = 0x218;
pub const NOTES_OFF: u64 = 0x220;
pub const BSS_SIZE: u64 = 0x10;

/// Builds a descriptor the way `sys/sdt.h` lays it out.
pub fn descriptor(words: [u64; 3], is_64: bool, le: bool, strings: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for w in words {
        match (is_64, le) {
            (true, true) => out.extend(w.to_le_bytes()),
            (true, false) => out.extend(w.to_be_bytes()),
            (false, true) => out.extend((w as u32).to_le_bytes()),
            (false, false) => out.extend((w as u32).to_be_bytes()),
        }
    }
    for s in strings {
        out.extend_from_slice(s);
    }
    out
}

/// Encodes one ELF note with 4-byte alignment, as `.note.stapsdt` has.
pub fn note(owner: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend((owner.len() as u32 + 1).to_le_bytes());
    out.extend((desc.len() as u32).to_le_bytes());
    out.extend(n_type.to_le_bytes());
    out.extend_from_slice(owner);
    out.push(0);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(desc);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// A stapsdt note for a probe at text offset `pc_delta`, with semaphore slot
/// `sem_slot` (or none), as recorded when `.stapsdt.base` was at `note_base`.
pub fn sdt(is_64: bool, note_base: u64, pc_delta: u64, sem_slot: Option<u64>, s: &[u8]) -> Vec<u8> {
    let actual_base = VADDR + BASE_OFF;
    // Addresses as they were at link time, before the base moved to where it is.
    let linked = |addr: u64| addr.wrapping_sub(actual_base).wrapping_add(note_base);
    let pc = linked(VADDR + TEXT_OFF + pc_delta);
    let sem = sem_slot.map_or(0, |slot| linked(VADDR + PROBES_OFF + 2 * slot));
    note(
        NOTE_OWNER,
        NT_STAPSDT,
        &descriptor([pc, note_base, sem], is_64, true, &[s]),
    )
}

/// A stapsdt note with exactly these probe and semaphore addresses (0: none), written
/// against the real `.stapsdt.base`.
pub fn sdt_at(is_64: bool, pc: u64, semaphore: u64, s: &[u8]) -> Vec<u8> {
    note(
        NOTE_OWNER,
        NT_STAPSDT,
        &descriptor([pc, VADDR + BASE_OFF, semaphore], is_64, true, &[s]),
    )
}

/// Builds a minimal little-endian ELF executable (32- or 64-bit) holding `notes` as
/// its `.note.stapsdt` section.
pub fn tiny_elf(is_64: bool, notes: &[u8]) -> Vec<u8> {
    elf_with_text(is_64, BASE_OFF - TEXT_OFF, notes)
}

/// Where `.stapsdt.base` is in an [`elf_with_text`] of `text_len` bytes of nops: right
/// after them.
pub fn base_after_text(text_len: u64) -> u64 {
    VADDR + TEXT_OFF + text_len
}

/// [`tiny_elf`] with `text_len` bytes of nops at [`TEXT_OFF`] instead of 16, each a
/// possible probe site. What follows them moves up by as much: `.stapsdt.base` is at
/// [`base_after_text`].
pub fn elf_with_text(is_64: bool, text_len: u64, notes: &[u8]) -> Vec<u8> {
    // The same gaps as in the fixed layout: the base byte, then the semaphores.
    let base_off = TEXT_OFF + text_len;
    let probes_off = base_off + (PROBES_OFF - BASE_OFF);
    let notes_off = probes_off + (NOTES_OFF - PROBES_OFF);
    let word = |buf: &mut Vec<u8>, v: u64| {
        if is_64 {
            buf.extend(v.to_le_bytes());
        } else {
            buf.extend((v as u32).to_le_bytes());
        }
    };
    let shstrtab = b"\0.stapsdt.base\0.probes\0.note.stapsdt\0.shstrtab\0";
    let shstr_off = notes_off + notes.len() as u64;
    let shdr_off = (shstr_off + shstrtab.len() as u64).next_multiple_of(8);
    let (ehsize, phentsize, shentsize) = if is_64 { (64, 56, 64) } else { (52, 32, 40) };

    let mut f = vec![0x7f, b'E', b'L', b'F', if is_64 { 2 } else { 1 }, 1, 1];
    f.resize(16, 0);
    f.extend(2u16.to_le_bytes()); // ET_EXEC
    f.extend(if is_64 { 62u16 } else { 3u16 }.to_le_bytes());
    f.extend(1u32.to_le_bytes());
    word(&mut f, VADDR + TEXT_OFF); // e_entry
    word(&mut f, ehsize); // e_phoff: right after this header
    word(&mut f, shdr_off);
    f.extend(0u32.to_le_bytes());
    for v in [ehsize, phentsize, 2, shentsize, 5, 4] {
        f.extend((v as u16).to_le_bytes());
    }
    assert_eq!(f.len() as u64, ehsize);

    // Code (headers, text, base), then data (.probes and a little .bss).
    let data_size = notes_off - probes_off;
    let loads = [
        (0, probes_off, probes_off, elf::PF_R | elf::PF_X),
        (
            probes_off,
            data_size,
            data_size + BSS_SIZE,
            elf::PF_R | elf::PF_W,
        ),
    ];
    for (offset, filesz, memsz, flags) in loads {
        f.extend(elf::PT_LOAD.to_le_bytes());
        if is_64 {
            f.extend(flags.to_le_bytes());
        }
        for v in [offset, VADDR + offset, VADDR + offset, filesz, memsz] {
            word(&mut f, v);
        }
        if !is_64 {
            f.extend(flags.to_le_bytes());
        }
        word(&mut f, 0x1000);
    }

    f.resize(TEXT_OFF as usize, 0);
    f.resize(base_off as usize, 0x90); // nops
    f.resize(notes_off as usize, 0); // base byte and semaphores
    f.extend_from_slice(notes);
    f.extend_from_slice(shstrtab);
    f.resize(shdr_off as usize, 0);

    let alloc = u64::from(elf::SHF_ALLOC);
    let sections: [(u32, u32, u64, u64, u64, u64, u64); 5] = [
        (0, elf::SHT_NULL, 0, 0, 0, 0, 0),
        (
            1,
            elf::SHT_PROGBITS,
            alloc,
            VADDR + base_off,
            base_off,
            1,
            1,
        ),
        (
            15,
            elf::SHT_PROGBITS,
            alloc | u64::from(elf::SHF_WRITE),
            VADDR + probes_off,
            probes_off,
            8,
            2,
        ),
        (23, elf::SHT_NOTE, 0, 0, notes_off, notes.len() as u64, 4),
        (
            37,
            elf::SHT_STRTAB,
            0,
            0,
            shstr_off,
            shstrtab.len() as u64,
            1,
        ),
    ];
    for (name, ty, flags, addr, offset, size, align) in sections {
        f.extend(name.to_le_bytes());
        f.extend(ty.to_le_bytes());
        for v in [flags, addr, offset, size] {
            word(&mut f, v);
        }
        f.extend(0u32.to_le_bytes());
        f.extend(0u32.to_le_bytes());
        word(&mut f, align);
        word(&mut f, 0);
    }
    f
}
