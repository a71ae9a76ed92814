//! The unwind tables of the files a process maps, and a process's framehop unwinder built
//! from them. The tables tell which addresses call frame information covers. A process's
//! unwinder tells where a signal return trampoline lies.

use std::cell::RefCell;
use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use framehop::ExplicitModuleSectionInfo;
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindSection};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, ReadCache};

/// The unwind tables of one file, shared by every process mapping it.
#[derive(Debug)]
pub(super) struct ObjectTables {
    pub(super) sections: ExplicitModuleSectionInfo<Arc<[u8]>>,
    /// (file offset, stated address, file size) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    /// Stated addresses covered by call frame information, sorted, not overlapping.
    cfi: Vec<Range<u64>>,
    /// Stated addresses of the signal return trampolines in `.text`, sorted. The code
    /// itself is not kept: framehop reads none of an ELF file's code.
    sigreturns: Vec<u64>,
}

impl ObjectTables {
    pub(super) fn read(file: &File) -> Option<Self> {
        let cache = ReadCache::new(file.try_clone().ok()?);
        let elf = object::File::parse(&cache).ok()?;
        let mut sections = ExplicitModuleSectionInfo {
            base_svma: 0,
            ..Default::default()
        };
        let section = |name: &str| -> Option<(Range<u64>, Arc<[u8]>)> {
            let section = elf.section_by_name(name)?;
            let range = section.address()..section.address() + section.size();
            Some((range, Arc::from(section.data().ok()?)))
        };
        let mut sigreturns = Vec::new();
        if let Some(text) = elf.section_by_name(".text") {
            sections.text_svma = Some(text.address()..text.address() + text.size());
            if let Some((offset, size)) = text.file_range() {
                sigreturns = find_sigreturns(file, offset, size, text.address());
            }
        }
        if let Some((range, data)) = section(".eh_frame") {
            sections.eh_frame_svma = Some(range);
            sections.eh_frame = Some(data);
        }
        if let Some((range, data)) = section(".eh_frame_hdr") {
            sections.eh_frame_hdr_svma = Some(range);
            sections.eh_frame_hdr = Some(data);
        }
        if let Some((_, data)) = section(".debug_frame") {
            sections.debug_frame = Some(data);
        }
        sections.got_svma = elf
            .section_by_name(".got")
            .map(|s| s.address()..s.address() + s.size());
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, s.address(), size)
            })
            .collect();
        let cfi = cfi_ranges(&sections);
        Some(Self {
            sections,
            segments,
            cfi,
            sigreturns,
        })
    }

    /// Whether call frame information covers stated address `svma`.
    fn has_cfi(&self, svma: u64) -> bool {
        let after = self.cfi.partition_point(|r| r.start <= svma);
        after > 0 && self.cfi[after - 1].contains(&svma)
    }

    /// The stated address of file offset `offset` (a mapping's start), through the
    /// loadable segment mapped there. A mapping starts at the page holding its segment's
    /// first byte, which may also hold the end of the previous segment: the last segment
    /// whose pages hold `offset` is the one.
    pub(super) fn svma_of_offset(&self, offset: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        self.segments
            .iter()
            .filter(|(start, _, size)| {
                (start & !(PAGE - 1)..start + size.max(&1)).contains(&offset)
            })
            .max_by_key(|(start, _, _)| *start)
            .map(|(start, svma, _)| svma.wrapping_add(offset).wrapping_sub(*start))
    }
}

/// The stated addresses of [`SIGRETURN_CODE`] in the `size` bytes of code at file offset
/// `offset` of `file`, stated at `svma`: read a piece at a time, so that the code is never
/// held whole.
fn find_sigreturns(file: &File, offset: u64, size: u64, svma: u64) -> Vec<u64> {
    use std::os::unix::fs::FileExt as _;
    const PIECE: u64 = 1 << 20;
    let overlap = SIGRETURN_CODE.len() as u64 - 1;
    let finder = memchr::memmem::Finder::new(&SIGRETURN_CODE);
    let mut found = Vec::new();
    let mut buffer = vec![0; (PIECE + overlap) as usize];
    let mut at = 0;
    while at < size {
        let len = (PIECE + overlap).min(size - at) as usize;
        if file.read_exact_at(&mut buffer[..len], offset + at).is_err() {
            break;
        }
        found.extend(
            finder
                .find_iter(&buffer[..len])
                .map(|i| svma + at + i as u64),
        );
        at += PIECE;
    }
    found
}

/// The address ranges of the FDEs of `.eh_frame` and `.debug_frame`, sorted and merged.
fn cfi_ranges(sections: &ExplicitModuleSectionInfo<Arc<[u8]>>) -> Vec<Range<u64>> {
    let mut ranges = Vec::new();
    if let (Some(data), Some(svma)) = (&sections.eh_frame, &sections.eh_frame_svma) {
        let mut bases = BaseAddresses::default().set_eh_frame(svma.start);
        if let Some(text) = &sections.text_svma {
            bases = bases.set_text(text.start);
        }
        if let Some(got) = &sections.got_svma {
            bases = bases.set_got(got.start);
        }
        fde_ranges(&EhFrame::new(data, LittleEndian), &bases, &mut ranges);
    }
    if let Some(data) = &sections.debug_frame {
        let mut section = DebugFrame::new(data, LittleEndian);
        section.set_address_size(8);
        fde_ranges(&section, &BaseAddresses::default(), &mut ranges);
    }
    ranges.sort_unstable_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    merged
}

