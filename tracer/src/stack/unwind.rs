//! DWARF unwinding of user stacks without frame pointers (`tracer profile --unwind dwarf`).
//!
//! The kernel sends snapshots ([`tracer_common::UnwindSample`]): the user instruction,
//! stack and frame pointers of a thread and a copy of the top of its stack, for each
//! on-CPU sample of a user thread (with its kernel stack id when it was in the kernel),
//! and where a thread blocks (off-CPU snapshots, whose ids the kernel's off-CPU keys
//! carry as user stack ids). Here each is unwound with `framehop`, using the
//! `.eh_frame`/`.eh_frame_hdr` (and `.debug_frame`) of every file the process maps, read
//! from the descriptors [`ProcessMaps`] keeps open, so processes that exited still
//! unwind. Where no call frame information covers an address framehop falls back to
//! frame pointers; the frames found that way are told apart ([`UnwoundStack`]). On-CPU
//! stacks (instruction pointers, innermost first, as the kernel's stack map stores them)
//! are counted per thread and given ids of their own, so the rest of the profile names
//! them like the kernel's stacks ([`WithUnwound`]).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::mem::offset_of;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindSection};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, ReadCache};
use tracer_common::{
    FIRST_SNAPSHOT_ID, MAX_SNAPSHOT_CHECKS, MAX_STACK_DEPTH, NO_STACK, OnCpuKey, SnapshotCheck,
    StackWords, UNWIND_STACK_BYTES, UnwindSample, python::PythonStack,
};

use crate::{stack::naming::StackSource, stack::symbolize::ProcessMaps};

/// Ids given to unwound on-CPU stacks start here, far above the kernel's stack map ids
/// and below the off-CPU snapshot ids ([`FIRST_SNAPSHOT_ID`]).
pub const FIRST_UNWOUND_ID: i32 = 1 << 24;

/// One unwound user stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UnwoundStack {
    /// Instruction pointers, innermost first.
    pub addrs: Vec<u64>,
    /// For each, whether it was found by following the frame pointer (no call frame
    /// information covered the frame below it); the innermost comes from the registers.
    pub by_frame_pointer: Vec<bool>,
}

/// The outermost frame of a stack cut short (deeper than the bytes copied, or than
/// [`MAX_STACK_DEPTH`] frames, or its Python frames more than the kernel sends).
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// The token standing for [`TRUNCATED_FRAME`].
fn truncated_token() -> u64 {
    crate::stack::frame_tokens::token(TRUNCATED_FRAME.to_string(), "[tracer]")
}

/// Unwound user stacks by their ids.
pub type UnwoundStacks = HashMap<i32, UnwoundStack>;

/// Byte offsets of the fields of [`tracer_common::UnwindSample`].
const TGID_AT: usize = offset_of!(UnwindSample, tgid);
const TID_AT: usize = offset_of!(UnwindSample, tid);
const IP_AT: usize = offset_of!(UnwindSample, ip);
const SP_AT: usize = offset_of!(UnwindSample, sp);
const BP_AT: usize = offset_of!(UnwindSample, bp);
const STACK_LEN_AT: usize = offset_of!(UnwindSample, stack_len);
const KERNEL_STACK_AT: usize = offset_of!(UnwindSample, kernel_stack_id);
const SNAPSHOT_ID_AT: usize = offset_of!(UnwindSample, snapshot_id);
const TASK_AT: usize = offset_of!(UnwindSample, task);
const PYTHON_AT: usize = offset_of!(UnwindSample, python);
const STACK_AT: usize = offset_of!(UnwindSample, stack);

/// One snapshot as read from the ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<'a> {
    pub tgid: u32,
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Id of the kernel stack in the stack map; [`NO_STACK`] for a sample in user mode.
    pub kernel_stack_id: i32,
    /// 0 for an on-CPU sample; the off-CPU snapshot's id otherwise.
    pub snapshot_id: u32,
    /// For an on-CPU sample, the runtime task the thread ran (0: none known).
    pub task: u64,
    /// The thread's Python frames, when its process is a CPython interpreter the kernel
    /// walks.
    pub python: Option<Box<PythonStack>>,
    /// The stack bytes from `sp` up.
    pub stack: &'a [u8],
}

