//! On-CPU sampling: a CPU_CLOCK perf event fires on every CPU at the profiling frequency;
//! whatever thread of the target is running there gets one sample added to the stacks it
//! was running (user and kernel).
//!
//! With DWARF unwinding (`oncpu_sample_dwarf`), the user stack is not walked here: the
//! thread's user registers (those interrupted, or for a sample in kernel mode those it
//! entered the kernel with) and the top of its user stack are sent to user space, which
//! unwinds them with the binaries' `.eh_frame`; the kernel stack, if any, goes along as a
//! stack id. Samples without user registers (kernel threads) and samples the ring buffer
//! has no room for are aggregated as above, with frame pointers, and counted.

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, pt_regs},
    programs::PerfEventContext,
};
use aya_log_ebpf::debug;
use tracer_common::{NO_STACK, OnCpuKey, TaskWallKey, counter, target_filter, task_wall};

use crate::{
    ONCPU_SAMPLES, count, offcpu, python,
    snapshot::{self, Regs, is_user, saved_user_regs},
    stacks::stack_id,
    targets,
};

#[inline(always)]
pub fn on_sample(ctx: &PerfEventContext) {
    if let Some((tgid, tid)) = sampled_thread() {
        aggregate(ctx, tgid, tid);
    }
}

/// `PYTHON`: Python frames are walked (see [`python::current_stack`]).
#[inline(always)]
pub fn on_sample_dwarf<const PYTHON: bool>(ctx: &PerfEventContext) {
    let Some((tgid, tid)) = sampled_thread() else {
        return;
    };
    let interrupted = interrupted_regs(ctx);
    let (user, kernel_stack_id) = if is_user(&interrupted) {
        (Some(interrupted), NO_STACK)
    } else {
        (saved_user_regs(), stack_id(ctx, 0))
    };
    match user {
        Some(regs) => {
            let task = offcpu::running_task(tid);
            // SAFETY: the helper reads the clock only.
            let now = unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() };
            let python = python::current_stack::<PYTHON>(tgid, tid, now);
            if snapshot::send(&regs, tgid, tid, kernel_stack_id, 0, task, python) {
                return;
            }
            count(counter::UNWIND_RING_FULL);
        }
        None => count(counter::UNWIND_NO_USER_REGS),
    }
    aggregate(ctx, tgid, tid);
}

/// The (tgid, tid) of the thread to sample, or `None` when the CPU runs nothing of the
/// target.
#[inline(always)]
fn sampled_thread() -> Option<(u32, u32)> {
    if !crate::recording() {
        return None;
    }
    let (tgid, tid) = targets::current_ids()?;
    // tid 0 is the idle task: the CPU had nothing to run.
    if tid == 0 || !targets::is_traced(tgid, target_filter::SCHED) {
        return None;
    }
    Some((tgid, tid))
}

#[inline(always)]
fn aggregate(ctx: &PerfEventContext, tgid: u32, tid: u32) {
    let key = OnCpuKey {
        tgid,
        tid,
        user_stack_id: stack_id(ctx, u64::from(BPF_F_USER_STACK)),
        kernel_stack_id: stack_id(ctx, 0),
        state: 0,
    };
    let task = offcpu::running_task(tid);
    if task != 0 {
        let key = TaskWallKey {
            task,
            key,
            kind: task_wall::ON_CPU,
        };
        offcpu::add_task_time(&key, 0);
    }
    match ONCPU_SAMPLES.get_ptr_mut(&key) {
        Some(samples) => {
            // SAFETY: map value pointer valid during the program; the thread runs on this
            // CPU only, so no one else updates this key now.
            unsafe { *samples += 1 };
        }
        None => {
            if ONCPU_SAMPLES.insert(&key, &1, 0).is_err() {
                count(counter::MAP_FULL);
                debug!(
                    ctx,
                    "ONCPU_SAMPLES is full: a sample of thread {} is lost", tid
                );
            }
        }
    }
}

/// The registers the perf event interrupted (user registers when it hit user mode).
#[inline(always)]
fn interrupted_regs(ctx: &PerfEventContext) -> Regs {
    // SAFETY: `ctx.ctx` is the program's `bpf_perf_event_data` context, valid for the
    // whole program; the verifier allows 8-byte reads of its `regs`.
    let regs: *const pt_regs = unsafe { core::ptr::addr_of!((*ctx.ctx).regs) };
    // SAFETY: as above.
    unsafe {
        Regs {
            ip: (*regs).rip,
            sp: (*regs).rsp,
            bp: (*regs).rbp,
            cs: (*regs).cs,
        }
    }
}