fn fde_ranges<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    ranges: &mut Vec<Range<u64>>,
) {
    let mut entries = section.entries(bases);
    // A malformed entry ends the walk: the rest is read as not covered (frame pointers).
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(S::cie_from_offset)
            && fde.len() > 0
        {
            ranges.push(fde.initial_address()..fde.end_address());
        }
    }
}

/// A process's unwinder: one module per file-backed executable mapping.
pub(super) struct ProcessUnwinder {
    pub(super) unwinder: UnwinderX86_64<Arc<[u8]>>,
    /// The unwind rules it found, by address. Each process has its own: framehop keys a
    /// cache by the unwinder that filled it, so one cache shared by several processes
    /// would hold the rules of whichever unwound last.
    pub(super) cache: RefCell<CacheX86_64>,
    /// [`ProcessUnwinder::has_cfi`]'s answers by address, one per slot: the same return
    /// addresses come back stack after stack, and each answer is a binary search over
    /// every range of a big file's call frame information.
    pub(super) cfi_answers: RefCell<Box<[(u64, bool)]>>,
    /// (mapped range, base address, tables) of each module, sorted by address, to tell
    /// which addresses have call frame information.
    pub(super) modules: Vec<(Range<u64>, u64, Arc<ObjectTables>)>,
    /// How many mappings the snapshot had when built: rebuilt when that changes.
    pub(super) mappings: usize,
    /// [`DwarfUnwinder::unwinds`](crate::stack::unwind::DwarfUnwinder::unwinds) when it last
    /// unwound a stack.
    pub(super) last_used: u64,
}

/// The signal return trampoline (glibc's `__restore_rt`, musl's `__restore_rt` alike):
/// `mov $15, %rax; syscall` (rt_sigreturn). A signal handler returns into it.
const SIGRETURN_CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Slots of [`ProcessUnwinder::cfi_answers`].
const CFI_ANSWERS: usize = 1021;

impl ProcessUnwinder {
    /// No answer yet in any slot of [`ProcessUnwinder::cfi_answers`].
    pub(super) fn no_cfi_answers() -> RefCell<Box<[(u64, bool)]>> {
        // No code lies at the last address.
        RefCell::new(vec![(u64::MAX, false); CFI_ANSWERS].into_boxed_slice())
    }

    /// Whether `avma` is the start of a signal return trampoline: the frame below is the
    /// context the signal interrupted, saved on the stack.
    pub(super) fn is_sigreturn(&self, avma: u64) -> bool {
        self.module_of(avma).is_some_and(|(_, base, tables)| {
            tables
                .sigreturns
                .binary_search(&avma.wrapping_sub(*base))
                .is_ok()
        })
    }

    /// Whether call frame information covers `avma` (else framehop follows the frame
    /// pointer to find its caller).
    pub(super) fn has_cfi(&self, avma: u64) -> bool {
        let mut answers = self.cfi_answers.borrow_mut();
        let slot = &mut answers[(avma ^ (avma >> 16)) as usize % CFI_ANSWERS];
        if slot.0 == avma {
            return slot.1;
        }
        let covered = self
            .module_of(avma)
            .is_some_and(|(_, base, tables)| tables.has_cfi(avma.wrapping_sub(*base)));
        *slot = (avma, covered);
        covered
    }

    /// The module mapped at `avma`: `modules` are sorted by address.
    fn module_of(&self, avma: u64) -> Option<&(Range<u64>, u64, Arc<ObjectTables>)> {
        let after = self
            .modules
            .partition_point(|(range, _, _)| range.start <= avma);
        let module = self.modules.get(after.checked_sub(1)?)?;
        module.0.contains(&avma).then_some(module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_starts_in_the_page_of_its_segment() {
        // lld's layout: the code segment starts mid-page, one page above its offset.
        let tables = ObjectTables {
            sections: ExplicitModuleSectionInfo::default(),
            segments: vec![(0, 0, 0xc8528), (0xc8530, 0xc9530, 0x2872c0)],
            cfi: Vec::new(),
            sigreturns: Vec::new(),
        };
        assert_eq!(tables.svma_of_offset(0xc8000), Some(0xc9000));
        assert_eq!(tables.svma_of_offset(0), Some(0));
        assert_eq!(tables.svma_of_offset(0x400000), None);
    }

    /// The trampolines are found wherever they lie, also across the pieces read.
    #[test]
    fn finds_the_trampolines_across_the_pieces_it_reads() {
        let piece = 1 << 20;
        let mut code = vec![0x90u8; 2 * piece + 100];
        let places = [0, piece - 4, piece + 8, code.len() - SIGRETURN_CODE.len()];
        for at in places {
            code[at..at + SIGRETURN_CODE.len()].copy_from_slice(&SIGRETURN_CODE);
        }
        let path = std::env::temp_dir().join(format!("tracer-sigreturns-{}", std::process::id()));
        std::fs::write(&path, [&[0u8; 16][..], &code].concat()).unwrap();
        let file = File::open(&path).unwrap();
        let found = find_sigreturns(&file, 16, code.len() as u64, 0x1000);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(found, places.map(|at| 0x1000 + at as u64));
    }
}