impl<'a> Snapshot<'a> {
    /// Parses a ring buffer record; `None` if it is too short.
    pub fn parse(record: &'a [u8]) -> Option<Self> {
        let u32_at = |at: usize| Some(u32::from_ne_bytes(record.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |at: usize| Some(u64::from_ne_bytes(record.get(at..at + 8)?.try_into().ok()?));
        let stack_len = (u32_at(STACK_LEN_AT)? as usize).min(UNWIND_STACK_BYTES);
        Some(Self {
            tgid: u32_at(TGID_AT)?,
            tid: u32_at(TID_AT)?,
            ip: u64_at(IP_AT)?,
            sp: u64_at(SP_AT)?,
            bp: u64_at(BP_AT)?,
            kernel_stack_id: u32_at(KERNEL_STACK_AT)? as i32,
            snapshot_id: u32_at(SNAPSHOT_ID_AT)?,
            task: u64_at(TASK_AT)?,
            python: python_frames(record.get(PYTHON_AT..STACK_AT)?),
            stack: record.get(STACK_AT..STACK_AT + stack_len)?,
        })
    }
}

/// The Python frames of a snapshot's [`PythonStack`] bytes; `None` when it has none.
fn python_frames(bytes: &[u8]) -> Option<Box<PythonStack>> {
    let count = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    if count == 0 || bytes.len() < std::mem::size_of::<PythonStack>() {
        return None;
    }
    // SAFETY: `bytes` holds a whole `PythonStack`, a #[repr(C)] struct of integers for
    // which every bit pattern is valid; `read_unaligned` makes no alignment demand.
    let stack = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const PythonStack) };
    Some(Box::new(stack))
}

/// What puts a runtime's own frames into an unwound native stack (the Python frames a
/// snapshot carries, in place of the interpreter's frames).
pub trait StackMerger {
    fn merge_python(&mut self, stack: UnwoundStack, python: &PythonStack) -> UnwoundStack;
}

/// How unwinding one stack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwindEnd {
    /// At the outermost frame (its unwind rules say there is no caller).
    Complete,
    /// The stack goes on beyond the bytes copied (or [`MAX_STACK_DEPTH`]).
    OutOfStack,
    /// Before the stack's end otherwise: an address had no unwind information and no
    /// usable frame pointer (often the outermost frame of code without CFI).
    Truncated,
}

/// What unwinding did, for the summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnwindStats {
    /// On-CPU samples unwound here.
    pub samples: u64,
    /// Off-CPU snapshots (where a thread blocked) unwound here.
    pub offcpu_snapshots: u64,
    /// Of those, samples taken in kernel mode (unwound from the user registers saved
    /// when the thread entered the kernel).
    pub in_kernel: u64,
    /// Frames they gave (the instruction pointer included).
    pub frames: u64,
    /// Of those, frames found by following frame pointers.
    pub frame_pointer_frames: u64,
    /// The deepest stack.
    pub max_depth: u64,
    /// Stacks (samples or snapshots) whose stack goes on beyond the bytes copied (or [`MAX_STACK_DEPTH`]).
    pub out_of_stack: u64,
    /// Stacks whose unwinding stopped before the stack's end otherwise: an address had
    /// no unwind information and no usable frame pointer (often the outermost frame of
    /// code without CFI, so not necessarily a loss).
    pub truncated: u64,
    /// Stacks of processes whose mappings could not be read (only their instruction
    /// pointer is kept).
    pub no_maps: u64,
}

/// The unwind tables of one file, shared by every process mapping it.
#[derive(Debug)]
struct ObjectTables {
    sections: ExplicitModuleSectionInfo<Arc<[u8]>>,
    /// (file offset, stated address, file size) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    /// Stated addresses covered by call frame information, sorted, not overlapping.
    cfi: Vec<Range<u64>>,
}

