//! User stack snapshots for DWARF unwinding in user space: a thread's user registers and
//! the top of its user stack, sent through the `UNWIND_SAMPLES` ring buffer. On-CPU
//! samples send one per sample; `sched_switch` sends one where a thread blocks.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{
        BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE, pt_regs,
        task_struct,
    },
    helpers::generated::{
        bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
    },
};
use tracer_common::{UNWIND_STACK_BYTES, UnwindSample, counter, python::PythonStack};

use crate::{UNWIND_SAMPLES, count};

const PAGE_SIZE: u64 = 4096;

/// The registers of user code that unwinding needs.
#[derive(Clone, Copy)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub cs: u64,
}

/// Whether the registers are of user mode: the privilege level in the low bits of CS is 3.
#[inline(always)]
pub fn is_user(regs: &Regs) -> bool {
    regs.cs & 3 == 3
}

/// The user registers the current thread entered the kernel with (at the top of its
/// kernel stack); `None` for a kernel thread or if they cannot be read.
#[inline(always)]
pub fn saved_user_regs() -> Option<Regs> {
    // SAFETY: the helper takes no memory from us and returns the current task (trusted by
    // the verifier).
    task_user_regs(unsafe { bpf_get_current_task_btf() })
}

/// The user registers `task` last entered the kernel with; `None` for a kernel thread
/// or if they cannot be read. `task` must be a pointer the verifier trusts.
#[inline(always)]
pub fn task_user_regs(task: *mut task_struct) -> Option<Regs> {
    // SAFETY: the helper takes no memory from us and returns the task's saved registers.
    let saved = unsafe { bpf_task_pt_regs(task) } as *const pt_regs;
    // SAFETY: the helper's result is a pointer the verifier trusts (its BTF type is
    // `pt_regs`): each load is checked at load time and guarded against faults.
    let regs = unsafe {
        Regs {
            ip: core::ptr::read_volatile(core::ptr::addr_of!((*saved).rip)),
            sp: core::ptr::read_volatile(core::ptr::addr_of!((*saved).rsp)),
            bp: core::ptr::read_volatile(core::ptr::addr_of!((*saved).rbp)),
            cs: core::ptr::read_volatile(core::ptr::addr_of!((*saved).cs)),
        }
    };
    is_user(&regs).then_some(regs)
}

/// Sends the current thread's user registers and stack (with its kernel stack id and, for
/// an off-CPU snapshot, the snapshot's id; for an on-CPU sample, the runtime task it
/// runs, or 0) and its Python frames, if any; false when the ring buffer is full.
#[inline(always)]
pub fn send(
    regs: &Regs,
    tgid: u32,
    tid: u32,
    kernel_stack_id: i32,
    snapshot_id: u32,
    task: u64,
    python: Option<&PythonStack>,
) -> bool {
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
        (*sample).snapshot_id = snapshot_id;
        (*sample)._pad = 0;
        (*sample).task = task;
        let python_at = core::ptr::addr_of_mut!((*sample).python);
        match python {
            // A copy between two buffers of the kernel's: the scratch map and the ring.
            Some(python) => {
                bpf_probe_read_kernel(
                    python_at.cast::<c_void>(),
                    core::mem::size_of::<PythonStack>() as u32,
                    core::ptr::from_ref::<PythonStack>(python).cast::<c_void>(),
                );
            }
            None => {
                (*python_at).count = 0;
                (*python_at).truncated = 0;
                (*python_at).boundaries = 0;
                (*python_at).hash = 0;
                (*python_at)._pad = 0;
            }
        }
        let stack = core::ptr::addr_of_mut!((*sample).stack).cast::<u8>();
        read_user_stack(stack, regs.sp)
    };
    if stack_len == 0 {
        count(counter::UNWIND_STACK_UNREADABLE);
    }
    // SAFETY: as above.
    unsafe { (*sample).stack_len = stack_len };
    entry.submit(wakeup_flag());
    true
}

/// Whether at least `1 / parts` of the ring waits to be read.
#[inline(always)]
fn ring_filled(parts: u64) -> bool {
    let waiting = UNWIND_SAMPLES.query(u64::from(BPF_RB_AVAIL_DATA));
    let size = UNWIND_SAMPLES.query(u64::from(BPF_RB_RING_SIZE));
    waiting >= size / parts
}

/// Whether the ring is half full or more: user space is behind, as when many threads
/// block in new places at once.
#[inline(always)]
pub fn ring_half_full() -> bool {
    ring_filled(2)
}

/// User space drains the ring by period and is woken only when the ring is a quarter
/// full: a burst then cannot fill it between two drains.
#[inline(always)]
fn wakeup_flag() -> u64 {
    match ring_filled(4) {
        true => u64::from(BPF_RB_FORCE_WAKEUP),
        false => u64::from(BPF_RB_NO_WAKEUP),
    }
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
            let ret = unsafe {
                bpf_probe_read_user(dst.cast::<c_void>(), len as u32, sp as *const c_void)
            };
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
