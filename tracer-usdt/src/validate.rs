//! Checking each note's addresses against the object's program headers, before anything
//! is attached. A note is only text someone wrote into the file; the kernel takes whatever
//! offsets it is given:
//! - a uprobe at an offset outside executable code still goes in: at offset 0 the kernel
//!   writes its breakpoint into the mapped ELF header, in `.data` the target overwrites
//!   or never executes it, and the tracer would see nothing and say nothing was lost;
//! - a semaphore (`ref_ctr_offset`) is only counted where the kernel finds it in a
//!   writable, private, file-backed mapping of the object (`valid_ref_ctr_vma` in
//!   kernel/events/uprobes.c); anywhere else the count is deferred forever and the probe
//!   never fires. A misaligned one fails the attach with a bare EINVAL.
//!
//! [`validate`] is the one place these rules live; it is pure so that it can be tested
//! and fuzzed without root.

use std::fmt;

use object::elf;

/// The page size mappings are made of (x86-64, the one architecture supported).
const PAGE: u64 = 4096;

/// Size of a USDT semaphore: a 2-byte counter.
const SEMAPHORE_SIZE: u64 = 2;

/// One `PT_LOAD` program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Virtual address of its first byte.
    pub vaddr: u64,
    /// Size in memory: file-backed bytes then zero-filled ones (`.bss`).
    pub memsz: u64,
    /// File offset of its first byte.
    pub offset: u64,
    /// How many bytes come from the file.
    pub filesz: u64,
    /// `PF_R`, `PF_W`, `PF_X`.
    pub flags: u32,
}

impl Segment {
    fn executable(&self) -> bool {
        self.flags & elf::PF_X != 0
    }

    fn writable(&self) -> bool {
        self.flags & elf::PF_W != 0
    }

    /// Whether `[addr, addr + len)` is within the segment in memory.
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.vaddr
            && addr
                .checked_add(len)
                .is_some_and(|end| end - self.vaddr <= self.memsz)
    }

    /// How many of its bytes really come from the file: `filesz`, or less when the file
    /// is shorter than the header claims.
    fn file_bytes(&self, file_len: u64) -> u64 {
        self.filesz.min(file_len.saturating_sub(self.offset))
    }

    /// The file offset of `addr`, which the segment contains.
    fn file_offset(&self, addr: u64) -> u64 {
        self.offset.wrapping_add(addr - self.vaddr)
    }
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flag = |bit, c| if self.flags & bit != 0 { c } else { '-' };
        write!(
            f,
            "segment [{:#x}, {:#x}) {}{}{}",
            self.vaddr,
            self.vaddr.saturating_add(self.memsz),
            flag(elf::PF_R, 'r'),
            flag(elf::PF_W, 'w'),
            flag(elf::PF_X, 'x'),
        )
    }
}

/// What the checks need to know of an object: its loadable segments, its RELRO range
/// and its size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The `PT_LOAD` segments, in header order.
    pub loads: Vec<Segment>,
    /// `PT_GNU_RELRO` as `(vaddr, memsz)`: the dynamic loader makes its whole pages
    /// read-only after relocation.
    pub relro: Option<(u64, u64)>,
    /// Length of the file in bytes (the kernel refuses uprobe offsets past it).
    pub file_len: u64,
}

/// Where a valid site is attached: the file offsets uprobes take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteOffsets {
    /// Offset of the probe's instruction.
    pub probe: u64,
    /// Offset of the semaphore, for the kernel to count (`ref_ctr_offset`).
    pub semaphore: Option<u64>,
    /// The site is a nop followed by a 5-byte nop and `probe` is the 5-byte nop's, one
    /// past the note's address: see [`NOP_NOP5`].
    pub nop5: bool,
}

/// What newer SDT headers emit at a site: `nop` then a 5-byte `nopl 0x0(%rax,%rax,1)`.
/// Linux 6.18 runs a uprobe on a 5-byte nop through a call into a trampoline and a system
/// call instead of a trap, and libbpf attaches there; so do we. Both nops do nothing, so
/// the registers the arguments are read from are the same one byte later (arguments
/// relative to `%rip` are placed from the attach address, [`SiteOffsets::probe`]).
pub const NOP_NOP5: [u8; 6] = [0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00];

impl SiteOffsets {
    /// Moves the attach point onto the 5-byte nop when the site's code, `code` (the bytes
    /// from the note's address on), starts with [`NOP_NOP5`].
    pub fn prefer_nop5(mut self, code: &[u8]) -> Self {
        if !self.nop5 && code.starts_with(&NOP_NOP5) {
            self.probe += 1;
            self.nop5 = true;
        }
        self
    }
}

