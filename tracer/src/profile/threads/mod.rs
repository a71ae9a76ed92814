//! What every thread of a process is doing right now, read from `/proc` without stopping
//! it (`tracer stacks`; also the real stacks of threads blocked since before tracing
//! started).
//!
//! Per thread, from `/proc/PID/task/TID/`:
//! - `stat`: the state letter and the CPU it last ran on;
//! - `syscall`: the system call it is in (number, six arguments) and the user stack and
//!   instruction pointers saved when it entered the kernel; `running` for a runnable
//!   thread (on a CPU or waiting for one), `-1 SP PC` in the kernel outside a system call
//!   (a page fault). The kernel reads them once the thread is off CPU; it never stops it;
//! - `stack`: its kernel stack, one `function+0xOFF/0xSIZE` per line (needs CAP_SYS_ADMIN);
//! - `sched`: `se.exec_start`, the scheduler's clock on its CPU when it last ran. The same
//!   field of our own thread, just brought up to date and read on that CPU, is "now" on
//!   that clock, so the difference is how long since the thread last ran. The clock is the
//!   run queue's task clock: it leaves out time the hypervisor stole from that CPU, so on a
//!   virtual machine the figure is short by the share stolen (0.3% on the one this was
//!   written on);
//! - `schedstat`: its CPU time so far, read twice to tell a thread on a CPU (whose time
//!   grows) from one waiting for a CPU;
//! - and `/proc/PID/mem`: the top of its user stack, from the saved stack pointer up.
//!
//! The reads are parsed here ([`ThreadSnapshot`], by [`snapshot_threads_with`]); the user stack
//! is unwound with [`DwarfUnwinder`] and named with [`StackSymbolizer`] by [`user_stacks`].
//!
//! `/proc` does not give the frame pointer, and the call frame information of code built
//! with frame pointers is relative to it: without it, unwinding stops at the first such
//! frame above the system call's wrapper. [`SnapshotOptions::registers`] brings it from
//! the kernel (a task iterator, [`crate::kernel::Loader::thread_registers`]), used where
//! the instruction and stack pointers are those `/proc` gave (the thread did not run in
//! between).
//!
//! The files of each thread are parsed in `parse`, and read in `snapshot`. The scheduler's
//! clock "now" is read in `clock`. User stacks are unwound and named in `user_stack`. The
//! names of system calls are in [`syscalls`].
//!
//! [`DwarfUnwinder`]: crate::stack::unwind::DwarfUnwinder
//! [`StackSymbolizer`]: crate::stack::symbolize::StackSymbolizer

mod clock;
mod parse;
mod snapshot;
pub(crate) mod syscalls;
mod user_stack;

#[cfg(test)]
pub(crate) use parse::Syscall;
pub(crate) use parse::{ThreadState, parse_kernel_stack};
pub(crate) use snapshot::{
    SnapshotError, SnapshotOptions, ThreadSnapshot, UserState, snapshot_threads_with,
};
pub(crate) use user_stack::{UserStack, user_stacks};
