//! `thread_regs`: a task iterator (`iter/task`) that writes the saved user registers of
//! every thread it is given ([`ThreadRegs`]), for `tracer stacks`. User space restricts
//! the iteration to one process where the kernel can (Linux 6.1) and reads the records
//! from the iterator's file.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{seq_file, task_struct},
    helpers::generated::bpf_seq_write,
};
use tracer_common::ThreadRegs;

use crate::snapshot;

/// `struct bpf_iter_meta` (include/linux/bpf.h): only `seq` is read.
#[repr(C)]
struct IterMeta {
    seq: *mut seq_file,
    session_id: u64,
    seq_num: u64,
}

/// `struct bpf_iter__task`, the context of a task iterator: `task` is null once the
/// iteration is over.
#[repr(C)]
pub struct IterTask {
    meta: *mut IterMeta,
    task: *mut task_struct,
}

#[inline(always)]
pub fn on_task(ctx: *const IterTask) {
    // SAFETY: the kernel passes its context; both loads are checked by the verifier
    // against the context's BTF type.
    let (meta, task) = unsafe {
        (
            core::ptr::read_volatile(core::ptr::addr_of!((*ctx).meta)),
            core::ptr::read_volatile(core::ptr::addr_of!((*ctx).task)),
        )
    };
    if task.is_null() {
        return;
    }
    let Some(regs) = snapshot::task_user_regs(task) else {
        return;
    };
    // The thread id as user space sees it (in the tracer's PID namespace).
    let Some(tid) = crate::targets::task_tid(task as *const u8) else {
        return;
    };
    let record = ThreadRegs {
        tid,
        _pad: 0,
        ip: regs.ip,
        sp: regs.sp,
        bp: regs.bp,
        fsbase: crate::targets::trusted_field(
            task as *const u8,
            crate::setting(&crate::TASK_FSBASE_OFFSET),
        ),
    };
    // SAFETY: `meta` is the iterator's metadata (a trusted pointer the verifier checks
    // the load against); the helper copies `record` from our stack.
    unsafe {
        let seq = core::ptr::read_volatile(core::ptr::addr_of!((*meta).seq));
        bpf_seq_write(
            seq,
            core::ptr::addr_of!(record).cast::<c_void>(),
            core::mem::size_of::<ThreadRegs>() as u32,
        );
    }
}
