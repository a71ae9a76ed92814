//! Off-CPU time: at every `sched_switch`, the thread leaving the CPU (the current one)
//! records when and where it stopped; the thread arriving gets its blocked time added to
//! the stacks it left with.
//!
//! With DWARF unwinding (`sched_switch_dwarf`) the user stack where a thread blocks is a
//! snapshot (registers and stack bytes, see `snapshot`) unwound in user space, and its
//! snapshot id stands for the user stack id. Copying 16 KiB at every switch would cost
//! more than the switch, so a thread that blocks again with the same instruction and
//! stack pointers as its last snapshot reuses that snapshot's id, once user space has
//! unwound it and said which stack words the unwinding read (`SNAPSHOT_CHECKS`), and if
//! those words are unchanged: unwinding again would give the same frames.
//!
//! A thread's switch back in has been seen to go unaccounted, rarely, under load (its
//! start still open when it later ran and exited). Such a start is closed at the thread's
//! next switch out, or its death: it has been on the CPU ever since it came back, for as
//! long as its CPU time grew since it left, so it came back that long before now. These
//! are counted (`SWITCH_INS_MISSED`).

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
    },
    programs::BtfTracePointContext,
};
use aya_log_ebpf::debug;
use tracer_common::{
    EXEC_NS_UNKNOWN, FIRST_SNAPSHOT_ID, LastSnapshot, MAX_SNAPSHOT_CHECKS, NO_STACK, OffCpuKey,
    OffCpuStart, OffCpuTotal, counter, offcpu_state, target_filter,
};

use crate::{
    MIN_BLOCK_NS, OFFCPU_SNAPSHOTS, OFFCPU_STARTS, OFFCPU_TIME, SNAPSHOT_CHECKS, SNAPSHOT_SEQ,
    TASK_EXEC_RUNTIME_OFFSET, count, setting, snapshot, stacks::stack_id, targets,
};

/// `DWARF`: the user stack is a snapshot for user space to unwind (see the module docs).
#[inline(always)]
pub fn on_switch<const DWARF: bool>(ctx: &BtfTracePointContext) {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let next: *const u8 = ctx.arg(2);
    let now = unsafe { bpf_ktime_get_ns() };
    record_switch_out::<DWARF>(ctx, now);
    account_switch_in(next, now);
}

/// `prev` is still current here, so its ids and stacks are the current ones.
#[inline(always)]
fn record_switch_out<const DWARF: bool>(ctx: &BtfTracePointContext, now: u64) {
    let Some((tgid, tid)) = targets::current_ids() else {
        return;
    };
    if tid == 0 || !targets::is_traced(tgid, target_filter::SCHED) {
        return;
    }
    let prev: *const u8 = ctx.arg(1);
    let exec_ns = cpu_time(prev);
    // A dying thread never switches back in; its interval would be closed by whichever
    // thread reuses its id. One still open lost its switch in.
    let prev_state: u64 = ctx.arg(3);
    if prev_state as u32 & TASK_DEAD != 0 {
        // SAFETY: the value is copied out before the entry is removed.
        if let Some(open) = unsafe { OFFCPU_STARTS.get(&tid) }.copied() {
            let _ = OFFCPU_STARTS.remove(&tid);
            close_missed(tid, &open, now, exec_ns);
        }
        return;
    }
    let user_stack_id = if DWARF {
        user_snapshot(ctx, tgid, tid)
    } else {
        stack_id(ctx, BPF_F_USER_STACK as u64)
    };
    let kernel_stack_id = stack_id(ctx, 0);
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
        kernel_stack_id,
        state,
    };
    let inserted = match OFFCPU_STARTS.insert(&tid, &start, BPF_NOEXIST) {
        Err(EEXIST) => {
            // SAFETY: the value is copied out before the entry is replaced.
            let open = unsafe { OFFCPU_STARTS.get(&tid) }.copied();
            let replaced = OFFCPU_STARTS.insert(&tid, &start, 0);
            // Closed only once replaced: a start left in place is closed by the next
            // switch in, and must not be counted twice.
            if let (Ok(()), Some(open)) = (replaced, open) {
                close_missed(tid, &open, now, exec_ns);
            }
            replaced
        }
        other => other,
    };
    if inserted.is_err() {
        count(counter::MAP_FULL);
        debug!(ctx, "OFFCPU_STARTS is full: thread {} blocks unseen", tid);
    }
}

/// The CPU time of `task` so far (ns); [`EXEC_NS_UNKNOWN`] if unreadable.
#[inline(always)]
fn cpu_time(task: *const u8) -> u64 {
    let field = task.wrapping_add(setting(&TASK_EXEC_RUNTIME_OFFSET) as usize) as *const u64;
    // SAFETY: bpf_probe_read_kernel validates the address.
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or(EXEC_NS_UNKNOWN)
}

