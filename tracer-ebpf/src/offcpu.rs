//! Off-CPU time: at every `sched_switch`, the thread leaving the CPU (the current one)
//! records when it stopped and its user stack; the thread arriving gets its blocked time
//! added to that stack and to its kernel stack, taken then (`bpf_get_task_stack`: where
//! it blocked is still on it) when the interval is known to be worth it: always for one
//! of [`KERNEL_STACK_ALWAYS_NS`] or more, else with a probability proportional to its
//! length (see there). Walking the kernel stack at every switch out costs as much as the
//! rest of the program together.
//!
//! The user stack must be taken at the switch out (only the current thread's can be), but
//! is walked only when the thread blocks somewhere new: with frame pointers, a thread
//! blocking again with the same registers and the same frame chain words (checked in one
//! read of the stack) reuses the stack id it had there (`LAST_USER_STACKS`, by thread,
//! instruction and stack pointer).
//!
//! With DWARF unwinding (`sched_switch_dwarf`) the user stack where a thread blocks is a
//! snapshot (registers and stack bytes, see `snapshot`) unwound in user space, and its
//! snapshot id stands for the user stack id. Copying 16 KiB at every switch would cost
//! more than the switch, so a thread that blocks again with the same instruction and
//! stack pointers as its last snapshot reuses that snapshot's id, once user space has
//! unwound it and said which stack words the unwinding read (`SNAPSHOT_CHECKS`), and if
//! those words are unchanged: unwinding again would give the same frames.
//!
//! With task probes attached (`TASKS_TRACED`), an interval of a thread that was running
//! a runtime task when it left the CPU (its `THREAD_TASKS` entry then, kept in the
//! interval's start) is added under that task too (`TASK_WALL`).
//!
//! A thread's switch back in has been seen to go unaccounted, rarely, under load (its
//! start still open when it later ran and exited). Such a start is closed at the thread's
//! next switch out, or its death: it has been on the CPU ever since it came back, for as
//! long as its CPU time grew since it left, so it came back that long before now. These
//! are counted (`SWITCH_INS_MISSED`).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, task_struct},
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::{bpf_get_prandom_u32, bpf_get_task_stack},
    },
    maps::HashMap,
    programs::BtfTracePointContext,
};
use aya_log_ebpf::debug;
use tracer_common::{
    BlockPlace, EXEC_NS_UNKNOWN, FINISHED_IN_RUN, FIRST_SNAPSHOT_ID, FIRST_SWITCH_IN_STACK_ID,
    KERNEL_STACK_ALWAYS_NS, KERNEL_STACK_AT_SWITCH_IN, KERNEL_STACK_MISSED,
    KERNEL_STACK_NOT_SAMPLED, KERNEL_STACK_UNREADABLE, LastSnapshot, MAX_SNAPSHOT_CHECKS,
    MAX_STACK_DEPTH, NO_STACK, OFFCPU_START_ENDED, OffCpuKey, OffCpuStart, OffCpuTotal,
    STACK_WORDS_SPAN, SWITCH_IN_STACK_IDS, StackWords, TaskWallKey, TimelineEvent, counter,
    offcpu_state, process_metric, target_filter, task_wall, timeline_kind,
};

use crate::{
    BPF_NOEXIST, KERNEL_STACK_SCRATCH, KERNEL_STACKS, LAST_USER_STACKS, MIN_BLOCK_NS,
    OFFCPU_SNAPSHOTS, OFFCPU_STARTS, OFFCPU_TIME, SNAPSHOT_CHECKS, SNAPSHOT_SEQ,
    STACK_WORDS_SCRATCH, TASK_EXEC_RUNTIME_OFFSET, TASK_WALL, TASKS_TRACED, THREAD_TASKS,
    TIMELINE_MIN_BLOCK_NS, USER_STACK_SCRATCH, count, python, setting,
    snapshot::{self, Regs},
    stacks::stack_id,
    targets,
};

