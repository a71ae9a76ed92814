//! Which processes are traced. One process and nothing that can join it: its tgid is a
//! constant (`TARGET_TGID`). A set of processes (several PIDs, `--children`, `--exe`,
//! `--comm`, `--cgroup`): the `TARGETS` map, which user space fills with the processes
//! found at the start and which `sched_process_fork` and `sched_process_exec` keep up to
//! date in the kernel, before a new process runs its first instruction.
//!
//! A target is its PID *and* its start time, so a process that reuses the PID of one that
//! exited is not taken for it.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_send_signal, bpf_task_pt_regs,
        },
    },
    programs::{BtfTracePointContext, TracePointContext},
};
use tracer_common::{TargetProcess, counter, held, target_filter, target_flags, target_match};

use crate::{
    BPRM_FILE_OFFSET, CLOCK_TICK_NS, FILE_INODE_OFFSET, INODE_INO_OFFSET, INODE_SB_OFFSET,
    MATCH_COMM, MATCH_EXE_DEV, MATCH_EXE_INO, PID_LEVEL_OFFSET, PID_NS_INO, PID_NS_INUM_OFFSET,
    PID_NUMBERS_OFFSET, PYTHON_PROCESSES, SB_DEV_OFFSET, TARGET_FILTER, TARGET_MATCH,
    TARGET_START_TICKS, TARGET_TGID, TARGETS, TASK_COMM_OFFSET, TASK_GROUP_LEADER_OFFSET,
    TASK_PID_OFFSET, TASK_START_BOOTTIME_OFFSET, TASK_TGID_OFFSET, TASK_THREAD_PID_OFFSET,
    UPID_NS_OFFSET, UPID_SIZE, count, setting,
};

/// The current thread's process and thread ids as user space sees them: the host's, or
/// in a nested PID namespace that namespace's (`None` for a task outside it).
#[inline(always)]
pub fn current_ids() -> Option<(u32, u32)> {
    if setting(&PID_NS_INO) == 0 {
        let pid_tgid = bpf_get_current_pid_tgid();
        return Some(((pid_tgid >> 32) as u32, pid_tgid as u32));
    }
    // SAFETY: bpf_get_current_task returns the running task; reads are validated.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let tid = ns_number(task)?;
    let leader = read_ptr(task, setting(&TASK_GROUP_LEADER_OFFSET))?;
    Some((ns_number(leader)?, tid))
}

/// [`current_ids`] as one `tgid << 32 | tid` (0 outside the namespace).
#[inline(always)]
pub fn current_pid_tgid() -> u64 {
    match current_ids() {
        Some((tgid, tid)) => (u64::from(tgid) << 32) | u64::from(tid),
        None => 0,
    }
}

/// The thread id of `task`, a pointer the verifier trusts (see [`trusted_field`]), as
/// user space sees it (see [`current_ids`]).
#[inline(always)]
pub fn task_tid(task: *const u8) -> Option<u32> {
    if setting(&PID_NS_INO) == 0 {
        return Some(trusted_field(task, setting(&TASK_PID_OFFSET)));
    }
    ns_number(task)
}

/// The field at `offset` of `base`, a kernel pointer whose BTF type the verifier knows (a
/// `tp_btf` argument, `bpf_get_current_task_btf`, a task iterator's task, or a pointer
/// field read from one): a plain load, checked at load time against the type (the offset
/// is a constant then: a setting in frozen `.rodata`), which reads 0 where the memory
/// faults. It costs a few instructions, where `bpf_probe_read_kernel` is a helper call;
/// on the scheduler's path that adds up.
#[inline(always)]
pub fn trusted_field<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: the verifier checks the access against the BTF type and the JIT guards it
    // against faults.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// How deep below the tracer's PID namespace a task's own namespace may be.
const MAX_PID_NS_DEPTH: u32 = 4;

/// `task`'s number in the tracer's PID namespace: `thread_pid->numbers[level]` for the
/// level (the task's own, or up to [`MAX_PID_NS_DEPTH`] above it) whose namespace is the
/// tracer's.
#[inline(always)]
fn ns_number(task: *const u8) -> Option<u32> {
    let pid = read_ptr(task, setting(&TASK_THREAD_PID_OFFSET))?;
    let level = read_u32(pid, setting(&PID_LEVEL_OFFSET))?;
    let wanted = setting(&PID_NS_INO);
    for depth in 0..MAX_PID_NS_DEPTH {
        if depth > level {
            break;
        }
        let offset = setting(&PID_NUMBERS_OFFSET) + (level - depth) * setting(&UPID_SIZE);
        let upid = pid.wrapping_add(offset as usize);
        let ns = read_ptr(upid, setting(&UPID_NS_OFFSET))?;
        if read_u32(ns, setting(&PID_NS_INUM_OFFSET))? == wanted {
            // `upid.nr` comes first.
            return read_u32(upid, 0);
        }
    }
    None
}