impl ObjectTables {
    fn read(file: &File) -> Option<Self> {
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
        if let Some((range, data)) = section(".text") {
            sections.text_svma = Some(range);
            sections.text = Some(data);
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
    fn svma_of_offset(&self, offset: u64) -> Option<u64> {
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
struct ProcessUnwinder {
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    /// (mapped range, base address, tables) of each module, to tell which addresses have
    /// call frame information.
    modules: Vec<(Range<u64>, u64, Arc<ObjectTables>)>,
    /// How many mappings the snapshot had when built: rebuilt when that changes.
    mappings: usize,
    /// [`DwarfUnwinder::unwinds`] when it last unwound a stack.
    last_used: u64,
}

/// Processes whose unwinders are kept at most. A service that starts thousands of
/// short-lived processes would otherwise keep one for each long after it exited; one
/// dropped is rebuilt from the shared tables if its process sends more snapshots.
const MAX_PROCESS_UNWINDERS: usize = 256;

/// The signal return trampoline (glibc's `__restore_rt`, musl's `__restore_rt` alike):
/// `mov $15, %rax; syscall` (rt_sigreturn). A signal handler returns into it.
const SIGRETURN_CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// In the kernel's `struct rt_sigframe` on x86-64, after the return address: the
/// `ucontext`, whose `uc_mcontext` (`struct sigcontext`) starts 40 bytes in and holds
/// the interrupted `rbp`, `rsp` and `rip` at 80, 120 and 128.
const SIGFRAME_RBP: u64 = 8 + 40 + 80;
const SIGFRAME_RSP: u64 = 8 + 40 + 120;
const SIGFRAME_RIP: u64 = 8 + 40 + 128;

/// How many nested signal frames one stack is unwound through.
const MAX_SIGNAL_FRAMES: usize = 4;

impl ProcessUnwinder {
    /// Whether `avma` is the start of a signal return trampoline: the frame below is the
    /// context the signal interrupted, saved on the stack.
    fn is_sigreturn(&self, avma: u64) -> bool {
        self.modules
            .iter()
            .find(|(range, _, _)| range.contains(&avma))
            .is_some_and(|(_, base, tables)| {
                let svma = avma.wrapping_sub(*base);
                let (Some(range), Some(text)) = (&tables.sections.text_svma, &tables.sections.text)
                else {
                    return false;
                };
                range.contains(&svma)
                    && usize::try_from(svma - range.start).is_ok_and(|at| {
                        text.get(at..at + SIGRETURN_CODE.len()) == Some(&SIGRETURN_CODE[..])
                    })
            })
    }

    /// Whether call frame information covers `avma` (else framehop follows the frame
    /// pointer to find its caller).
    fn has_cfi(&self, avma: u64) -> bool {
        self.modules
            .iter()
            .find(|(range, _, _)| range.contains(&avma))
            .is_some_and(|(_, base, tables)| tables.has_cfi(avma.wrapping_sub(*base)))
    }
}

/// Unwinds snapshots and counts the stacks they give.
#[derive(Default)]
pub struct DwarfUnwinder {
    /// Per (device, inode); `None` when the file's tables could not be read.
    objects: HashMap<(String, u64), Option<Arc<ObjectTables>>>,
    /// The processes unwound most recently (at most [`MAX_PROCESS_UNWINDERS`]).
    processes: HashMap<u32, ProcessUnwinder>,
    /// Stacks unwound so far: the clock of [`ProcessUnwinder::last_used`].
    unwinds: u64,
    cache: CacheX86_64,
    /// On-CPU samples per (tgid, tid, kernel stack id, user stack, task).
    samples: HashMap<(u32, u32, i32, UnwoundStack, u64), u64>,
    /// Off-CPU snapshots by id.
    snapshots: UnwoundStacks,
    pub stats: UnwindStats,
}

impl DwarfUnwinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Unwinds one snapshot with the mappings of its process (`None` when unknown). For
    /// an off-CPU snapshot, returns what the kernel is to check before reusing it: the
    /// stack words unwinding read.
    pub fn add(
        &mut self,
        snapshot: &Snapshot<'_>,
        maps: Option<&ProcessMaps>,
        merger: Option<&mut dyn StackMerger>,
    ) -> Option<SnapshotCheck> {
        let mut reads = Vec::new();
        let mut cut_short = snapshot.python.as_ref().is_some_and(|p| p.truncated != 0);
        let native = match maps {
            Some(maps) => {
                let (stack, end) = self.unwind(snapshot, maps, &mut reads);
                match end {
                    UnwindEnd::Complete => {}
                    UnwindEnd::OutOfStack => {
                        self.stats.out_of_stack += 1;
                        cut_short = true;
                    }
                    UnwindEnd::Truncated => self.stats.truncated += 1,
                }
                stack
            }
            None => {
                self.stats.no_maps += 1;
                UnwoundStack {
                    addrs: vec![snapshot.ip],
                    by_frame_pointer: vec![false],
                }
            }
        };
        // The reuse check is of the native frames: the kernel compares Python frames itself.
        let native_addrs = (snapshot.snapshot_id != 0).then(|| native.addrs.clone());
        let mut stack = match (merger, &snapshot.python) {
            (Some(merger), Some(python)) => merger.merge_python(native, python),
            _ => native,
        };
        if cut_short {
            stack.addrs.push(truncated_token());
            stack.by_frame_pointer.push(false);
        }
        self.stats.frames += stack.addrs.len() as u64;
        self.stats.frame_pointer_frames +=
            stack.by_frame_pointer.iter().filter(|&&fp| fp).count() as u64;
        self.stats.max_depth = self.stats.max_depth.max(stack.addrs.len() as u64);
        if snapshot.snapshot_id != 0 {
            self.stats.offcpu_snapshots += 1;
            // Without mappings nothing was read: the snapshot is not to be reused.
            let check = match (maps, &native_addrs) {
                (Some(_), Some(native)) => snapshot_check(snapshot, &reads, native),
                _ => NEVER_REUSE,
            };
            self.snapshots.insert(snapshot.snapshot_id as i32, stack);
            return Some(check);
        }
        self.stats.samples += 1;
        self.stats.in_kernel += u64::from(snapshot.kernel_stack_id != NO_STACK);
        *self
            .samples
            .entry((
                snapshot.tgid,
                snapshot.tid,
                snapshot.kernel_stack_id,
                stack,
                snapshot.task,
            ))
            .or_default() += 1;
        None
    }

    /// Unwinds one snapshot taken outside a profile (a thread's registers and stack read
    /// from /proc, see [`crate::profile::threads`]) and returns its stack and how unwinding ended,
    /// counting it nowhere: neither in [`DwarfUnwinder::stats`] nor in
    /// [`DwarfUnwinder::finish`]. The process's unwind tables are kept for its next one.
    pub fn unwind_one(
        &mut self,
        snapshot: &Snapshot<'_>,
        maps: &ProcessMaps,
    ) -> (UnwoundStack, UnwindEnd) {
        self.unwind(snapshot, maps, &mut Vec::new())
    }

    /// Unwinds `snapshot`, noting in `reads` every stack word it tried to read (unwinding
    /// is a function of the registers and of those words only).
    fn unwind(
        &mut self,
        snapshot: &Snapshot<'_>,
        maps: &ProcessMaps,
        reads: &mut Vec<StackRead>,
    ) -> (UnwoundStack, UnwindEnd) {
        let mapping_count = maps.mapped_files().count();
        let stale = self
            .processes
            .get(&snapshot.tgid)
            .is_none_or(|p| p.mappings != mapping_count);
        if stale {
            if !self.processes.contains_key(&snapshot.tgid)
                && self.processes.len() >= MAX_PROCESS_UNWINDERS
            {
                self.drop_least_recent_process();
            }
            let process = self.build(maps, mapping_count);
            self.processes.insert(snapshot.tgid, process);
        }
        self.unwinds += 1;
        if let Some(process) = self.processes.get_mut(&snapshot.tgid) {
            process.last_used = self.unwinds;
        }
        let process = &self.processes[&snapshot.tgid];
        let (sp, stack) = (snapshot.sp, snapshot.stack);
        // The last few words read, to find where a signal frame starts.
        let recent: std::cell::RefCell<Vec<(u64, u64)>> = Default::default();
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let value = (|| {
                let at = usize::try_from(addr.checked_sub(sp)?).ok()?;
                let bytes = stack.get(at..at.checked_add(8)?)?;
                Some(u64::from_le_bytes(bytes.try_into().ok()?))
            })();
            reads.push(StackRead { addr, value });
            let value = value.ok_or(())?;
            let mut recent = recent.borrow_mut();
            if recent.len() == 4 {
                recent.remove(0);
            }
            recent.push((addr, value));
            Ok(value)
        };
        let mut unwound = UnwoundStack::default();
        let mut end = UnwindEnd::Complete;
        let mut through_signal_frame = false;
        let mut last_lookup = snapshot.ip;
        let (mut ip, mut regs) = (
            snapshot.ip,
            UnwindRegsX86_64::new(snapshot.ip, snapshot.sp, snapshot.bp),
        );
        // A stack with signal handlers running unwinds in parts: down to the signal
        // return trampoline, then from the interrupted registers the kernel saved on the
        // stack (framehop does not unwind through signal frames).
        for _ in 0..=MAX_SIGNAL_FRAMES {
            let mut iter = process
                .unwinder
                .iter_frames(ip, regs, &mut self.cache, &mut read_stack);
            // The address whose unwind rule found the next frame: the instruction
            // pointer, then each return address minus one (the call instruction).
            let mut lookup = ip;
            last_lookup = lookup;
            let mut first = true;
            let mut sigreturn = None;
            loop {
                match iter.next() {
                    Ok(Some(frame)) => {
                        unwound
                            .by_frame_pointer
                            .push(!first && !process.has_cfi(lookup));
                        unwound.addrs.push(frame.address());
                        lookup = frame.address_for_lookup();
                        last_lookup = lookup;
                        if !first && process.is_sigreturn(frame.address()) {
                            sigreturn = Some(frame.address());
                            break;
                        }
                        first = false;
                    }
                    Ok(None) => break,
                    Err(framehop::Error::CouldNotReadStack(addr)) => {
                        log::debug!("unwinding ran out of stack at {addr:#x}");
                        end = UnwindEnd::OutOfStack;
                        break;
                    }
                    Err(e) => {
                        log::debug!("unwinding stopped: {e}");
                        end = UnwindEnd::Truncated;
                        break;
                    }
                }
                if unwound.addrs.len() >= MAX_STACK_DEPTH {
                    end = UnwindEnd::OutOfStack;
                    break;
                }
            }
            let Some(trampoline) = sigreturn else {
                break;
            };
            // The handler's return address was read from the signal frame's first word:
            // the saved context follows it.
            let slot = recent
                .borrow()
                .iter()
                .rev()
                .find(|(_, v)| *v == trampoline)
                .map(|r| r.0);
            let Some(frame) = slot else {
                end = UnwindEnd::Truncated;
                break;
            };
            // What the kernel would have to check is not only stack words here.
            through_signal_frame = true;
            let mut saved = |offset: u64| read_stack(frame + offset);
            let (Ok(rip), Ok(rsp), Ok(rbp)) = (
                saved(SIGFRAME_RIP),
                saved(SIGFRAME_RSP),
                saved(SIGFRAME_RBP),
            ) else {
                end = UnwindEnd::OutOfStack;
                break;
            };
            (ip, regs) = (rip, UnwindRegsX86_64::new(rip, rsp, rbp));
        }
        if through_signal_frame {
            reads.push(THROUGH_SIGNAL_FRAME);
        }
        // Frame pointer unwinding (code without call frame information) stops at a frame
        // pointer that cannot be a frame's (0, or not above the stack pointer) without
        // reading it: the register mattered all the same.
        let by_frame_pointer =
            unwound.by_frame_pointer.iter().any(|&fp| fp) || !process.has_cfi(last_lookup);
        if by_frame_pointer && snapshot.bp <= snapshot.sp {
            reads.push(StackRead {
                addr: snapshot.bp,
                value: None,
            });
        }
        if unwound.addrs.is_empty() {
            unwound.addrs.push(snapshot.ip);
            unwound.by_frame_pointer.push(false);
        }
        (unwound, end)
    }

    fn build(&mut self, maps: &ProcessMaps, mappings: usize) -> ProcessUnwinder {
        let mut unwinder = UnwinderX86_64::new();
        let mut modules = Vec::new();
        for mapping in maps.mapped_files() {
            let Some(file) = mapping.file else {
                continue;
            };
            let key = (mapping.dev.to_string(), mapping.inode);
            let tables = self
                .objects
                .entry(key)
                .or_insert_with(|| {
                    let tables = ObjectTables::read(file).map(Arc::new);
                    if tables.is_none() {
                        log::warn!(
                            "cannot read the unwind tables of {}",
                            crate::system::text::escape_text(mapping.path)
                        );
                    }
                    tables
                })
                .clone();
            let Some(tables) = tables else {
                continue;
            };
            let Some(svma) = tables.svma_of_offset(mapping.offset) else {
                continue;
            };
            let base_avma = mapping.start.wrapping_sub(svma);
            unwinder.add_module(Module::new(
                mapping.path.to_string(),
                mapping.start..mapping.end,
                base_avma,
                tables.sections.clone(),
            ));
            modules.push((mapping.start..mapping.end, base_avma, tables));
        }
        ProcessUnwinder {
            unwinder,
            modules,
            mappings,
            last_used: self.unwinds,
        }
    }

    /// Drops the unwinder of the process that unwound a stack least recently: most
    /// often one that exited.
    fn drop_least_recent_process(&mut self) {
        let least_recent = self
            .processes
            .iter()
            .min_by_key(|(_, process)| process.last_used)
            .map(|(&tgid, _)| tgid);
        if let Some(tgid) = least_recent {
            self.processes.remove(&tgid);
        }
    }

    /// The unwound on-CPU samples as on-CPU entries (user stack ids from
    /// [`FIRST_UNWOUND_ID`]), and every unwound stack by id: those and the off-CPU
    /// snapshots (ids from [`FIRST_SNAPSHOT_ID`], as the off-CPU keys carry them).
    pub fn finish(self) -> UnwoundSamples {
        let mut unwound = UnwoundSamples {
            oncpu: Vec::with_capacity(self.samples.len()),
            task_oncpu: Vec::new(),
            stacks: self.snapshots,
        };
        for (next_id, ((tgid, tid, kernel_stack_id, stack, task), samples)) in
            (FIRST_UNWOUND_ID..FIRST_SNAPSHOT_ID).zip(self.samples)
        {
            let key = OnCpuKey {
                tgid,
                tid,
                user_stack_id: next_id,
                kernel_stack_id,
                state: 0,
            };
            unwound.oncpu.push((key, samples));
            if task != 0 {
                unwound.task_oncpu.push((task, key, samples));
            }
            unwound.stacks.insert(next_id, stack);
        }
        unwound
    }
}

/// What [`DwarfUnwinder::finish`] gives.
pub struct UnwoundSamples {
    /// On-CPU samples by thread and stacks.
    pub oncpu: Vec<(OnCpuKey, u64)>,
    /// Those of threads running a runtime task: (task, key, samples).
    pub task_oncpu: Vec<(u64, OnCpuKey, u64)>,
    /// Every unwound stack by id.
    pub stacks: UnwoundStacks,
}

/// The check of a snapshot the kernel is not to reuse: more words than it can check.
const NEVER_REUSE: SnapshotCheck = SnapshotCheck {
    uses_bp: 0,
    _pad: 0,
    words: StackWords {
        count: u32::MAX,
        ..StackWords::EMPTY
    },
};

/// A stack word unwinding tried to read, and what it found (`None`: outside the copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StackRead {
    addr: u64,
    value: Option<u64>,
}

/// Noted among the reads when unwinding went on through a signal frame: such a snapshot
/// is not to be reused.
const THROUGH_SIGNAL_FRAME: StackRead = StackRead {
    addr: u64::MAX,
    value: None,
};

/// How far above a saved value a later read may be for the value to count as that read's
/// base (a frame pointer with the frame's words above it).
const BASE_REACH: u64 = 4096;

/// What the kernel checks before it reuses an off-CPU snapshot: the words read that the
/// frames depended on. Those are the return addresses (`frames`), the saved frame
/// pointers a later step may have used as the base of its reads (a later read at most
/// [`BASE_REACH`] above the value), and the last word read (where unwinding stopped). A
/// register saved on the stack that no step used is left out: code without frame
/// pointers keeps data in `rbp`, and a word that changes at every block (a loop counter)
/// would otherwise make every snapshot new. The frame pointer register itself matters
/// when a read may have been based on it (`unwind` notes one where frame pointer
/// unwinding stopped at it without reading). A snapshot unwound through a signal frame,
/// or whose words do not fit, is never reused.
fn snapshot_check(snapshot: &Snapshot<'_>, reads: &[StackRead], frames: &[u64]) -> SnapshotCheck {
    if reads.contains(&THROUGH_SIGNAL_FRAME) {
        return NEVER_REUSE;
    }
    let frames: HashSet<u64> = frames.iter().copied().collect();
    let used_as_base = |value: u64, later: &[StackRead]| {
        later
            .iter()
            .any(|r| r.addr >= value && r.addr - value < BASE_REACH)
    };
    let mut words = StackWords::EMPTY;
    for (i, read) in reads.iter().enumerate() {
        let Some(value) = read.value else {
            continue;
        };
        let last = i + 1 == reads.len();
        if !(last || frames.contains(&value) || used_as_base(value, &reads[i + 1..])) {
            continue;
        }
        let n = words.count as usize;
        if n == MAX_SNAPSHOT_CHECKS {
            return NEVER_REUSE;
        }
        // Within the copy, so less than UNWIND_STACK_BYTES from the stack pointer.
        let at = read.addr.wrapping_sub(snapshot.sp) as u32;
        words.offsets[n] = at;
        words.values[n] = value;
        words.count += 1;
        words.span = words.span.max(at + 8);
    }
    SnapshotCheck {
        uses_bp: u32::from(used_as_base(snapshot.bp, reads)),
        _pad: 0,
        words,
    }
}

/// The kernel's stacks plus the unwound ones, for a profile unwound with DWARF: user
/// frames the kernel walked (samples that could not be sent) were found with frame
/// pointers.
pub struct WithUnwound<'a, S> {
    pub kernel: &'a S,
    pub unwound: &'a UnwoundStacks,
}