/// `DWARF`: the user stack is a snapshot for user space to unwind (see the module docs);
/// `PYTHON`: with the thread's Python frames (see [`python::current_stack`]).
#[inline(always)]
pub fn on_switch<const DWARF: bool, const PYTHON: bool>(ctx: &BtfTracePointContext) {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let next: *const u8 = ctx.arg(2);
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    record_switch_out::<DWARF, PYTHON>(ctx, now);
    account_switch_in(next, now);
}

/// `prev` is still current here, so its ids and stacks are the current ones.
#[inline(always)]
fn record_switch_out<const DWARF: bool, const PYTHON: bool>(ctx: &BtfTracePointContext, now: u64) {
    let Some((tgid, tid)) = targets::current_ids() else {
        return;
    };
    let prev: *const u8 = ctx.arg(1);
    if tid == 0 || !targets::is_traced_task(tgid, target_filter::SCHED, prev) {
        return;
    }
    let exec_ns = cpu_time(prev);
    // A dying thread never switches back in; its interval would be closed by whichever
    // thread reuses its id. One still open lost its switch in.
    let prev_state: u64 = ctx.arg(3);
    if prev_state as u32 & TASK_DEAD != 0 {
        // SAFETY: the value is copied out before the entry is removed.
        if let Some(open) = unsafe { OFFCPU_STARTS.get(&tid) }.copied() {
            let _ = OFFCPU_STARTS.remove(&tid);
            if open.ts_ns != OFFCPU_START_ENDED {
                close_missed(tid, &open, now, exec_ns);
            }
        }
        return;
    }
    if !crate::recording() {
        return;
    }
    let regs = snapshot::saved_user_regs();
    let user_stack_id = match (DWARF, regs) {
        (true, Some(regs)) => user_snapshot::<PYTHON>(ctx, &regs, tgid, tid, now),
        (false, Some(regs)) => frame_pointer_stack(ctx, &regs, tid),
        (true, None) => {
            let fp_stack_id = stack_id(ctx, u64::from(BPF_F_USER_STACK));
            // A kernel thread has no user stack either way.
            if fp_stack_id != NO_STACK {
                count(counter::UNWIND_NO_USER_REGS);
            }
            fp_stack_id
        }
        (false, None) => stack_id(ctx, u64::from(BPF_F_USER_STACK)),
    };
    // A thread switched out while still TASK_RUNNING was preempted (or yielded): it waits
    // for a CPU, not for an event.
    let state = if prev_state as u32 & TASK_STATE_MASK == TASK_RUNNING {
        offcpu_state::RUNNABLE
    } else {
        offcpu_state::BLOCKED
    };
    let start = OffCpuStart {
        ts_ns: now,
        exec_ns,
        tgid,
        user_stack_id,
        kernel_stack_id: KERNEL_STACK_AT_SWITCH_IN,
        state,
        task: running_task(tid),
    };
    // The thread's entry, overwritten in place (see `OFFCPU_START_ENDED`); only a thread's
    // first switch out inserts one.
    if let Some(slot) = OFFCPU_STARTS.get_ptr_mut(&tid) {
        // SAFETY: only this thread's switches touch its entry, and it is on this CPU.
        let open = unsafe { *slot };
        // SAFETY: as above.
        unsafe { *slot = start };
        if open.ts_ns != OFFCPU_START_ENDED {
            close_missed(tid, &open, now, exec_ns);
        }
        return;
    }
    if OFFCPU_STARTS.insert(&tid, &start, BPF_NOEXIST).is_err() {
        count(counter::MAP_FULL);
        debug!(ctx, "OFFCPU_STARTS is full: thread {} blocks unseen", tid);
    }
}

/// The CPU time of `task` (a pointer the verifier trusts) so far, in ns.
#[inline(always)]
fn cpu_time(task: *const u8) -> u64 {
    targets::trusted_field(task, setting(&TASK_EXEC_RUNTIME_OFFSET))
}