/// Whether the current thread, of process `tgid`, is traced by the programs of `kind` (a
/// bit of `tracer_common::target_filter`).
#[inline(always)]
pub fn is_traced(tgid: u32, kind: u32) -> bool {
    is_traced_started(tgid, kind, current_start_ticks)
}

/// [`is_traced`] for the current thread `current`, a task pointer the verifier trusts
/// (the `prev` of `sched_switch`): its start time read by plain loads. Only for programs
/// loaded with the kernel's task offsets (those verified against kernel types).
#[inline(always)]
pub fn is_traced_task(tgid: u32, kind: u32, current: *const u8) -> bool {
    is_traced_started(tgid, kind, || {
        let leader: *const u8 = trusted_field(current, setting(&TASK_GROUP_LEADER_OFFSET));
        let start_ns: u64 = trusted_field(leader, setting(&TASK_START_BOOTTIME_OFFSET));
        start_ns / setting(&CLOCK_TICK_NS).max(1)
    })
}

/// [`is_traced`], with `start_ticks` giving the current process's start time (only
/// called when a target's start time is known).
#[inline(always)]
fn is_traced_started(tgid: u32, kind: u32, start_ticks: impl Fn() -> u64) -> bool {
    if setting(&TARGET_FILTER) & kind == 0 {
        return true;
    }
    let single = setting(&TARGET_TGID);
    if single != 0 {
        let start = setting(&TARGET_START_TICKS);
        return tgid == single && (start == 0 || start_ticks() == start);
    }
    // SAFETY: the value is copied out at once.
    match unsafe { TARGETS.get(&tgid) }.copied() {
        Some(target) => target.start_ticks == 0 || start_ticks() == target.start_ticks,
        None => false,
    }
}

/// Records the current process, when traced, in `HELD`: user space looks at its maps and
/// attaches the probes of what it mapped. With holding on (`control::HOLD_UNTIL_S`), it
/// also stops the process, which user space continues once they are attached: `dlopen`
/// calls `_dl_debug_state` once its objects are mapped and before it relocates them or
/// runs their constructors, so none of their code has run yet.
#[inline(always)]
pub fn hold() {
    if crate::stopped() {
        return;
    }
    let Some((tgid, _)) = current_ids() else {
        return;
    };
    if !is_traced(tgid, target_filter::USDT) {
        return;
    }
    let hold_until_s = crate::CONTROL
        .get(tracer_common::control::HOLD_UNTIL_S)
        .copied()
        .unwrap_or(0);
    // SAFETY: the helper has no preconditions.
    let now_s = unsafe { bpf_ktime_get_ns() } / 1_000_000_000;
    if now_s > u64::from(hold_until_s) {
        if crate::MAPPED_CODE.insert(&tgid, &held::LOOK, 0).is_ok() {
            notify_held(tgid);
        }
        return;
    }
    if crate::HELD.insert(&tgid, &held::STOPPED, 0).is_ok() {
        // SAFETY: the helper signals the current process; SIGSTOP takes effect on its
        // way back to user space.
        unsafe { bpf_send_signal(SIGSTOP) };
        notify_held(tgid);
    }
}

/// Wakes user space to look at `tgid`, just recorded in `HELD` or `MAPPED_CODE`. A notice
/// lost to a full ring is found by user space's periodic look at both.
#[inline(always)]
fn notify_held(tgid: u32) {
    let _ = crate::HELD_NOTICES.output(&tgid, 0);
}

/// `SIGSTOP` on Linux.
const SIGSTOP: u32 = 19;

/// Whether process `tgid` is one the tracer looks at for objects mapped later: the one
/// target, a member of the set, or any process when every process is traced.
#[inline(always)]
fn maps_are_watched(tgid: u32) -> bool {
    let single = setting(&TARGET_TGID);
    if single != 0 {
        let start = setting(&TARGET_START_TICKS);
        // Loaded without the kernel's task offsets, a process's start time cannot be
        // read: the PID alone says (the tracer stops when that process exits).
        let readable = setting(&TASK_GROUP_LEADER_OFFSET) != 0;
        return tgid == single && (start == 0 || !readable || current_start_ticks() == start);
    }
    is_traced(tgid, target_filter::USDT)
}

