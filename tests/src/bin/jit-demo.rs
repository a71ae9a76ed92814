//! `jit-demo`: a "runtime" that compiles one function at run time and announces it in a
//! perf map, as JIT compilers do (`/tmp/perf-PID.map`, one `START SIZE NAME` line per
//! function), so `tracer profile` can be checked to name JIT-compiled frames.
//!
//! ```text
//! jit-demo [--ms D] [--wait-for-signal]
//! ```
//! Default D = 1500.
//!
//! # Protocol
//! As gc-demo: `ready pid=<PID>` on stdout (flushed) once the code is generated and the
//! perf map written, then with `--wait-for-signal` wait for SIGUSR1; then for D ms the
//! main thread calls the generated function `jit_spin_loop` (a count-down loop that keeps
//! the frame-pointer chain, as JIT code must for frame-pointer profilers) from
//! `jit_demo::run_jit`; at the end one JSON line `{"pid":..,"calls":..,"code_start":..}`
//! and exit 0. The perf map is left in place, like a real runtime leaves it.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tests::{Args, announce_ready, print_line};

const USAGE: &str = "usage: jit-demo [--ms D] [--wait-for-signal]";

/// The name the perf map gives the generated function.
const JIT_NAME: &str = "jit_spin_loop";

/// `extern "C" fn(n: u64) -> u64`: counts n down to 0 in a loop, inside a frame that
/// links to its caller's through rbp.
const CODE: [u8; 14] = [
    0x55, // push rbp
    0x48, 0x89, 0xe5, // mov rbp, rsp
    0x48, 0x89, 0xf8, // mov rax, rdi
    0x48, 0xff, 0xc8, // loop: dec rax
    0x75, 0xfb, // jnz loop
    0x5d, // pop rbp
    0xc3, // ret
];

type JitFn = extern "C" fn(u64) -> u64;

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut ms: u64 = 1500;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--ms" => ms = args.value(&flag)?,
            _ => bail!("unknown option {flag}\n{USAGE}"),
        }
    }
    let (function, start) = compile()?;
    let map_path = format!("/tmp/perf-{}.map", std::process::id());
    let mut map = std::fs::File::create(&map_path).with_context(|| map_path.clone())?;
    writeln!(map, "{start:x} {:x} {JIT_NAME}", CODE.len())?;
    drop(map);
    announce_ready(args.wait_for_signal())?;

    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut calls = 0u64;
    while Instant::now() < deadline {
        run_jit(function);
        calls += 1;
    }
    print_line(&format!(
        "{{\"pid\":{},\"calls\":{calls},\"code_start\":{start}}}",
        std::process::id()
    ))
}

/// Calls the generated code for about a millisecond of counting.
#[inline(never)]
fn run_jit(function: JitFn) -> u64 {
    std::hint::black_box(function(std::hint::black_box(1_000_000)))
}

/// Copies [`CODE`] into a fresh page and makes it executable (not writable).
fn compile() -> Result<(JitFn, u64)> {
    const PAGE: usize = 4096;
    // SAFETY: an anonymous private mapping; no existing memory is affected.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error()).context("mmap");
    }
    // SAFETY: the page is ours, writable and PAGE >= CODE.len() bytes long.
    unsafe { std::ptr::copy_nonoverlapping(CODE.as_ptr(), page.cast::<u8>(), CODE.len()) };
    // SAFETY: `page` is the mapping made above.
    if unsafe { libc::mprotect(page, PAGE, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("mprotect");
    }
    // SAFETY: the page holds CODE, a complete function with the C calling convention
    // taking one u64 and returning one, and stays mapped for the life of the process.
    let function = unsafe { std::mem::transmute::<*mut libc::c_void, JitFn>(page) };
    Ok((function, page as u64))
}