/// Accounts `open`, a start of thread `tid` whose switch back in went unseen: the thread
/// has run since it came back, for the CPU time it gained, so it came back that long
/// before `now` (a little less long, as that CPU time leaves out interrupts and steal: the
/// interval may come out a little long). Where it blocked in the kernel is no longer on
/// its stack: the interval goes under its user stack and [`KERNEL_STACK_MISSED`]. A start
/// user space marked (the thread maybe never blocked) is dropped.
#[inline(always)]
fn close_missed(tid: u32, open: &OffCpuStart, now: u64, exec_ns: u64) {
    if open.exec_ns == EXEC_NS_UNKNOWN || exec_ns == EXEC_NS_UNKNOWN {
        return;
    }
    count(counter::SWITCH_INS_MISSED);
    let ran_ns = exec_ns.saturating_sub(open.exec_ns);
    let blocked = now.saturating_sub(ran_ns).saturating_sub(open.ts_ns);
    if blocked < setting(&MIN_BLOCK_NS) {
        return;
    }
    let kernel_stack_id = match open.kernel_stack_id {
        KERNEL_STACK_AT_SWITCH_IN => KERNEL_STACK_MISSED,
        id => id,
    };
    add_time(
        &key(tid, open, kernel_stack_id, open.state),
        blocked,
        open.task,
    );
}

/// The frame-pointer user stack id of the current thread, blocking with `regs`: its last
/// one if it blocks with the same registers and frame chain, else a new walk.
#[inline(always)]
fn frame_pointer_stack(ctx: &BtfTracePointContext, regs: &Regs, tid: u32) -> i32 {
    // SAFETY: map value pointer valid during the program; LRU eviction only frees it
    // after an RCU grace period.
    let place = BlockPlace {
        tid,
        _pad: 0,
        ip: regs.ip,
        sp: regs.sp,
    };
    // SAFETY: the value is read at once, while the program runs.
    if let Some(last) = unsafe { LAST_USER_STACKS.get(&place) }
        && last.bp == regs.bp
        && words_unchanged(&last.words, regs.sp)
    {
        return last.stack_id;
    }
    let id = stack_id(ctx, u64::from(BPF_F_USER_STACK));
    if id >= 0 {
        remember_frame_pointer_stack(regs, tid, id);
    }
    id
}

/// Notes stack `stack_id` of thread `tid` with the frame chain the kernel's walk
/// followed from `regs`: at each frame pointer, the next one and the return address
/// above it, until a frame cannot be read (where the kernel's walk stops too). A chain
/// deeper than [`MAX_SNAPSHOT_CHECKS`] words, or leaving the first
/// [`STACK_WORDS_SPAN`] bytes of the stack, is not noted: it is walked every time.
#[inline(always)]
fn remember_frame_pointer_stack(regs: &Regs, tid: u32, stack_id: i32) {
    let Some(last) = USER_STACK_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU scratch value, valid while the program runs and ours alone.
    let last = unsafe { &mut *last };
    last.ip = regs.ip;
    last.sp = regs.sp;
    last.bp = regs.bp;
    last.stack_id = stack_id;
    last.words.count = 0;
    last.words.span = 0;
    // A 32-bit task's stack is walked with 4-byte frames.
    if regs.cs != USER_CS_64 {
        return;
    }
    let mut fp = regs.bp;
    let mut ended = false;
    for i in 0..MAX_SNAPSHOT_CHECKS / 2 {
        // SAFETY: the helper checks the user address and fails on a fault.
        let Ok(frame) = (unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }) else {
            // Only where no page can ever be mapped does the walk surely stop again
            // (elsewhere a page not present now may be later).
            ended = fp < NEVER_MAPPED_BELOW;
            break;
        };
        let offset = fp.wrapping_sub(regs.sp);
        if !offset.is_multiple_of(8) || offset > (STACK_WORDS_SPAN - 16) as u64 {
            return;
        }
        let at = 2 * i;
        last.words.offsets[at] = offset as u32;
        last.words.values[at] = frame[0];
        last.words.offsets[at + 1] = offset as u32 + 8;
        last.words.values[at + 1] = frame[1];
        last.words.count = at as u32 + 2;
        last.words.span = last.words.span.max(offset as u32 + 16);
        fp = frame[0];
    }
    if ended {
        // LRU: a full map evicts another thread's entry, which then walks again.
        let place = BlockPlace {
            tid,
            _pad: 0,
            ip: regs.ip,
            sp: regs.sp,
        };
        let _ = LAST_USER_STACKS.insert(&place, last, 0);
    }
}