/// Records the current process, when its maps are watched, in `MAPPED_CODE` for user
/// space to look at them.
#[inline(always)]
fn look_at_current_maps() {
    if crate::stopped() {
        return;
    }
    let Some((tgid, _)) = current_ids() else {
        return;
    };
    if maps_are_watched(tgid) {
        // BPF_NOEXIST: user space is woken once until it looks.
        if crate::MAPPED_CODE
            .insert(&tgid, &held::LOOK, crate::BPF_NOEXIST)
            .is_ok()
        {
            notify_held(tgid);
        }
    }
}

/// `PROT_EXEC` on Linux.
const PROT_EXEC: u64 = 4;
/// Offset of `ret` in a `syscalls:sys_exit_*` record (after the common header and the
/// syscall number).
const SYSCALL_EXIT_RET_OFFSET: usize = 16;

/// `syscalls:sys_exit_mmap`: a watched process mapped memory executable (its loader
/// mapped a library, a JIT compiler mapped room for code): user space looks at its maps.
/// The protection is the syscall's third argument, in the registers saved at its entry.
#[inline(always)]
pub fn on_code_mapped(ctx: &TracePointContext) {
    // SAFETY: the record of sys_exit_mmap holds `ret` at this offset.
    let Ok(address) = (unsafe { ctx.read_at::<i64>(SYSCALL_EXIT_RET_OFFSET) }) else {
        return;
    };
    // A negative return is an error number: nothing was mapped.
    if address < 0 {
        return;
    }
    // SAFETY: the helpers take no memory from us; the first returns the current task, the
    // second its saved registers, both pointers the verifier trusts.
    let saved = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    // SAFETY: the load is checked at load time and guarded against faults.
    let prot = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*saved).rdx)) };
    if prot & PROT_EXEC != 0 {
        look_at_current_maps();
    }
}

/// `sched:sched_process_exec`: a watched process runs a new program, which the kernel
/// mapped (with its loader) without a `mmap` call: user space looks at its maps.
#[inline(always)]
pub fn on_program_started() {
    look_at_current_maps();
}

/// `sched_process_fork(parent, child)`, run by the parent: a process forked by a target
/// that follows its forks is a target from its first instruction. Threads are not
/// processes: a child in the parent's thread group is left alone.
#[inline(always)]
pub fn on_fork(ctx: &BtfTracePointContext) {
    let Some((parent_tgid, _)) = current_ids() else {
        return;
    };
    // SAFETY: the value is copied out at once.
    let Some(parent) = (unsafe { TARGETS.get(&parent_tgid) }).copied() else {
        return;
    };
    if parent.flags & target_flags::FOLLOW_FORKS == 0
        || (parent.start_ticks != 0 && current_start_ticks() != parent.start_ticks)
    {
        return;
    }
    let child: *const u8 = ctx.arg(1);
    let (Some(child_pid), Some(child_tgid)) = (
        read_u32(child, setting(&TASK_PID_OFFSET)),
        read_u32(child, setting(&TASK_TGID_OFFSET)),
    ) else {
        return;
    };
    // The host's ids tell a process from a thread; the key is the child's own id.
    let parent_host_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if child_tgid != child_pid || child_tgid == parent_host_tgid {
        return;
    }
    let Some(child_tgid) = task_tid(child) else {
        return;
    };
    let start_ns = read_u64(child, setting(&TASK_START_BOOTTIME_OFFSET)).unwrap_or(0);
    let target = TargetProcess {
        start_ticks: start_ns / setting(&CLOCK_TICK_NS).max(1),
        flags: parent.flags,
        forked_from: parent_tgid,
        comm: comm_of(child),
    };
    if TARGETS.insert(&child_tgid, &target, 0).is_err() {
        count(counter::MAP_FULL);
    }
    // The child's memory is a copy of its parent's: a Python parent's interpreter is at
    // the same addresses in the child from its first instruction.
    // SAFETY: the value is copied out at once.
    if let Some(python) = unsafe { PYTHON_PROCESSES.get(&parent_tgid) }.copied()
        && PYTHON_PROCESSES.insert(&child_tgid, &python, 0).is_err()
    {
        count(counter::MAP_FULL);
    }
}

