//! USDT probes for garbage-collection and task events, for runtimes traced by `tracer`.
//!
//! A runtime links this crate and calls one function per event. Each function compiles to a
//! SystemTap SDT probe site (an ELF note in `.note.stapsdt`, provider [`PROVIDER`]) guarded by
//! a semaphore: a 2-byte counter in the `.probes` section that a tracer raises while it is
//! attached. With nothing attached a call costs the semaphore test at the call site — a load
//! (two in a position-independent executable, where the counter's address comes from the
//! GOT; in a loop that one is hoisted), a compare and a branch; the arguments are not even
//! evaluated. That is why every function is `#[inline(always)]`. In a loop that does nothing
//! else this is indistinguishable from no probe (`cargo xtask bench`, figure 1), as long as
//! the 6 bytes it adds do not push the loop across a 64-byte boundary — as any 6 bytes can.
//!
//! The probe names are the ones Julia uses for the same events (provider `julia` in
//! `libjulia-internal.so`), so scripts written for Julia work after changing the provider:
//!
//! | function | probe | arguments |
//! |---|---|---|
//! | [`gc_begin`] | `tracer:gc__begin` | collection |
//! | [`gc_stop_the_world`] | `tracer:gc__stop_the_world` | |
//! | [`gc_mark_begin`] | `tracer:gc__mark__begin` | |
//! | [`gc_mark_end`] | `tracer:gc__mark__end` | scanned_bytes, perm_scanned_bytes |
//! | [`gc_sweep_begin`] | `tracer:gc__sweep__begin` | full (0 or 1) |
//! | [`gc_sweep_end`] | `tracer:gc__sweep__end` | |
//! | [`gc_end`] | `tracer:gc__end` | |
//! | [`gc_finalizer`] | `tracer:gc__finalizer` | |
//! | [`rt_new_task`] | `tracer:rt__new__task` | parent, child |
//! | [`rt_start_task`] | `tracer:rt__start__task` | task |
//! | [`rt_run_task`] | `tracer:rt__run__task` | task |
//! | [`rt_pause_task`] | `tracer:rt__pause__task` | task |
//! | [`rt_finish_task`] | `tracer:rt__finish__task` | task |
//! | [`rt_task_name`] | `tracer:rt__task__name` | task, name (address of a NUL-terminated string) |
//!
//! Every argument is passed as a signed 8-byte register operand (`-8@%reg`); unsigned values
//! such as task ids come back bit-for-bit when read as 64-bit unsigned.
//!
//! A probe only appears in a binary if the binary calls its function: an unused
//! `#[inline(always)]` function generates no code and so no note. A function inlined at
//! several call sites gives one note per site, all sharing one semaphore; tracers attach to
//! all of them.
//!
//! # Semaphores and the page alignment of `.probes`
//!
//! The semaphores live in the `.probes` section, which this crate page-aligns (it links a
//! zero-sized page-aligned object into it; this costs up to 4 KiB of padding in the binary's
//! writable data, and nothing at run time). Without that, the kernel's own semaphore
//! counting (uprobes with `ref_ctr_offset`, used by bpftrace and libbpf) can miss: lld — the
//! default linker of Rust on x86-64 Linux — starts the writable non-RELRO segment in the same
//! file page where the RELRO segment ends. When `.probes` falls in that page and a tracer
//! attaches before the process starts, the kernel increments the copy of the counter that is
//! mapped in the RELRO segment (writable at exec time, read-only after the dynamic linker's
//! `mprotect`), and the probe never sees a non-zero semaphore. The alignment is applied on
//! x86-64 only, the one architecture it is tested on.
//!
//! # Listing and tracing the probes
//!
//! The notes are visible without any tracer:
//!
//! ```text
//! $ readelf -n ./my-runtime | grep -A4 stapsdt
//!   stapsdt              0x00000031       NT_STAPSDT (SystemTap probe descriptors)
//!     Provider: tracer
//!     Name: gc__begin
//!     Location: 0x0000000000020e6b, Base: 0x00000000000088a8, Semaphore: 0x000000000007e018
//!     Arguments: -8@%r15
//! ```
//!
//! With bpftrace, by path or in a running process:
//!
//! ```text
//! $ bpftrace -l 'usdt:./my-runtime:tracer:*'
//! $ bpftrace -p PID -e '
//!     usdt:./my-runtime:tracer:gc__begin { @start[tid] = nsecs; }
//!     usdt:./my-runtime:tracer:gc__end /@start[tid]/ {
//!         @pause_us = hist((nsecs - @start[tid]) / 1000); delete(@start[tid]);
//!     }'
//! ```
//!
//! `tracer` finds the same notes by provider name ([`PROVIDER`]) in the executable and in
//! the shared libraries of the target process, raises the semaphores while it is attached,
//! and measures latencies between pairs of probes, e.g. GC pauses and stop-the-world
//! latencies (see `tracer attach --help`):
//!
//! ```text
//! $ tracer attach --pid PID --duration 10s \
//!     --latency tracer:gc__begin,tracer:gc__end \
//!     --latency tracer:gc__begin,tracer:gc__stop_the_world
//! ```
//!
//! # tokio
//!
//! With the `tokio` feature, and built with `RUSTFLAGS="--cfg tokio_unstable"` (tokio's task
//! hooks are unstable), `tokio::instrument` makes every task of a tokio runtime fire the task
//! probes: `rt__new__task`, `rt__run__task` / `rt__pause__task` around each poll, and
//! `rt__finish__task`, with tokio's task ids.
//!
//! # Example
//!
//! ```
//! fn collect(n: u64) {
//!     probes::gc_begin(n);
//!     // ... stop the world ...
//!     probes::gc_stop_the_world();
//!     probes::gc_mark_begin();
//!     // ... mark ...
//!     probes::gc_mark_end(4096, 0);
//!     probes::gc_sweep_begin(n % 4 == 0);
//!     // ... sweep ...
//!     probes::gc_sweep_end();
//!     probes::gc_end();
//! }
//! collect(1);
//! ```