/// How long a snapshot's check is waited for (user space unwinds every 10 ms).
const CHECK_AWAITED_NS: u64 = 200_000_000;

/// `__USER_CS`: the code segment of 64-bit user code.
const USER_CS_64: u64 = 0x33;

/// Addresses below this are never mapped (the default `vm.mmap_min_addr`).
const NEVER_MAPPED_BELOW: u64 = 65536;

/// Whether the current thread's user stack at `sp` still holds `words`: read in one go
/// when they lie in the first [`STACK_WORDS_SPAN`] bytes, word by word beyond.
#[inline(always)]
fn words_unchanged(words: &StackWords, sp: u64) -> bool {
    let count = words.count as usize;
    if count == 0 {
        return true;
    }
    // More than can be checked: user space's mark of a stack never to reuse.
    if count > MAX_SNAPSHOT_CHECKS {
        return false;
    }
    let span = words.span;
    if span == 0 || span as usize > STACK_WORDS_SPAN {
        return words_unchanged_one_by_one(words, sp);
    }
    let Some(stack) = STACK_WORDS_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // The size again, masked so that the verifier sees it bounded (a volatile load the
    // compiler cannot tie to the check above, so it keeps the mask): 1..=STACK_WORDS_SPAN,
    // `span` itself.
    // SAFETY: `words` is a valid reference.
    let len = (unsafe { core::ptr::read_volatile(&raw const words.span) }.wrapping_sub(1)
        & (STACK_WORDS_SPAN as u32 - 1))
        + 1;
    // SAFETY: the scratch value has room for STACK_WORDS_SPAN >= len bytes; the helper
    // checks the user address and fails on a fault.
    let failed = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            stack.cast::<c_void>(),
            len,
            sp as *const c_void,
        )
    } != 0;
    if failed {
        return false;
    }
    for i in 0..MAX_SNAPSHOT_CHECKS {
        if i >= count {
            break;
        }
        // SAFETY: `words` is a valid reference. Volatile, so that the compiler keeps the
        // mask the verifier needs to see the index bounded.
        let offset = unsafe { core::ptr::read_volatile(&raw const words.offsets[i]) };
        if offset % 8 != 0 || offset >= span {
            return false;
        }
        let at = (offset / 8) as usize & (STACK_WORDS_SPAN / 8 - 1);
        // SAFETY: `at` is within the scratch array, read above.
        if unsafe { (*stack)[at] } != words.values[i] {
            return false;
        }
    }
    true
}

#[inline(always)]
fn words_unchanged_one_by_one(words: &StackWords, sp: u64) -> bool {
    let count = words.count as usize;
    for i in 0..MAX_SNAPSHOT_CHECKS {
        if i >= count {
            break;
        }
        let addr = sp.wrapping_add(u64::from(words.offsets[i])) as *const u64;
        // SAFETY: the helper checks the user address and fails on a fault.
        match unsafe { bpf_probe_read_user(addr) } {
            Ok(value) if value == words.values[i] => {}
            _ => return false,
        }
    }
    true
}

