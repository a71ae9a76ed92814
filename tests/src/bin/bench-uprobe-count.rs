//! `bench-uprobe-count`: the bare uprobe trap, for figure 2 of `cargo xtask bench`: the
//! lowest-overhead way to observe a USDT site, with no eBPF program at all.
//!
//! ```text
//! bench-uprobe-count --pid P --path FILE --offset OFF [--offset OFF...] [--semaphore SEM]
//! ```
//! Opens one counting perf event of the kernel's `uprobe` PMU per site (`OFF`: the
//! site's file offset in `FILE`; `SEM`: the file offset of its USDT semaphore, which the
//! kernel then raises while the event exists), bound to process P's main thread. Each hit
//! costs the trap and the kernel's uprobe handling plus a counter increment, nothing more.
//! Prints `Attached ...` on stderr once every event is open, waits for P to exit, then
//! prints `{"count":N}` (all sites added up) on stdout. x86-64 Linux only.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd};

use anyhow::{Context, Result, bail};
use tests::{Args, print_line};

/// Byte offsets in `struct perf_event_attr` (include/uapi/linux/perf_event.h).
const ATTR_TYPE: usize = 0;
const ATTR_SIZE: usize = 4;
const ATTR_CONFIG: usize = 8;
const ATTR_CONFIG1: usize = 56;
const ATTR_CONFIG2: usize = 64;
/// PERF_ATTR_SIZE_VER7; the fields used here are all in the first 72 bytes.
const ATTR_BYTES: usize = 128;
/// PERF_FLAG_FD_CLOEXEC.
const FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

fn parse_number(text: &str) -> Result<u64> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.with_context(|| format!("invalid number {text:?}"))
}

fn uprobe_pmu_type() -> Result<u32> {
    let text = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
        .context("no uprobe PMU (/sys/bus/event_source/devices/uprobe/type)")?;
    Ok(text.trim().parse()?)
}

/// A counting uprobe perf event on `offset` of the file at `path` (a NUL-terminated
/// string that must outlive the call), in thread `pid`.
fn open_uprobe(pmu: u32, path: &[u8], offset: u64, semaphore: u64, pid: i32) -> Result<OwnedFd> {
    let mut attr = [0u8; ATTR_BYTES];
    attr[ATTR_TYPE..ATTR_TYPE + 4].copy_from_slice(&pmu.to_ne_bytes());
    attr[ATTR_SIZE..ATTR_SIZE + 4].copy_from_slice(&(ATTR_BYTES as u32).to_ne_bytes());
    // config bits 32-63: ref_ctr_offset (see /sys/bus/event_source/devices/uprobe/format).
    attr[ATTR_CONFIG..ATTR_CONFIG + 8].copy_from_slice(&(semaphore << 32).to_ne_bytes());
    attr[ATTR_CONFIG1..ATTR_CONFIG1 + 8].copy_from_slice(&(path.as_ptr() as u64).to_ne_bytes());
    attr[ATTR_CONFIG2..ATTR_CONFIG2 + 8].copy_from_slice(&offset.to_ne_bytes());
    // SAFETY: `attr` is a zeroed perf_event_attr of the size it declares, whose config1
    // points to a NUL-terminated path that outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            pid,
            -1,
            -1,
            FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("perf_event_open(uprobe)");
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn read_count(fd: &OwnedFd) -> Result<u64> {
    let mut value = 0u64;
    // SAFETY: reads at most 8 bytes into `value`.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut value).cast(), 8) };
    if n != 8 {
        return Err(io::Error::last_os_error()).context("reading a perf counter");
    }
    Ok(value)
}

/// Blocks until process `pid` exits.
fn wait_for_exit(pid: i32) -> Result<()> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("pidfd_open");
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    loop {
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&raw mut poll, 1, -1) };
        if rc > 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if rc < 0 && err.kind() != io::ErrorKind::Interrupted {
            return Err(err).context("poll(pidfd)");
        }
    }
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut pid: Option<i32> = None;
    let mut path: Option<String> = None;
    let mut offsets = Vec::new();
    let mut semaphore = 0u64;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--pid" => pid = Some(args.value(&flag)?),
            "--path" => path = Some(args.value(&flag)?),
            "--offset" => offsets.push(parse_number(&args.value::<String>(&flag)?)?),
            "--semaphore" => semaphore = parse_number(&args.value::<String>(&flag)?)?,
            _ => bail!("unknown flag {flag}"),
        }
    }
    let (Some(pid), Some(path)) = (pid, path) else {
        bail!("--pid and --path are required");
    };
    if offsets.is_empty() {
        bail!("at least one --offset is required");
    }
    let pmu = uprobe_pmu_type()?;
    let mut c_path = path.clone().into_bytes();
    c_path.push(0);
    let events = offsets
        .iter()
        .map(|&offset| open_uprobe(pmu, &c_path, offset, semaphore, pid))
        .collect::<Result<Vec<_>>>()?;
    eprintln!(
        "Attached {} counting uprobes (no eBPF) to {path} in process {pid}",
        events.len()
    );
    wait_for_exit(pid)?;
    let mut count = 0;
    for event in &events {
        count += read_count(event)?;
    }
    print_line(&format!(r#"{{"count":{count}}}"#))
}