#![no_std]

// tokio needs std: so does the module for it.
#[cfg(all(feature = "tokio", tokio_unstable))]
extern crate std;

use probe::probe_lazy;

#[cfg(all(feature = "tokio", tokio_unstable))]
pub mod tokio;

/// Page-aligns the `.probes` section; see "Semaphores and the page alignment of `.probes`"
/// in the crate docs.
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    target_arch = "x86_64"
))]
mod page_align {
    /// Zero-sized and page-aligned: linked into `.probes`, it makes the whole section start
    /// on a page of its own.
    #[repr(C, align(4096))]
    struct PageAligned([u8; 0]);

    #[unsafe(link_section = ".probes")]
    static mut PROBES_PAGE_ALIGN: PageAligned = PageAligned([]);

    /// Keeps [`PROBES_PAGE_ALIGN`] in the linked binary despite `--gc-sections`, at no cost:
    /// it emits no instruction, only a no-op relocation that references it. Called on the
    /// enabled path of each probe, so it cannot change the disabled path either.
    #[inline(always)]
    pub(crate) fn keep() {
        // SAFETY: the asm emits no instruction; the relocation only tells the linker that
        // the anchor is used.
        unsafe {
            core::arch::asm!(
                ".reloc ., R_X86_64_NONE, {anchor}",
                anchor = sym PROBES_PAGE_ALIGN,
                options(nomem, nostack, preserves_flags),
            );
        }
    }
}

#[cfg(not(all(
    any(target_os = "linux", target_os = "android"),
    target_arch = "x86_64"
)))]
mod page_align {
    #[inline(always)]
    pub(crate) fn keep() {}
}

/// The USDT provider name of every probe in this crate.
pub const PROVIDER: &str = "tracer";

/// The names of all probes in this crate, as they appear in the ELF notes.
pub const PROBE_NAMES: &[&str] = &[
    "gc__begin",
    "gc__stop_the_world",
    "gc__mark__begin",
    "gc__mark__end",
    "gc__sweep__begin",
    "gc__sweep__end",
    "gc__end",
    "gc__finalizer",
    "rt__new__task",
    "rt__start__task",
    "rt__run__task",
    "rt__pause__task",
    "rt__finish__task",
    "rt__task__name",
];

/// A garbage collection starts; `collection` identifies it (Julia passes the collection
/// kind). Probe `tracer:gc__begin(collection)`.
#[inline(always)]
pub fn gc_begin(collection: u64) {
    if probe_lazy!(tracer, gc__begin, collection) {
        page_align::keep();
    }
}

/// All mutator threads have reached a safepoint; the time since [`gc_begin`] is the
/// stop-the-world latency. Probe `tracer:gc__stop_the_world()`.
#[inline(always)]
pub fn gc_stop_the_world() {
    if probe_lazy!(tracer, gc__stop_the_world) {
        page_align::keep();
    }
}

/// The mark phase starts. Probe `tracer:gc__mark__begin()`.
#[inline(always)]
pub fn gc_mark_begin() {
    if probe_lazy!(tracer, gc__mark__begin) {
        page_align::keep();
    }
}

/// The mark phase ends, having scanned `scanned_bytes` bytes of young objects and
/// `perm_scanned_bytes` bytes of old (permanent) ones.
/// Probe `tracer:gc__mark__end(scanned_bytes, perm_scanned_bytes)`.
#[inline(always)]
pub fn gc_mark_end(scanned_bytes: i64, perm_scanned_bytes: i64) {
    if probe_lazy!(tracer, gc__mark__end, scanned_bytes, perm_scanned_bytes) {
        page_align::keep();
    }
}