/// The id of a snapshot of the current thread's user stack: the last one sent if the
/// thread blocks where it blocked then, else a new one. Falls back to the frame-pointer
/// stack id (counted) when there is no room in the ring buffer.
#[inline(always)]
fn user_snapshot<const PYTHON: bool>(
    ctx: &BtfTracePointContext,
    regs: &Regs,
    tgid: u32,
    tid: u32,
    now: u64,
) -> i32 {
    // A Python thread blocks at the same native place under many Python stacks. Walked
    // first, before anything else is looked up: the verifier walks its loop once for
    // each different state it is reached in.
    let python = python::current_stack::<PYTHON>(tgid, tid, now);
    let python_hash = python.map_or(0, |p| p.hash);
    let place = BlockPlace {
        tid,
        _pad: 0,
        ip: regs.ip,
        sp: regs.sp,
    };
    // SAFETY: the value is copied out at once.
    let last = unsafe { OFFCPU_SNAPSHOTS.get(&place) }.copied();
    // Its check, once user space has unwound it.
    // SAFETY: map value pointer valid during the program; user space only replaces it.
    let check = last.and_then(|last| unsafe { SNAPSHOT_CHECKS.get(&last.snapshot_id) });
    // The key holds the instruction and stack pointers: only the rest is compared.
    if let (Some(last), Some(check)) = (last, check)
        && (check.uses_bp == 0 || last.bp == regs.bp)
        && last.python_hash == python_hash
        && words_unchanged(&check.words, regs.sp)
    {
        return last.snapshot_id;
    }
    // A burst of threads blocking in new places fills the ring faster than user space
    // unwinds it. Then a thread blocking again exactly where its snapshot waits to be
    // unwound reuses it unchecked: the same frames, most likely, where a full ring would
    // leave only a frame-pointer walk.
    if let Some(last) = last
        && check.is_none()
        && last.bp == regs.bp
        && last.python_hash == python_hash
        && now.saturating_sub(last.sent_ns) < CHECK_AWAITED_NS
        && snapshot::ring_half_full()
    {
        count(counter::SNAPSHOTS_REUSED_UNCHECKED);
        return last.snapshot_id;
    }
    let snapshot_id = next_snapshot_id();
    if !snapshot::send(regs, tgid, tid, NO_STACK, snapshot_id as u32, 0, python) {
        count(counter::UNWIND_RING_FULL);
        return stack_id(ctx, u64::from(BPF_F_USER_STACK));
    }
    // A snapshot of this place still waiting for its check stays the one to compare
    // with: replaced at every block, the place would never have a checked one while the
    // thread blocks there faster than user space unwinds. (Not for ever: its check may
    // have been evicted.)
    if let Some(last) = last
        && check.is_none()
        && now.saturating_sub(last.sent_ns) < CHECK_AWAITED_NS
    {
        return snapshot_id;
    }
    let last = LastSnapshot {
        ip: regs.ip,
        sp: regs.sp,
        bp: regs.bp,
        sent_ns: now,
        snapshot_id,
        _pad: 0,
        python_hash,
    };
    // LRU: a full map evicts another entry, whose thread then only sends a new snapshot.
    let _ = OFFCPU_SNAPSHOTS.insert(&place, &last, 0);
    snapshot_id
}

/// A snapshot id no other CPU gives out: this CPU's sequence number, with the CPU number
/// in the low bits, from [`FIRST_SNAPSHOT_ID`]. Ids repeat after 2^22 snapshots on one
/// CPU (64 GiB of stack copies).
#[inline(always)]
pub(crate) fn next_snapshot_id() -> i32 {
    const CPU_BITS: u32 = 8;
    const SEQ_MASK: u32 = (1 << (30 - CPU_BITS)) - 1;
    // SAFETY: the helper has no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() } & ((1 << CPU_BITS) - 1);
    let seq = match SNAPSHOT_SEQ.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, valid while the program runs; no other writer on this CPU.
        Some(seq) => unsafe {
            *seq = seq.read().wrapping_add(1);
            *seq
        },
        None => 0,
    };
    FIRST_SNAPSHOT_ID | (((seq & SEQ_MASK) << CPU_BITS) | cpu) as i32
}