/// `sched_process_exec(task, old_pid, bprm)`, run by the process that executes: it joins
/// the targets when it now runs the `--exe` file or has the `--comm` name, and one that
/// was a target only for that leaves them when it runs something else.
#[inline(always)]
pub fn on_exec(ctx: &BtfTracePointContext) {
    let Some((tgid, _)) = current_ids() else {
        return;
    };
    let matching = setting(&TARGET_MATCH);
    let bprm: *const u8 = ctx.arg(2);
    let matches = (matching & target_match::EXE != 0 && runs_exe(bprm))
        || (matching & target_match::COMM != 0 && has_comm());
    // A new program: whatever interpreter the process ran is gone.
    let _ = PYTHON_PROCESSES.remove(&tgid);
    // SAFETY: the value is copied out at once.
    match unsafe { TARGETS.get(&tgid) }.copied() {
        Some(target) if !matches && target.flags & target_flags::BY_MATCH != 0 => {
            let _ = TARGETS.remove(&tgid);
        }
        None if matches => {
            // SAFETY: bpf_get_current_task returns the running task.
            let task = unsafe { bpf_get_current_task() } as *const u8;
            let target = TargetProcess {
                start_ticks: current_start_ticks(),
                flags: target_flags::FOLLOW_FORKS | target_flags::BY_MATCH,
                forked_from: 0,
                comm: comm_of(task),
            };
            if TARGETS.insert(&tgid, &target, 0).is_err() {
                count(counter::MAP_FULL);
            }
        }
        // Still a target, running another program: no longer a copy of its parent.
        Some(mut target) if target.forked_from != 0 => {
            target.forked_from = 0;
            let _ = TARGETS.insert(&tgid, &target, 0);
        }
        _ => {}
    }
}

/// Whether the file `bprm` executes is the `--exe` file (same device and inode).
#[inline(always)]
fn runs_exe(bprm: *const u8) -> bool {
    let Some(file) = read_ptr(bprm, setting(&BPRM_FILE_OFFSET)) else {
        return false;
    };
    let Some(inode) = read_ptr(file, setting(&FILE_INODE_OFFSET)) else {
        return false;
    };
    let Some(ino) = read_u64(inode, setting(&INODE_INO_OFFSET)) else {
        return false;
    };
    if ino != setting(&MATCH_EXE_INO) {
        return false;
    }
    let Some(sb) = read_ptr(inode, setting(&INODE_SB_OFFSET)) else {
        return false;
    };
    read_u32(sb, setting(&SB_DEV_OFFSET))
        .is_some_and(|dev| u64::from(dev) == setting(&MATCH_EXE_DEV))
}

/// `task`'s name (`comm`), zeros if unreadable.
#[inline(always)]
fn comm_of(task: *const u8) -> [u8; 16] {
    let field = task
        .wrapping_add(setting(&TASK_COMM_OFFSET) as usize)
        .cast::<[u8; 16]>();
    // SAFETY: bpf_probe_read_kernel validates the address.
    unsafe { bpf_probe_read_kernel(field) }.unwrap_or([0; 16])
}

/// Whether the current task's name is the `--comm` name (both zero-padded to 16 bytes).
#[inline(always)]
fn has_comm() -> bool {
    // SAFETY: bpf_get_current_task returns the running task.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let comm = comm_of(task);
    let wanted = setting(&MATCH_COMM);
    let mut i = 0;
    while i < 16 {
        if comm[i] != wanted[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// When the current thread's process started, in clock ticks since boot (0 if unknown).
#[inline(always)]
fn current_start_ticks() -> u64 {
    // Helper reads, not plain loads: programs loaded without the kernel's task offsets
    // (0 then) reach this too, and a load through a field that is no pointer would fail
    // verification.
    // SAFETY: bpf_get_current_task returns the running task; the reads below go through
    // bpf_probe_read_kernel, which validates the addresses (offsets from kernel BTF).
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let Some(leader) = read_ptr(task, setting(&TASK_GROUP_LEADER_OFFSET)) else {
        return 0;
    };
    let start_ns = read_u64(leader, setting(&TASK_START_BOOTTIME_OFFSET)).unwrap_or(0);
    start_ns / setting(&CLOCK_TICK_NS).max(1)
}

#[inline(always)]
fn read_ptr(base: *const u8, offset: u32) -> Option<*const u8> {
    // SAFETY: bpf_probe_read_kernel validates the address.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<*const u8>()) }.ok()
}

#[inline(always)]
fn read_u64(base: *const u8, offset: u32) -> Option<u64> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<u64>()) }.ok()
}

#[inline(always)]
fn read_u32(base: *const u8, offset: u32) -> Option<u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<u32>()) }.ok()
}