/// Why a note's site cannot be attached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SiteProblem {
    /// The probe address is in no loadable segment.
    #[error("probe address {pc:#x} is in no loadable segment")]
    ProbeOutsideSegments { pc: u64 },
    /// The probe address is in data, not code (the ELF header at 0, `.data`).
    #[error("probe address {pc:#x} is not code: it is in {segment}, which is not executable")]
    ProbeNotExecutable { pc: u64, segment: Segment },
    /// The probe address is in an executable segment, but past its bytes in the file.
    #[error("probe address {pc:#x} is past the bytes {segment} has in the file")]
    ProbeNotInFile { pc: u64, segment: Segment },
    /// The semaphore is in no loadable segment, so nothing in the process is it.
    #[error("semaphore {addr:#x} is in no loadable segment")]
    SemaphoreOutsideSegments { addr: u64 },
    /// The semaphore is in read-only memory (code, constants): never writable.
    #[error("semaphore {addr:#x} is in {segment}, which is not writable")]
    SemaphoreNotWritable { addr: u64, segment: Segment },
    /// The kernel only counts 2-byte aligned semaphores (and fails the attach otherwise).
    #[error("semaphore {addr:#x} is not 2-byte aligned")]
    SemaphoreMisaligned { addr: u64 },
    /// In the RELRO part of the writable data, read-only once the process runs.
    #[error(
        "semaphore {addr:#x} is in the RELRO range [{start:#x}, {end:#x}), read-only once \
         the dynamic loader has relocated the object"
    )]
    SemaphoreInRelro { addr: u64, start: u64, end: u64 },
    /// In the zero-filled part of the segment past the file's bytes (`.bss`): the
    /// program's own variables, never a semaphore's (and anonymous memory past the pages
    /// mapped from the file, where the kernel does not look for semaphores).
    #[error(
        "semaphore {addr:#x} is in the zero-filled part of {segment} past the file's bytes \
         (.bss, the program's own variables): counting there would change the program"
    )]
    SemaphoreNotFileMapped { addr: u64, segment: Segment },
}

impl SiteProblem {
    /// Whether the problem is the semaphore's (the probe address itself is fine).
    pub fn is_semaphore(&self) -> bool {
        !matches!(
            self,
            SiteProblem::ProbeOutsideSegments { .. }
                | SiteProblem::ProbeNotExecutable { .. }
                | SiteProblem::ProbeNotInFile { .. }
        )
    }
}

/// Checks one site, given its probe address `pc` and semaphore address (both already
/// adjusted for `.stapsdt.base`), and returns the offsets to attach at:
/// - `pc` must be in the file-backed bytes of an executable `PT_LOAD` segment;
/// - a semaphore must be 2 bytes, 2-byte aligned, in a writable `PT_LOAD` segment, outside
///   RELRO, and within the pages mapped from the file (its `.bss` tail on the last such
///   page is fine, as that page is still the file's mapping).
pub fn validate(
    layout: &Layout,
    pc: u64,
    semaphore: Option<u64>,
) -> Result<SiteOffsets, SiteProblem> {
    let probe = probe_offset(layout, pc)?;
    let semaphore = semaphore
        .map(|addr| semaphore_offset(layout, addr))
        .transpose()?;
    Ok(SiteOffsets {
        probe,
        semaphore,
        nop5: false,
    })
}

fn probe_offset(layout: &Layout, pc: u64) -> Result<u64, SiteProblem> {
    let in_file = |s: &&Segment| pc >= s.vaddr && pc - s.vaddr < s.file_bytes(layout.file_len);
    if let Some(segment) = layout.loads.iter().filter(|s| s.executable()).find(in_file) {
        return Ok(segment.file_offset(pc));
    }
    match layout.loads.iter().find(|s| s.contains(pc, 1)) {
        Some(&segment) if segment.executable() => Err(SiteProblem::ProbeNotInFile { pc, segment }),
        Some(&segment) => Err(SiteProblem::ProbeNotExecutable { pc, segment }),
        None => Err(SiteProblem::ProbeOutsideSegments { pc }),
    }
}

