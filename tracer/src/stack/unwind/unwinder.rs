//! [`DwarfUnwinder`]: unwinding snapshots with framehop, through signal frames, and
//! counting the stacks they give. The unwinders of the processes unwound last are kept.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Module, Unwinder as _};
use std::cell::RefCell;
use tracer_common::{MAX_STACK_DEPTH, SnapshotCheck, StackId, StackKey, stack_id::UNWOUND_IDS};

use super::check::{NEVER_REUSE, StackRead, THROUGH_SIGNAL_FRAME, snapshot_check};
use super::snapshot::Snapshot;
use super::stacks::{
    StackMerger, UnwindEnd, UnwindStats, UnwoundStack, UnwoundStacks, truncated_token,
};
use super::tables::{ObjectTables, ProcessUnwinder};
use crate::stack::symbolize::ProcessMaps;

/// Processes whose unwinders are kept at most. A service that starts thousands of
/// short-lived processes would otherwise keep one for each long after it exited; one
/// dropped is rebuilt from the shared tables if its process sends more snapshots.
const MAX_PROCESS_UNWINDERS: usize = 256;

/// In the kernel's `struct rt_sigframe` on x86-64, after the return address: the
/// `ucontext`, whose `uc_mcontext` (`struct sigcontext`) starts 40 bytes in and holds
/// the interrupted `rbp`, `rsp` and `rip` at 80, 120 and 128.
const SIGFRAME_RBP: u64 = 8 + 40 + 80;
const SIGFRAME_RSP: u64 = 8 + 40 + 120;
const SIGFRAME_RIP: u64 = 8 + 40 + 128;

/// How many nested signal frames one stack is unwound through.
const MAX_SIGNAL_FRAMES: usize = 4;

/// What on-CPU samples are counted by: (tgid, tid, kernel stack id, user stack, task).
pub(crate) type SampleKey = (u32, u32, StackId, UnwoundStack, u64);

/// Unwinds snapshots and counts the stacks they give.
#[derive(Default)]
pub(crate) struct DwarfUnwinder {
    /// Per (device, inode); `None` when the file's tables could not be read.
    objects: HashMap<(String, u64), Option<Arc<ObjectTables>>>,
    /// The processes unwound most recently (at most [`MAX_PROCESS_UNWINDERS`]).
    processes: HashMap<u32, ProcessUnwinder>,
    /// Stacks unwound so far: the clock of [`ProcessUnwinder::last_used`].
    unwinds: u64,
    /// On-CPU samples per (tgid, tid, kernel stack id, user stack, task).
    samples: HashMap<SampleKey, u64>,
    /// Off-CPU snapshots by id.
    snapshots: UnwoundStacks,
    pub stats: UnwindStats,
}

