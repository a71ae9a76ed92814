//! Running out of memory ends tracer with one line that names the memory limit in force
//! (see [`MemoryLimits`]) and exit code 1, never an abort with a backtrace.
//!
//! Rust's handler for a failed allocation aborts, and a thread that cannot be started
//! panics. blazesym, aya and tracer itself allocate and start threads in many places, so
//! both are caught where every one of them passes: in the global allocator
//! ([`ExitOnOutOfMemory`], which the binary installs) and in the panic hook ([`prepare`]).
//! An error that the kernel's ENOMEM caused (a BPF map under a memory cgroup's limit) is
//! an ordinary error, and `main` adds the same limits to it.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    io,
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

use crate::system::oserror::MemoryLimits;

/// What to say after "out of memory: ", rendered by [`prepare`] while memory is there:
/// the report of a failed allocation must not allocate.
static LIMITS_TEXT: OnceLock<String> = OnceLock::new();

/// Set by the first allocation that fails.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Said when [`prepare`] did not run.
const UNKNOWN_LIMITS_TEXT: &str = "raise tracer's memory limit (ulimit -v, memory cgroup) \
                                   or free some memory, and run tracer again";

/// The least memory a memory cgroup must allow for tracer to load its eBPF programs, whose
/// maps and buffers are charged to it. On a 2-CPU machine the cgroup's usage peaked at
/// 133 MiB for `profile` and 173 MiB for `attach`, and the kernel refused their maps at
/// 48 MiB.
pub(crate) const LEAST_CGROUP_MEMORY: u64 = 64 << 20;

/// Fails when the memory cgroup tracer is in allows less than [`LEAST_CGROUP_MEMORY`], for
/// the commands that load eBPF programs. Out of memory in a cgroup, the kernel may kill
/// tracer without a word rather than fail an allocation.
pub(crate) fn check_cgroup_room() -> anyhow::Result<()> {
    match MemoryLimits::now().cgroup {
        Some(cgroup) if cgroup.bytes < LEAST_CGROUP_MEMORY => Err(anyhow::anyhow!(
            "not enough memory: the memory cgroup {} limits tracer to {:.1} MiB ({}), less \
             than the {} MiB its eBPF maps and buffers take at least: raise that limit, or \
             run tracer outside the cgroup, and run tracer again",
            cgroup.dir.display(),
            cgroup.bytes as f64 / (1024.0 * 1024.0),
            cgroup.file,
            LEAST_CGROUP_MEMORY >> 20
        )),
        _ => Ok(()),
    }
}

/// Reads the memory limits now and catches the panic of a thread that cannot be started.
/// Call it first thing in `main`.
pub(crate) fn prepare() {
    let limits = MemoryLimits::now();
    let _ = LIMITS_TEXT.set(limits.to_string());
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied());
        match message.and_then(spawn_failure) {
            Some(error) => {
                let cause = spawn_failure_cause(&limits);
                crate::status!("tracer: error: cannot start a thread: {error}: {cause}");
                std::process::exit(1);
            }
            None => default_hook(info),
        }
    }));
}

/// The error of std's panic when it cannot start a thread (`std::thread::spawn` and
/// scoped threads): `failed to spawn thread: Os { code: 11, kind: WouldBlock, .. }`.
fn spawn_failure(message: &str) -> Option<io::Error> {
    let error = message.strip_prefix("failed to spawn thread")?;
    let code = error
        .split_once("code: ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|code| code.parse().ok());
    Some(match code {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::other(error.trim_start_matches(": ").to_string()),
    })
}

/// Why a thread could not be started: the memory for its stack under a limit, or a
/// limit on threads.
fn spawn_failure_cause(limits: &MemoryLimits) -> String {
    match limits.any() {
        true => format!("out of memory: {limits}"),
        false => "the limit on processes or threads (ulimit -u, a pids cgroup, \
                  kernel.threads-max) may be reached, or memory is short"
            .to_string(),
    }
}

/// The system's allocator, but an allocation that fails ends tracer at once with one
/// line naming the memory limit, and exit code 1. No caller ever sees the null, so
/// `try_reserve` cannot recover from a failure either: none in tracer needs to.
pub struct ExitOnOutOfMemory;

// SAFETY: every call goes to `System` with the caller's arguments unchanged; a null it
// returns ends the process instead of being returned.
unsafe impl GlobalAlloc for ExitOnOutOfMemory {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps GlobalAlloc::alloc's contract, which is System's.
        let ptr = unsafe { System.alloc(layout) };
        if ptr.is_null() {
            out_of_memory(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if ptr.is_null() {
            out_of_memory(layout.size());
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`; `ptr` came from this allocator, that is from System.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if new.is_null() {
            out_of_memory(new_size);
        }
        new
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Writes `tracer: error: out of memory: cannot allocate N bytes: LIMITS` and exits with
/// code 1, without allocating: the heap is what failed.
fn out_of_memory(size: usize) -> ! {
    // Threads may fail at once: the first says it and ends the process, the others wait
    // for that.
    if REPORTING.swap(true, Ordering::AcqRel) {
        loop {
            // SAFETY: pause only waits for a signal; the first thread's _exit ends this one.
            unsafe { libc::pause() };
        }
    }
    let mut digits = [0u8; 20];
    let size = decimal(size as u64, &mut digits);
    let limits = LIMITS_TEXT
        .get()
        .map_or(UNKNOWN_LIMITS_TEXT, String::as_str);
    for part in [
        b"tracer: error: out of memory: cannot allocate ".as_slice(),
        size,
        b" bytes: ",
        limits.as_bytes(),
        b"\n",
    ] {
        write_all_stderr(part);
    }
    // SAFETY: _exit ends the process at once; nothing it runs can allocate. The kernel
    // releases what tracer attached (its BPF links and perf events are file descriptors).
    unsafe { libc::_exit(1) }
}

/// `value` in decimal, in the end of `buf`.
fn decimal(mut value: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buf[at..];
        }
    }
}

fn write_all_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a valid buffer of the length given to fd 2.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if written <= 0 {
            return;
        }
        bytes = &bytes[written as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes_without_allocating() {
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(5_795_635, &mut buf), b"5795635");
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }

    #[test]
    fn tells_a_thread_that_could_not_start() {
        let message = "failed to spawn thread: Os { code: 11, kind: WouldBlock, message: \
                       \"Resource temporarily unavailable\" }";
        assert_eq!(
            spawn_failure(message).unwrap().raw_os_error(),
            Some(libc::EAGAIN)
        );
        assert_eq!(
            spawn_failure("failed to spawn thread: odd")
                .unwrap()
                .to_string(),
            "odd"
        );
        assert!(spawn_failure("index out of bounds").is_none());
        let limited = MemoryLimits {
            address_space: Some(100 << 20),
            cgroup: None,
        };
        assert!(spawn_failure_cause(&limited).starts_with(
            "out of memory: tracer's address space is limited to 100.0 MiB (ulimit -v is \
             102400 KiB)"
        ));
        assert!(spawn_failure_cause(&MemoryLimits::default()).contains("ulimit -u"));
    }
}