/// `TASK_DEAD` in `prev_state` (include/linux/sched.h).
const TASK_DEAD: u32 = 0x80;
/// `TASK_RUNNING`, and the bits of `prev_state` that say how a task sleeps
/// (`TASK_REPORT` in include/linux/sched.h: interruptible, uninterruptible, stopped,
/// traced, dead, zombie, parked).
const TASK_RUNNING: u32 = 0;
const TASK_STATE_MASK: u32 = 0xff;

/// `next` is about to run: its interval ends, and where it blocked in the kernel is still
/// on its stack.
#[inline(always)]
fn account_switch_in(next: *const u8, now: u64) {
    let Some(next_tid) = targets::task_tid(next) else {
        return;
    };
    let Some(slot) = OFFCPU_STARTS.get_ptr_mut(&next_tid) else {
        return;
    };
    // SAFETY: only this thread's switches touch its entry, and it is not running yet.
    let start = unsafe { *slot };
    if start.ts_ns == OFFCPU_START_ENDED {
        return;
    }
    // SAFETY: as above.
    unsafe { (*slot).ts_ns = OFFCPU_START_ENDED };
    let blocked = now.saturating_sub(start.ts_ns);
    if blocked < setting(&MIN_BLOCK_NS) {
        return;
    }
    if blocked >= setting(&TIMELINE_MIN_BLOCK_NS) {
        crate::timeline(&TimelineEvent {
            start_ns: start.ts_ns,
            end_ns: now,
            task: 0,
            tgid: start.tgid,
            tid: next_tid,
            kind: timeline_kind::OFF_CPU,
            detail: start.state,
        });
    }
    if start.kernel_stack_id != KERNEL_STACK_AT_SWITCH_IN {
        // Marked by user space with the stacks /proc showed (before any task probe).
        add_time(
            &key(next_tid, &start, start.kernel_stack_id, start.state),
            blocked,
            0,
        );
        return;
    }
    let task = start.task;
    let always = blocked >= KERNEL_STACK_ALWAYS_NS;
    // A shorter interval: with probability blocked / KERNEL_STACK_ALWAYS_NS.
    // SAFETY: the helper has no preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    let take = always || (u64::from(random) * KERNEL_STACK_ALWAYS_NS) >> 32 < blocked;
    let kernel_stack_id = if take {
        switch_in_kernel_stack(next)
    } else {
        KERNEL_STACK_NOT_SAMPLED
    };
    if always {
        add_time(
            &key(next_tid, &start, kernel_stack_id, start.state),
            blocked,
            task,
        );
        return;
    }
    add_time(
        &key(next_tid, &start, KERNEL_STACK_NOT_SAMPLED, start.state),
        blocked,
        task,
    );
    if take {
        let state = start.state | offcpu_state::SAMPLED;
        add_time(
            &key(next_tid, &start, kernel_stack_id, state),
            KERNEL_STACK_ALWAYS_NS,
            task,
        );
    }
}

#[inline(always)]
fn key(tid: u32, start: &OffCpuStart, kernel_stack_id: i32, state: u32) -> OffCpuKey {
    OffCpuKey {
        tgid: start.tgid,
        tid,
        user_stack_id: start.user_stack_id,
        kernel_stack_id,
        state,
    }
}

