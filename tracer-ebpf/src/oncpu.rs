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

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
    },
    programs::{PerfEventContext, tracing::StackIdContext as _},
};
use tracer_common::{NO_STACK, OnCpuKey, UNWIND_STACK_BYTES, UnwindSample, counter};

use crate::{ONCPU_SAMPLES, STACKS, TARGET_TGID, UNWIND_SAMPLES, count, setting};

const PAGE_SIZE: u64 = 4096;

#[inline(always)]
pub fn on_sample(ctx: &PerfEventContext) {
    if let Some((tgid, tid)) = sampled_thread() {
        aggregate(ctx, tgid, tid);
    }
}

#[inline(always)]
pub fn on_sample_dwarf(ctx: &PerfEventContext) {
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
            if send_snapshot(&regs, tgid, tid, kernel_stack_id) {
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
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let target = setting(&TARGET_TGID);
    // tid 0 is the idle task: the CPU had nothing to run.
    if tid == 0 || (target != 0 && tgid != target) {
        return None;
    }
    Some((tgid, tid))
}

#[inline(always)]
fn aggregate(ctx: &PerfEventContext, tgid: u32, tid: u32) {
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

/// The registers of the interrupted code that unwinding needs.
struct Regs {
    ip: u64,
    sp: u64,
    bp: u64,
    cs: u64,
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

/// Whether the registers are of user mode: the privilege level in the low bits of CS is 3.
#[inline(always)]
fn is_user(regs: &Regs) -> bool {
    regs.cs & 3 == 3
}

/// The user registers the current thread entered the kernel with (at the top of its
/// kernel stack); `None` for a kernel thread or if they cannot be read.
#[inline(always)]
fn saved_user_regs() -> Option<Regs> {
    // SAFETY: both helpers take no memory from us; the first returns the current task
    // (trusted by the verifier), the second its saved user registers.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    // SAFETY: the helper validates the kernel addresses.
    let regs = unsafe {
        Regs {
            ip: bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rip)).ok()?,
            sp: bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rsp)).ok()?,
            bp: bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rbp)).ok()?,
            cs: bpf_probe_read_kernel(core::ptr::addr_of!((*regs).cs)).ok()?,
        }
    };
    is_user(&regs).then_some(regs)
}

/// Sends the user registers and stack of a sample (and its kernel stack id); false when
/// the ring buffer is full.
#[inline(always)]
fn send_snapshot(regs: &Regs, tgid: u32, tid: u32, kernel_stack_id: i32) -> bool {
    let Some(mut entry) = UNWIND_SAMPLES.reserve::<UnwindSample>(0) else {
        return false;
    };
    let sample = entry.as_mut_ptr();
    // SAFETY: `sample` points to the reserved record, exclusively ours until submitted;
    // fields are written through raw pointers since the record is uninitialized.
    let stack_len = unsafe {
        (*sample).tgid = tgid;
        (*sample).tid = tid;
        (*sample).ip = regs.ip;
        (*sample).sp = regs.sp;
        (*sample).bp = regs.bp;
        (*sample).kernel_stack_id = kernel_stack_id;
        let stack = core::ptr::addr_of_mut!((*sample).stack) as *mut u8;
        read_user_stack(stack, regs.sp)
    };
    if stack_len == 0 {
        count(counter::UNWIND_STACK_UNREADABLE);
    }
    // SAFETY: as above.
    unsafe { (*sample).stack_len = stack_len };
    entry.submit(0);
    true
}

/// Copies the user stack from `sp` up into `dst` (room for [`UNWIND_STACK_BYTES`]):
/// all of it if mapped, else as many whole pages as are (the stack's top is near), with
/// the partial page at `sp` first. Returns the bytes copied, 0 if none could be.
///
/// # Safety
/// `dst` must be valid for writing [`UNWIND_STACK_BYTES`] bytes.
#[inline(always)]
unsafe fn read_user_stack(dst: *mut u8, sp: u64) -> u32 {
    const PAGES: u64 = UNWIND_STACK_BYTES as u64 / PAGE_SIZE;
    // 1..=PAGE_SIZE: the rest of the page `sp` is in.
    let first = PAGE_SIZE - (sp & (PAGE_SIZE - 1));
    let mut extra = PAGES - 1;
    loop {
        let len = first + extra * PAGE_SIZE;
        if len <= UNWIND_STACK_BYTES as u64 {
            // SAFETY: `dst` has room for UNWIND_STACK_BYTES >= len bytes; the helper
            // checks the user address and fails on a fault instead of reading it.
            let ret =
                unsafe { bpf_probe_read_user(dst as *mut c_void, len as u32, sp as *const c_void) };
            if ret == 0 {
                return len as u32;
            }
        }
        if extra == 0 {
            return 0;
        }
        extra -= 1;
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
