//! Off-CPU time: at every `sched_switch`, the thread leaving the CPU (the current one)
//! records when and where it stopped; the thread arriving gets its blocked time added to
//! the stacks it left with.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_get_current_task,
    },
    programs::{BtfTracePointContext, tracing::StackIdContext as _},
};
use tracer_common::{NO_STACK, OffCpuKey, OffCpuStart, OffCpuTotal, counter};

use crate::{
    CLOCK_TICK_NS, MIN_BLOCK_NS, OFFCPU_STARTS, OFFCPU_TIME, STACKS, TARGET_START_TICKS,
    TARGET_TGID, TASK_GROUP_LEADER_OFFSET, TASK_PID_OFFSET, TASK_START_BOOTTIME_OFFSET, count,
    setting,
};

#[inline(always)]
pub fn on_switch(ctx: &BtfTracePointContext) {
    // sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let next: *const u8 = ctx.arg(2);
    let now = unsafe { bpf_ktime_get_ns() };
    record_switch_out(ctx, now);
    account_switch_in(next, now);
}

/// `prev` is still current here, so its ids and stacks are the current ones.
#[inline(always)]
fn record_switch_out(ctx: &BtfTracePointContext, now: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let target = setting(&TARGET_TGID);
    if tid == 0 || (target != 0 && tgid != target) {
        return;
    }
    // A dying thread never switches back in; its interval would be closed by whichever
    // thread reuses its id.
    let prev_state: u64 = ctx.arg(3);
    if prev_state as u32 & TASK_DEAD != 0 {
        return;
    }
    if target != 0 && !is_target_process() {
        return;
    }
    let user_stack_id = stack_id(ctx, BPF_F_USER_STACK as u64);
    let kernel_stack_id = stack_id(ctx, 0);
    let start = OffCpuStart {
        ts_ns: now,
        tgid,
        user_stack_id,
        kernel_stack_id,
        _pad: 0,
    };
    if OFFCPU_STARTS.insert(&tid, &start, 0).is_err() {
        count(counter::MAP_FULL);
    }
}

/// `TASK_DEAD` in `prev_state` (include/linux/sched.h).
const TASK_DEAD: u32 = 0x80;

/// Whether the current thread's process is the target that was started at
/// `TARGET_START_TICKS`, not another process that reused its PID number.
#[inline(always)]
fn is_target_process() -> bool {
    let start_ticks = setting(&TARGET_START_TICKS);
    if start_ticks == 0 {
        return true;
    }
    // SAFETY: bpf_get_current_task returns the running task; the reads below go through
    // bpf_probe_read_kernel, which validates the addresses (offsets from kernel BTF).
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let leader_field = task.wrapping_add(setting(&TASK_GROUP_LEADER_OFFSET) as usize);
    let Ok(leader) = (unsafe { bpf_probe_read_kernel(leader_field as *const *const u8) }) else {
        return false;
    };
    let start_field = leader.wrapping_add(setting(&TASK_START_BOOTTIME_OFFSET) as usize);
    let Ok(start_ns) = (unsafe { bpf_probe_read_kernel(start_field as *const u64) }) else {
        return false;
    };
    start_ns / setting(&CLOCK_TICK_NS).max(1) == start_ticks
}

#[inline(always)]
fn stack_id(ctx: &BtfTracePointContext, flags: u64) -> i32 {
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        // A kernel thread has no user stack (system-wide profiling): not an error.
        Err(NO_STACK) => NO_STACK,
        Err(err) => {
            count(counter::STACK_ERRORS);
            err
        }
    }
}

#[inline(always)]
fn account_switch_in(next: *const u8, now: u64) {
    let pid_field = next.wrapping_add(setting(&TASK_PID_OFFSET) as usize) as *const i32;
    // SAFETY: the helper validates the kernel address; `next` is the task_struct the
    // tracepoint passed and the offset comes from the running kernel's BTF.
    let Ok(next_tid) = (unsafe { bpf_probe_read_kernel(pid_field) }) else {
        return;
    };
    let next_tid = next_tid as u32;
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { OFFCPU_STARTS.get(&next_tid) }).copied() else {
        return;
    };
    let _ = OFFCPU_STARTS.remove(&next_tid);
    let blocked = now.saturating_sub(start.ts_ns);
    if blocked < setting(&MIN_BLOCK_NS) {
        return;
    }
    let key = OffCpuKey {
        tgid: start.tgid,
        tid: next_tid,
        user_stack_id: start.user_stack_id,
        kernel_stack_id: start.kernel_stack_id,
    };
    match OFFCPU_TIME.get_ptr_mut(&key) {
        Some(total) => {
            // SAFETY: map value pointer valid during the program; the thread is switching
            // in on this CPU only, so no one else updates this key now.
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