/// The runtime task thread `tid` runs, 0 for none (or when no task probe is attached).
#[inline(always)]
pub fn running_task(tid: u32) -> u64 {
    if setting(&TASKS_TRACED) == 0 {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    match unsafe { THREAD_TASKS.get(&tid) }.copied() {
        Some(task) if task & FINISHED_IN_RUN == 0 => task,
        _ => 0,
    }
}

/// Adds `ns` and one interval to `key`'s total, and to `task`'s unless 0.
#[inline(always)]
fn add_time(key: &OffCpuKey, ns: u64, task: u64) {
    if task != 0 {
        add_task_time(
            &TaskWallKey {
                task,
                key: *key,
                kind: task_wall::OFF_CPU,
            },
            ns,
        );
    }
    add_total(&OFFCPU_TIME, key, ns);
    crate::add_process_metric(key.tgid, process_metric::OFFCPU_NS, key.state, ns);
}

/// Adds `ns` and one interval (or sample) to a task's `TASK_WALL` entry.
#[inline(always)]
pub fn add_task_time(key: &TaskWallKey, ns: u64) {
    add_total(&TASK_WALL, key, ns);
}

/// Adds `ns` and one interval to `key`'s total in `map` (counted when the map is full).
#[inline(always)]
fn add_total<K>(map: &HashMap<K, OffCpuTotal>, key: &K, ns: u64) {
    match map.get_ptr_mut(key) {
        // SAFETY: map value pointer valid during the program; the key's thread is
        // switching (or sampled) on this CPU, so no one else updates it now.
        Some(total) => unsafe {
            (*total).total_ns += ns;
            (*total).count += 1;
        },
        None => {
            let total = OffCpuTotal {
                total_ns: ns,
                count: 1,
            };
            if map.insert(key, &total, 0).is_err() {
                count(counter::MAP_FULL);
            }
        }
    }
}

/// The id in `KERNEL_STACKS` of the kernel stack `task` (not running) blocked in, an
/// error (negative) if it cannot be taken or stored.
#[inline(always)]
fn switch_in_kernel_stack(task: *const u8) -> i32 {
    let Some(stack) = KERNEL_STACK_SCRATCH.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: per-CPU scratch value, valid while the program runs and ours alone; `task`
    // is the tracepoint's trusted `next`.
    let stack = unsafe { &mut *stack };
    // SAFETY: `stack` has room for the size passed; the helper checks `task`.
    let bytes = unsafe {
        bpf_get_task_stack(
            task as *mut task_struct,
            stack.ips.as_mut_ptr().cast::<c_void>(),
            (MAX_STACK_DEPTH * 8) as u32,
            0,
        )
    };
    // A thread about to run has a kernel stack: no frames, or -EFAULT (which would read
    // as NO_STACK), mean the kernel could not walk it.
    if bytes == 0 || bytes == i64::from(NO_STACK) {
        count(counter::STACK_ERRORS);
        return KERNEL_STACK_UNREADABLE;
    }
    if bytes < 0 {
        count(counter::STACK_ERRORS);
        return bytes as i32;
    }
    stack.len = (bytes as usize / 8).min(MAX_STACK_DEPTH) as u32;
    // FNV-1a over every slot: the helper zeroes those past the stack, and a loop of a
    // fixed count is quick to verify. Stacks of the same length and 64-bit hash are taken
    // to be the same, as the kernel's stack map does with BPF_F_FAST_STACK_CMP.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for i in 0..MAX_STACK_DEPTH {
        hash = (hash ^ stack.ips[i]).wrapping_mul(0x0100_0000_01b3);
    }
    stack.hash = hash;
    let slot = (hash ^ (hash >> 32)) as u32;
    for attempt in 0..4u32 {
        let id = FIRST_SWITCH_IN_STACK_ID
            + (slot.wrapping_add(attempt) & (SWITCH_IN_STACK_IDS - 1)) as i32;
        // SAFETY: map value pointer valid during the program; entries are never changed.
        match unsafe { KERNEL_STACKS.get(&id) } {
            Some(known) => {
                if known.hash == stack.hash && known.len == stack.len {
                    return id;
                }
            }
            None => match KERNEL_STACKS.insert(&id, stack, BPF_NOEXIST) {
                Ok(()) => return id,
                // Another CPU took the id meanwhile: look at the next one.
                Err(EEXIST) => {}
                // Full: a stack not captured, as when the stack map is.
                Err(err) => {
                    count(counter::STACK_ERRORS);
                    return err;
                }
            },
        }
    }
    count(counter::STACK_ERRORS);
    EEXIST
}

/// The error of a `BPF_NOEXIST` insert whose key is there (a negative errno).
const EEXIST: i32 = -17;
