//! On-CPU sampling: a CPU_CLOCK perf event fires on every CPU at the profiling frequency;
//! whatever thread of the target is running there gets one sample added to the stacks it
//! was running (user and kernel).

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::bpf_get_current_pid_tgid,
    programs::{PerfEventContext, tracing::StackIdContext as _},
};
use tracer_common::{NO_STACK, OnCpuKey, counter};

use crate::{ONCPU_SAMPLES, STACKS, TARGET_TGID, count, setting};

#[inline(always)]
pub fn on_sample(ctx: &PerfEventContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let target = setting(&TARGET_TGID);
    // tid 0 is the idle task: the CPU had nothing to run.
    if tid == 0 || (target != 0 && tgid != target) {
        return;
    }
    let key = OnCpuKey {
        tgid,
        tid,
        user_stack_id: stack_id(ctx, BPF_F_USER_STACK as u64),
        kernel_stack_id: stack_id(ctx, 0),
    };
    match ONCPU_SAMPLES.get_ptr_mut(&key) {
        Some(samples) => {
            // SAFETY: map value pointer valid during the program; the thread runs on this
            // CPU only, so no one else updates this key now.
            unsafe { *samples += 1 };
        }
        None => {
            if ONCPU_SAMPLES.insert(&key, &1, 0).is_err() {
                count(counter::MAP_FULL);
            }
        }
    }
}

/// The stack id, [`NO_STACK`] when there is none to take (user mode has no kernel stack,
/// kernel threads no user stack), or the error, counted.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, flags: u64) -> i32 {
    match ctx.get_stackid(&STACKS, flags) {
        Ok(id) => id as i32,
        Err(NO_STACK) => NO_STACK,
        Err(err) => {
            count(counter::STACK_ERRORS);
            err
        }
    }
}