fn semaphore_offset(layout: &Layout, addr: u64) -> Result<u64, SiteProblem> {
    let Some(&segment) = layout
        .loads
        .iter()
        .find(|s| s.writable() && s.contains(addr, SEMAPHORE_SIZE))
    else {
        return Err(match layout.loads.iter().find(|s| s.contains(addr, 1)) {
            Some(&segment) => SiteProblem::SemaphoreNotWritable { addr, segment },
            None => SiteProblem::SemaphoreOutsideSegments { addr },
        });
    };
    let offset = segment.file_offset(addr);
    // The kernel checks the offset; the address has the same parity in any sane file.
    if !addr.is_multiple_of(SEMAPHORE_SIZE) || !offset.is_multiple_of(SEMAPHORE_SIZE) {
        return Err(SiteProblem::SemaphoreMisaligned { addr });
    }
    if let Some((vaddr, memsz)) = layout.relro {
        // glibc's _dl_protect_relro: whole pages from the start's page to the end's.
        let start = vaddr & !(PAGE - 1);
        let end = vaddr.saturating_add(memsz) & !(PAGE - 1);
        if addr >= start && addr < end {
            return Err(SiteProblem::SemaphoreInRelro { addr, start, end });
        }
    }
    // Past the file's bytes is `.bss`: the program's own zero-initialized variables,
    // even in the rest of the last page the loader maps from the file. A counter there
    // would flip one of them.
    let file_bytes = segment.file_bytes(layout.file_len);
    let file_end = segment.vaddr.saturating_add(file_bytes);
    if file_bytes == 0 || addr.saturating_add(SEMAPHORE_SIZE) > file_end {
        return Err(SiteProblem::SemaphoreNotFileMapped { addr, segment });
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// usdt-args' layout (a Rust PIE linked by lld): headers and constants, code, RELRO
    /// data, then data, `.probes` and a `.bss` starting on the page after the file's.
    fn usdt_args() -> Layout {
        let seg = |vaddr, offset, filesz, memsz, flags| Segment {
            vaddr,
            memsz,
            offset,
            filesz,
            flags,
        };
        Layout {
            loads: vec![
                seg(0, 0, 0x1aadc, 0x1aadc, elf::PF_R),
                seg(0x1bae0, 0x1aae0, 0x481d0, 0x481d0, elf::PF_R | elf::PF_X),
                seg(0x64cb0, 0x62cb0, 0x3c90, 0x4350, elf::PF_R | elf::PF_W),
                seg(0x69940, 0x66940, 0x26c0, 0x27a2, elf::PF_R | elf::PF_W),
            ],
            relro: Some((0x64cb0, 0x4350)),
            file_len: 0x6a000,
        }
    }

    #[test]
    fn valid_sites_get_their_file_offsets() {
        let layout = usdt_args();
        // guarded: its nop in .text, its semaphore at the start of .probes.
        assert_eq!(
            validate(&layout, 0x1e995, Some(0x6b000)),
            Ok(SiteOffsets {
                probe: 0x1d995,
                semaphore: Some(0x68000),
                nop5: false,
            })
        );
        assert_eq!(
            validate(&layout, 0x1bae0, None),
            Ok(SiteOffsets {
                probe: 0x1aae0,
                semaphore: None,
                nop5: false,
            })
        );
        // The last byte of code and the last semaphore slot of the file's last page.
        assert!(validate(&layout, 0x1bae0 + 0x481d0 - 1, Some(0x6bffe)).is_ok());
    }

    #[test]
    fn probe_addresses_outside_code_are_refused() {
        let layout = usdt_args();
        let text = layout.loads[1];
        // 0: the ELF header, mapped read-only.
        assert_eq!(
            validate(&layout, 0, None),
            Err(SiteProblem::ProbeNotExecutable {
                pc: 0,
                segment: layout.loads[0]
            })
        );
        // .data
        assert_eq!(
            validate(&layout, 0x69940, None),
            Err(SiteProblem::ProbeNotExecutable {
                pc: 0x69940,
                segment: layout.loads[3]
            })
        );
        // Between segments and past them all.
        for pc in [0x1aadc, 0x6c0e2, u64::MAX] {
            assert_eq!(
                validate(&layout, pc, None),
                Err(SiteProblem::ProbeOutsideSegments { pc })
            );
        }
        // Code the file does not have: a header claiming more than the file holds.
        let mut short = layout.clone();
        short.file_len = 0x30000;
        assert_eq!(
            validate(&short, 0x40000, None),
            Err(SiteProblem::ProbeNotInFile {
                pc: 0x40000,
                segment: text
            })
        );
        // A bad pc is reported even when the semaphore is bad too.
        assert!(!validate(&layout, 0, Some(1)).unwrap_err().is_semaphore());
    }

    #[test]
    fn semaphores_the_kernel_cannot_count_are_refused() {
        let layout = usdt_args();
        let pc = 0x1e995;
        let problem = |addr| validate(&layout, pc, Some(addr)).unwrap_err();
        assert_eq!(
            problem(0x100000),
            SiteProblem::SemaphoreOutsideSegments { addr: 0x100000 }
        );
        assert_eq!(
            problem(0x1e934),
            SiteProblem::SemaphoreNotWritable {
                addr: 0x1e934,
                segment: layout.loads[1]
            }
        );
        assert_eq!(
            problem(0x100),
            SiteProblem::SemaphoreNotWritable {
                addr: 0x100,
                segment: layout.loads[0]
            }
        );
        assert_eq!(
            problem(0x6b001),
            SiteProblem::SemaphoreMisaligned { addr: 0x6b001 }
        );
        // .data.rel.ro: writable segment, read-only at run time. Its last partial page is
        // not protected (glibc rounds the end down).
        assert_eq!(
            problem(0x64ce8),
            SiteProblem::SemaphoreInRelro {
                addr: 0x64ce8,
                start: 0x64000,
                end: 0x69000
            }
        );
        // .bss on the page after the file's last: anonymous memory.
        assert_eq!(
            problem(0x6c000),
            SiteProblem::SemaphoreNotFileMapped {
                addr: 0x6c000,
                segment: layout.loads[3]
            }
        );
        // A counter straddling the end of the writable segment.
        assert!(matches!(
            problem(0x69940 + 0x27a2 - 1),
            SiteProblem::SemaphoreNotWritable { .. } | SiteProblem::SemaphoreMisaligned { .. }
        ));
        assert!(problem(0x6b001).is_semaphore());
    }

    #[test]
    fn only_the_files_bytes_hold_semaphores_not_bss() {
        // The file's bytes end mid-page; the rest of that page, though mapped from the
        // file, is `.bss`, zeroed by the loader.
        let layout = Layout {
            loads: vec![
                Segment {
                    vaddr: 0x1000,
                    memsz: 0x1000,
                    offset: 0x1000,
                    filesz: 0x1000,
                    flags: elf::PF_R | elf::PF_X,
                },
                Segment {
                    vaddr: 0x3e00,
                    memsz: 0x2000,
                    offset: 0x2e00,
                    filesz: 0x100,
                    flags: elf::PF_R | elf::PF_W,
                },
            ],
            relro: None,
            file_len: 0x2f00,
        };
        // Within the file's bytes: a semaphore.
        assert_eq!(
            validate(&layout, 0x1000, Some(0x3e80)).map(|o| o.semaphore),
            Ok(Some(0x2e80))
        );
        assert_eq!(
            validate(&layout, 0x1000, Some(0x3efe)).map(|o| o.semaphore),
            Ok(Some(0x2efe))
        );
        // Past them, `.bss` even on the page the loader maps from the file: the
        // program's own variables, which a counter would flip.
        for bss in [0x3f00, 0x3f80, 0x3ffe] {
            assert!(matches!(
                validate(&layout, 0x1000, Some(bss)),
                Err(SiteProblem::SemaphoreNotFileMapped { .. })
            ));
        }
        assert!(matches!(
            validate(&layout, 0x1000, Some(0x4000)),
            Err(SiteProblem::SemaphoreNotFileMapped { addr: 0x4000, .. })
        ));
        // A segment with no file bytes at all is all anonymous.
        let mut bss_only = layout.clone();
        bss_only.loads[1].filesz = 0;
        assert!(matches!(
            validate(&bss_only, 0x1000, Some(0x3e00)),
            Err(SiteProblem::SemaphoreNotFileMapped { .. })
        ));
    }

    #[test]
    fn problems_read_well() {
        let layout = usdt_args();
        assert_eq!(
            validate(&layout, 0, None).unwrap_err().to_string(),
            "probe address 0x0 is not code: it is in segment [0x0, 0x1aadc) r--, which is \
             not executable"
        );
        assert_eq!(
            validate(&layout, 0x1e995, Some(0x1e934))
                .unwrap_err()
                .to_string(),
            "semaphore 0x1e934 is in segment [0x1bae0, 0x63cb0) r-x, which is not writable"
        );
    }
}

#[cfg(test)]
mod nop5_tests {
    use super::*;

    #[test]
    fn a_nop_then_a_nop5_is_attached_at_the_nop5() {
        let at = SiteOffsets {
            probe: 0x11a0,
            semaphore: None,
            nop5: false,
        };
        let moved = at.prefer_nop5(&[0x90, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]);
        assert_eq!((moved.probe, moved.nop5), (0x11a1, true));
        // Applied once only.
        assert_eq!(moved.prefer_nop5(&NOP_NOP5).probe, 0x11a1);
        // A lone nop (what Debian's sys/sdt.h emits), another 5-byte nop form, too few
        // bytes: unchanged.
        for code in [
            &[0x90, 0x48, 0x89, 0xc7][..],
            &[0x90, 0x0f, 0x1f, 0x40, 0x00],
            &[0x90, 0x0f, 0x1f, 0x44, 0x00],
        ] {
            assert_eq!(at.prefer_nop5(code), at);
        }
    }
}