impl DwarfUnwinder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Unwinds one snapshot with the mappings of its process (`None` when unknown). For
    /// an off-CPU snapshot, returns what the kernel is to check before reusing it: the
    /// stack words unwinding read.
    pub(crate) fn add(
        &mut self,
        snapshot: &Snapshot<'_>,
        maps: Option<&ProcessMaps>,
        merger: Option<&mut dyn StackMerger>,
    ) -> Option<SnapshotCheck> {
        let mut reads = Vec::new();
        let mut cut_short = snapshot.python.as_ref().is_some_and(|p| p.truncated != 0);
        let native = if let Some(maps) = maps {
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
        } else {
            self.stats.no_maps += 1;
            UnwoundStack {
                addrs: vec![snapshot.ip],
                by_frame_pointer: vec![false],
            }
        };
        // The reuse check is of the native frames: the kernel compares Python frames itself.
        let native_addrs = snapshot.snapshot.map(|_| native.addrs.clone());
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
        if let Some(id) = snapshot.snapshot {
            self.stats.offcpu_snapshots += 1;
            // Without mappings nothing was read: the snapshot is not to be reused.
            let check = match (maps, &native_addrs) {
                (Some(_), Some(native)) => snapshot_check(snapshot, &reads, native),
                _ => NEVER_REUSE,
            };
            self.snapshots.insert(id, stack);
            return Some(check);
        }
        self.stats.samples += 1;
        self.stats.in_kernel += u64::from(snapshot.kernel_stack != StackId::None);
        *self
            .samples
            .entry((
                snapshot.tgid,
                snapshot.tid,
                snapshot.kernel_stack,
                stack,
                snapshot.task,
            ))
            .or_default() += 1;
        None
    }

    /// The on-CPU samples unwound since `seen` was last given here (which then holds
    /// every count so far), keyed by stack ids in [`UNWOUND_IDS`], and those stacks.
    pub(crate) fn samples_since(
        &self,
        seen: &mut HashMap<SampleKey, u64>,
    ) -> (Vec<(StackKey, u64)>, UnwoundStacks) {
        let mut oncpu = Vec::new();
        let mut stacks = UnwoundStacks::new();
        let mut ids = UNWOUND_IDS;
        for (key, &count) in &self.samples {
            let before = seen.get(key).copied().unwrap_or(0);
            if count <= before {
                continue;
            }
            let Some(id) = ids.next() else {
                break;
            };
            seen.insert(key.clone(), count);
            let (tgid, tid, kernel, stack, _) = key;
            let user = StackId::decode(id);
            let key = StackKey {
                tgid: *tgid,
                tid: *tid,
                user,
                kernel: *kernel,
                state: 0,
            };
            oncpu.push((key, count - before));
            stacks.insert(user, stack.clone());
        }
        (oncpu, stacks)
    }

    /// Takes out the on-CPU samples of processes `tgids` (as [`DwarfUnwinder::finish`]
    /// gives them) and the off-CPU snapshots `snapshot_ids`, with their stacks; their
    /// processes' unwinders go too.
    pub(crate) fn take_processes(
        &mut self,
        tgids: &HashSet<u32>,
        snapshot_ids: &HashSet<StackId>,
    ) -> UnwoundSamples {
        let mut taken = UnwoundSamples {
            oncpu: Vec::new(),
            task_oncpu: Vec::new(),
            stacks: UnwoundStacks::new(),
        };
        for id in snapshot_ids {
            if let Some(stack) = self.snapshots.remove(id) {
                taken.stacks.insert(*id, stack);
            }
        }
        let (gone, kept): (HashMap<SampleKey, u64>, HashMap<SampleKey, u64>) =
            std::mem::take(&mut self.samples)
                .into_iter()
                .partition(|(key, _)| tgids.contains(&key.0));
        self.samples = kept;
        for (id, (sample, samples)) in UNWOUND_IDS.zip(gone) {
            taken.add(id, sample, samples);
        }
        self.processes.retain(|tgid, _| !tgids.contains(tgid));
        self.drop_unused_objects();
        taken
    }

    /// Drops the unwind tables of files no process unwinder holds any more: a file no
    /// target maps now is parsed again if one maps it later.
    fn drop_unused_objects(&mut self) {
        self.objects
            .retain(|_, tables| tables.as_ref().is_none_or(|t| Arc::strong_count(t) > 1));
    }

    /// The processes with on-CPU samples here.
    pub(crate) fn sample_tgids(&self) -> impl Iterator<Item = u32> + '_ {
        self.samples.keys().map(|key| key.0)
    }

    /// The off-CPU snapshots unwound so far, by snapshot id.
    pub(crate) fn snapshots(&self) -> &UnwoundStacks {
        &self.snapshots
    }

    /// The on-CPU samples unwound so far, added by process into `by_process`.
    pub(crate) fn add_samples_by_process(
        &self,
        by_process: &mut std::collections::BTreeMap<u32, u64>,
    ) {
        for ((tgid, ..), count) in &self.samples {
            *by_process.entry(*tgid).or_default() += count;
        }
    }

    /// Unwinds one snapshot taken outside a profile (a thread's registers and stack read
    /// from /proc, see [`crate::profile::threads`]) and returns its stack and how unwinding ended,
    /// counting it nowhere: neither in [`DwarfUnwinder::stats`] nor in
    /// [`DwarfUnwinder::finish`]. The process's unwind tables are kept for its next one.
    pub(crate) fn unwind_one(
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
            let mut cache = process.cache.borrow_mut();
            let mut iter = process
                .unwinder
                .iter_frames(ip, regs, &mut cache, &mut read_stack);
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
        modules.sort_unstable_by_key(|(range, _, _)| range.start);
        ProcessUnwinder {
            unwinder,
            cache: RefCell::new(CacheX86_64::new()),
            cfi_answers: ProcessUnwinder::no_cfi_answers(),
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
            self.drop_unused_objects();
        }
    }

    /// The unwound on-CPU samples as on-CPU entries (user stack ids in [`UNWOUND_IDS`]),
    /// and every unwound stack by id: those and the off-CPU snapshots (ids from
    /// [`tracer_common::FIRST_SNAPSHOT_ID`], as the off-CPU keys carry them).
    pub(crate) fn finish(self) -> UnwoundSamples {
        let mut unwound = UnwoundSamples {
            oncpu: Vec::with_capacity(self.samples.len()),
            task_oncpu: Vec::new(),
            stacks: self.snapshots,
        };
        for (id, (sample, samples)) in UNWOUND_IDS.zip(self.samples) {
            unwound.add(id, sample, samples);
        }
        unwound
    }
}

/// What [`DwarfUnwinder::finish`] gives.
pub(crate) struct UnwoundSamples {
    /// On-CPU samples by thread and stacks.
    pub oncpu: Vec<(StackKey, u64)>,
    /// Those of threads running a runtime task: (task, key, samples).
    pub task_oncpu: Vec<(u64, StackKey, u64)>,
    /// Every unwound stack by id.
    pub stacks: UnwoundStacks,
}

impl UnwoundSamples {
    /// Adds `samples` of `sample`, its stack numbered `id` (in [`UNWOUND_IDS`]).
    fn add(&mut self, id: i32, sample: SampleKey, samples: u64) {
        let (tgid, tid, kernel, stack, task) = sample;
        let key = StackKey {
            tgid,
            tid,
            user: StackId::decode(id),
            kernel,
            state: 0,
        };
        self.oncpu.push((key, samples));
        if task != 0 {
            self.task_oncpu.push((task, key, samples));
        }
        self.stacks.insert(key.user, stack);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::UNWIND_STACK_BYTES;

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
            kernel_stack: StackId::None,
            snapshot: None,
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
                kernel_stack: StackId::None,
                snapshot: None,
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
        let read = unwinder.objects.values().flatten().count();
        assert!(read > 0);

        // Once every process is let go, no file's tables are held.
        let every: HashSet<u32> = (1..=processes).collect();
        unwinder.take_processes(&every, &HashSet::new());
        assert!(unwinder.processes.is_empty());
        assert_eq!(unwinder.objects.values().flatten().count(), 0);
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
}