/// The sweep phase starts; `full` is true for a full (major) collection, passed as 1 or 0.
/// Probe `tracer:gc__sweep__begin(full)`.
#[inline(always)]
pub fn gc_sweep_begin(full: bool) {
    if probe_lazy!(tracer, gc__sweep__begin, full) {
        page_align::keep();
    }
}

/// The sweep phase ends. Probe `tracer:gc__sweep__end()`.
#[inline(always)]
pub fn gc_sweep_end() {
    if probe_lazy!(tracer, gc__sweep__end) {
        page_align::keep();
    }
}

/// The garbage collection ends and the world restarts; the time since [`gc_begin`] is the
/// pause. Probe `tracer:gc__end()`.
#[inline(always)]
pub fn gc_end() {
    if probe_lazy!(tracer, gc__end) {
        page_align::keep();
    }
}

/// Finalizers run after a collection. Probe `tracer:gc__finalizer()`.
#[inline(always)]
pub fn gc_finalizer() {
    if probe_lazy!(tracer, gc__finalizer) {
        page_align::keep();
    }
}

/// Task `parent` created task `child`. Probe `tracer:rt__new__task(parent, child)`.
#[inline(always)]
pub fn rt_new_task(parent: u64, child: u64) {
    if probe_lazy!(tracer, rt__new__task, parent, child) {
        page_align::keep();
    }
}

/// Task `task` runs for the first time. Probe `tracer:rt__start__task(task)`.
#[inline(always)]
pub fn rt_start_task(task: u64) {
    if probe_lazy!(tracer, rt__start__task, task) {
        page_align::keep();
    }
}

/// Task `task` is switched to (starts or resumes running on this thread).
/// Probe `tracer:rt__run__task(task)`.
#[inline(always)]
pub fn rt_run_task(task: u64) {
    if probe_lazy!(tracer, rt__run__task, task) {
        page_align::keep();
    }
}

/// Task `task` is switched away from (it blocks or yields).
/// Probe `tracer:rt__pause__task(task)`.
#[inline(always)]
pub fn rt_pause_task(task: u64) {
    if probe_lazy!(tracer, rt__pause__task, task) {
        page_align::keep();
    }
}

/// Task `task` has finished. Probe `tracer:rt__finish__task(task)`.
#[inline(always)]
pub fn rt_finish_task(task: u64) {
    if probe_lazy!(tracer, rt__finish__task, task) {
        page_align::keep();
    }
}

/// Task `task` is called `name` (tracers call it so rather than by its number).
/// Probe `tracer:rt__task__name(task, name)`, `name` the address of the NUL-terminated
/// bytes, read by the tracer while the probe fires. Not one of Julia's probes.
#[inline(always)]
pub fn rt_task_name(task: u64, name: &core::ffi::CStr) {
    if probe_lazy!(tracer, rt__task__name, task, touched(name)) {
        page_align::keep();
    }
}

/// The address of `name`, its first byte read: a tracer reading it from the probe cannot
/// fault a page in, and a literal's page may not have been touched yet.
#[inline(always)]
fn touched(name: &core::ffi::CStr) -> u64 {
    let address = name.as_ptr();
    // SAFETY: a CStr has at least its NUL byte.
    unsafe { core::ptr::read_volatile(address) };
    address as u64
}

/// [`rt_task_name`] with the name made only while a tracer is attached (formatting a
/// name costs more than the probe).
#[inline(always)]
pub fn rt_task_name_with<N: AsRef<core::ffi::CStr>>(task: u64, name: impl FnOnce() -> N) {
    // Holds the name until the probe has fired.
    let mut made = None;
    if probe_lazy!(
        tracer,
        rt__task__name,
        task,
        touched(made.insert(name()).as_ref())
    ) {
        page_align::keep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_names_are_distinct_and_julia_style() {
        assert_eq!(PROBE_NAMES.len(), 14);
        for (i, name) in PROBE_NAMES.iter().enumerate() {
            assert!(!PROBE_NAMES[..i].contains(name), "{name} twice");
            assert!(
                name.starts_with("gc__") || name.starts_with("rt__"),
                "{name}"
            );
        }
    }

    #[test]
    fn disabled_probes_do_nothing() {
        gc_begin(1);
        gc_stop_the_world();
        gc_mark_begin();
        gc_mark_end(1, 2);
        gc_sweep_begin(true);
        gc_sweep_end();
        gc_end();
        gc_finalizer();
        rt_new_task(1, 2);
        rt_start_task(2);
        rt_run_task(2);
        rt_pause_task(2);
        rt_finish_task(2);
        rt_task_name(2, c"worker");
        rt_task_name_with(2, || -> &core::ffi::CStr {
            unreachable!("no tracer is attached")
        });
    }
}