impl<S: StackSource> StackSource for WithUnwound<'_, S> {
    fn stack(&self, id: i32) -> Vec<u64> {
        match self.unwound.get(&id) {
            Some(stack) => stack.addrs.clone(),
            None => self.kernel.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: i32) -> Vec<bool> {
        match self.unwound.get(&id) {
            Some(stack) => stack.by_frame_pointer.clone(),
            None => {
                let depth = self.kernel.stack(id).len();
                (0..depth).map(|i| i > 0).collect()
            }
        }
    }

    fn named(&self, id: i32) -> Option<Vec<String>> {
        self.kernel.named(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_fields_are_where_the_kernel_puts_them() {
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, stack),
            STACK_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, stack_len),
            STACK_LEN_AT
        );
        assert_eq!(std::mem::offset_of!(tracer_common::UnwindSample, bp), BP_AT);
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, kernel_stack_id),
            KERNEL_STACK_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, snapshot_id),
            SNAPSHOT_ID_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, task),
            TASK_AT
        );
        let mut record = vec![0u8; STACK_AT + 16];
        record[TGID_AT..TGID_AT + 4].copy_from_slice(&7u32.to_ne_bytes());
        record[TID_AT..TID_AT + 4].copy_from_slice(&8u32.to_ne_bytes());
        record[IP_AT..IP_AT + 8].copy_from_slice(&0x1000u64.to_ne_bytes());
        record[STACK_LEN_AT..STACK_LEN_AT + 4].copy_from_slice(&16u32.to_ne_bytes());
        record[KERNEL_STACK_AT..KERNEL_STACK_AT + 4].copy_from_slice(&(-14i32).to_ne_bytes());
        let snapshot = Snapshot::parse(&record).unwrap();
        assert_eq!((snapshot.tgid, snapshot.tid, snapshot.ip), (7, 8, 0x1000));
        assert_eq!(snapshot.kernel_stack_id, NO_STACK);
        assert_eq!(snapshot.snapshot_id, 0);
        assert_eq!(snapshot.stack.len(), 16);
        // A stack length beyond the record is refused.
        record[STACK_LEN_AT..STACK_LEN_AT + 4].copy_from_slice(&17u32.to_ne_bytes());
        assert_eq!(Snapshot::parse(&record), None);
    }

    #[test]
    fn a_mapping_starts_in_the_page_of_its_segment() {
        // lld's layout: the code segment starts mid-page, one page above its offset.
        let tables = ObjectTables {
            sections: ExplicitModuleSectionInfo::default(),
            segments: vec![(0, 0, 0xc8528), (0xc8530, 0xc9530, 0x2872c0)],
            cfi: Vec::new(),
        };
        assert_eq!(tables.svma_of_offset(0xc8000), Some(0xc9000));
        assert_eq!(tables.svma_of_offset(0), Some(0));
        assert_eq!(tables.svma_of_offset(0x400000), None);
    }

    #[test]
    fn unwinds_our_own_stack() {
        // This test binary, built with frame pointers or not, has .eh_frame.
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let mut stack = vec![0u8; UNWIND_STACK_BYTES];
        let (ip, sp, bp, len) = snapshot_here(&mut stack);
        stack.truncate(len);
        let snapshot = Snapshot {
            tgid: 1,
            tid: 1,
            ip,
            sp,
            bp,
            kernel_stack_id: NO_STACK,
            snapshot_id: 0,
            task: 0,
            python: None,
            stack: &stack,
        };
        let mut unwinder = DwarfUnwinder::new();
        unwinder.add(&snapshot, Some(&maps), None);
        assert!(unwinder.stats.max_depth >= 3, "{:?}", unwinder.stats);
        let stats = unwinder.stats;
        // The same snapshot on its own: the same stack, and nothing counted.
        let (stack, _) = unwinder.unwind_one(&snapshot, &maps);
        assert_eq!(stack.addrs.len() as u64, stats.max_depth, "{stack:x?}");
        assert_eq!(stack.addrs[0], ip);
        assert_eq!(unwinder.stats, stats);
    }

    #[test]
    fn keeps_the_unwinders_of_the_processes_unwound_last() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let mut stack = vec![0u8; UNWIND_STACK_BYTES];
        let (ip, sp, bp, len) = snapshot_here(&mut stack);
        stack.truncate(len);
        let mut unwinder = DwarfUnwinder::new();
        let processes = MAX_PROCESS_UNWINDERS as u32 + 10;
        for tgid in 1..=processes {
            let snapshot = Snapshot {
                tgid,
                tid: tgid,
                ip,
                sp,
                bp,
                kernel_stack_id: NO_STACK,
                snapshot_id: 0,
                task: 0,
                python: None,
                stack: &stack,
            };
            unwinder.unwind_one(&snapshot, &maps);
        }
        assert_eq!(unwinder.processes.len(), MAX_PROCESS_UNWINDERS);
        // The first ones were dropped, the last one kept; every file was read once.
        assert!(!unwinder.processes.contains_key(&1));
        assert!(unwinder.processes.contains_key(&processes));
        assert!(unwinder.objects.len() <= maps.mapped_files().count());
    }

    #[test]
    fn knows_which_code_has_call_frame_information() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let mut unwinder = DwarfUnwinder::new();
        let mappings = maps.mapped_files().count();
        let process = unwinder.build(&maps, mappings);
        // Rust code has .eh_frame; no module lies at address 16.
        let here = knows_which_code_has_call_frame_information as *const () as u64;
        assert!(process.has_cfi(here));
        assert!(!process.has_cfi(16));
    }

    /// Registers and stack bytes (how many) at a point in this function, as the kernel
    /// would send them.
    #[inline(never)]
    fn snapshot_here(stack: &mut [u8]) -> (u64, u64, u64, usize) {
        let sp: u64;
        let bp: u64;
        let ip: u64;
        // SAFETY: reads three registers, no memory access or side effects.
        unsafe {
            std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp);
        }
        // Only the bytes that are mapped: up to the end of the mapping holding `sp`.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let end = maps
            .lines()
            .filter_map(crate::system::procfs::parse_maps_line)
            .find(|m| (m.start..m.end).contains(&sp))
            .unwrap()
            .end;
        let len = stack.len().min((end - sp) as usize);
        for (i, byte) in stack.iter_mut().enumerate().take(len) {
            // SAFETY: reads our own stack mapping between `sp` and its end; the caller
            // frames stay live during this call.
            *byte = unsafe { std::ptr::read_volatile((sp as *const u8).add(i)) };
        }
        (ip, sp, bp, len)
    }

    /// The kernel checks the words the frames depended on: return addresses, saved frame
    /// pointers later reads were based on, and the last word read; a saved register no
    /// read used (data kept in rbp) is left out, so it may change.
    #[test]
    fn a_snapshot_check_holds_the_words_the_frames_depend_on() {
        let sp = 0x7000_0000u64;
        let snapshot = Snapshot {
            tgid: 1,
            tid: 1,
            ip: 0x1000,
            sp,
            bp: sp + 0x100,
            kernel_stack_id: NO_STACK,
            snapshot_id: 5,
            task: 0,
            python: None,
            stack: &[],
        };
        let read = |offset: u64, value: u64| StackRead {
            addr: sp + offset,
            value: Some(value),
        };
        let reads = [
            // A loop counter saved where rbp was pushed: no read is based on it.
            read(0, 41),
            // The return address.
            read(8, 0x2000),
            // A saved frame pointer, the base of the next two reads.
            read(16, sp + 64),
            read(64, 0),
            read(72, 0x3000),
        ];
        let check = snapshot_check(&snapshot, &reads, &[0x1000, 0x2000, 0x3000]);
        let words = check.words;
        let kept: Vec<(u32, u64)> = (0..words.count as usize)
            .map(|i| (words.offsets[i], words.values[i]))
            .collect();
        assert_eq!(kept, [(8, 0x2000), (16, sp + 64), (72, 0x3000)]);
        assert_eq!(words.span, 80);
        // No read was based on the frame pointer register.
        assert_eq!(check.uses_bp, 0);
        let based_on_bp = [StackRead {
            addr: sp + 0x108,
            value: None,
        }];
        assert_eq!(snapshot_check(&snapshot, &based_on_bp, &[]).uses_bp, 1);
        // Through a signal frame: never reused.
        let through = [read(8, 0x2000), THROUGH_SIGNAL_FRAME];
        assert_eq!(snapshot_check(&snapshot, &through, &[]), NEVER_REUSE);
    }
}