/// Accounts `open`, a start of thread `tid` whose switch back in went unseen: the thread
/// has run since it came back, for the CPU time it gained, so it came back that long
/// before `now` (a little less long, as that CPU time leaves out interrupts and steal: the
/// interval may come out a little long). A start user space marked (the thread maybe
/// never blocked) is dropped.
#[inline(always)]
fn close_missed(tid: u32, open: &OffCpuStart, now: u64, exec_ns: u64) {
    if open.exec_ns == EXEC_NS_UNKNOWN || exec_ns == EXEC_NS_UNKNOWN {
        return;
    }
    count(counter::SWITCH_INS_MISSED);
    let ran_ns = exec_ns.saturating_sub(open.exec_ns);
    add_interval(tid, open, now.saturating_sub(ran_ns));
}

/// The id of a snapshot of the current thread's user stack: the last one sent if the
/// thread blocks where it blocked then, else a new one. Falls back to the frame-pointer
/// stack id (counted) when there are no user registers or no room in the ring buffer.
#[inline(always)]
fn user_snapshot(ctx: &BtfTracePointContext, tgid: u32, tid: u32) -> i32 {
    let Some(regs) = snapshot::saved_user_regs() else {
        let fp_stack_id = stack_id(ctx, BPF_F_USER_STACK as u64);
        // A kernel thread has no user stack either way.
        if fp_stack_id != NO_STACK {
            count(counter::UNWIND_NO_USER_REGS);
        }
        return fp_stack_id;
    };
    // SAFETY: the value is copied out at once.
    if let Some(last) = unsafe { OFFCPU_SNAPSHOTS.get(&tid) }.copied()
        && last.ip == regs.ip
        && last.sp == regs.sp
        && still_valid(last.snapshot_id, regs.sp)
    {
        return last.snapshot_id;
    }
    let snapshot_id = next_snapshot_id();
    if !snapshot::send(&regs, tgid, tid, NO_STACK, snapshot_id as u32) {
        count(counter::UNWIND_RING_FULL);
        return stack_id(ctx, BPF_F_USER_STACK as u64);
    }
    let last = LastSnapshot {
        ip: regs.ip,
        sp: regs.sp,
        snapshot_id,
        _pad: 0,
    };
    // LRU: a full map evicts another thread's entry, which then only sends a new snapshot.
    let _ = OFFCPU_SNAPSHOTS.insert(&tid, &last, 0);
    snapshot_id
}

/// Whether snapshot `snapshot_id` still describes the current thread's stack at `sp`:
/// user space has unwound it, and every stack word that unwinding read is unchanged.
#[inline(always)]
fn still_valid(snapshot_id: i32, sp: u64) -> bool {
    // SAFETY: map value pointer valid during the program; user space only replaces it.
    let Some(check) = (unsafe { SNAPSHOT_CHECKS.get(&snapshot_id) }) else {
        return false;
    };
    let count = check.count as usize;
    for i in 0..MAX_SNAPSHOT_CHECKS {
        if i >= count {
            break;
        }
        let addr = sp.wrapping_add(check.offsets[i] as u64) as *const u64;
        // SAFETY: the helper checks the user address and fails on a fault.
        match unsafe { bpf_probe_read_user(addr) } {
            Ok(value) if value == check.values[i] => {}
            _ => return false,
        }
    }
    true
}

/// A snapshot id no other CPU gives out: this CPU's sequence number, with the CPU number
/// in the low bits, from [`FIRST_SNAPSHOT_ID`]. Ids repeat after 2^22 snapshots on one
/// CPU (64 GiB of stack copies).
#[inline(always)]
pub(crate) fn next_snapshot_id() -> i32 {
    const CPU_BITS: u32 = 8;
    const SEQ_MASK: u32 = (1 << (30 - CPU_BITS)) - 1;
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

#[inline(always)]
fn account_switch_in(next: *const u8, now: u64) {
    let Some(next_tid) = targets::task_tid(next) else {
        return;
    };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { OFFCPU_STARTS.get(&next_tid) }).copied() else {
        return;
    };
    // A start that stays (its removal failed) is closed at the thread's next switch out,
    // as one whose switch in went unseen: accounting it now too would count it twice.
    if OFFCPU_STARTS.remove(&next_tid).is_ok() {
        add_interval(next_tid, &start, now);
    }
}

/// Adds thread `tid`'s time off CPU from `start` to `end` to its stacks' total.
#[inline(always)]
fn add_interval(tid: u32, start: &OffCpuStart, end: u64) {
    let blocked = end.saturating_sub(start.ts_ns);
    if blocked < setting(&MIN_BLOCK_NS) {
        return;
    }
    let key = OffCpuKey {
        tgid: start.tgid,
        tid,
        user_stack_id: start.user_stack_id,
        kernel_stack_id: start.kernel_stack_id,
        state: start.state,
    };
    match OFFCPU_TIME.get_ptr_mut(&key) {
        Some(total) => {
            // SAFETY: map value pointer valid during the program; the thread is switching
            // on this CPU only, so no one else updates this key now.
            unsafe {
                (*total).total_ns += blocked;
                (*total).count += 1;
            }
        }
        None => {
            let total = OffCpuTotal {
                total_ns: blocked,
                count: 1,
            };
            if OFFCPU_TIME.insert(&key, &total, 0).is_err() {
                count(counter::MAP_FULL);
            }
        }
    }
}

/// `BPF_NOEXIST`: insert only if the key is absent, else fail with `EEXIST` (as a
/// negative errno).
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = -17;
