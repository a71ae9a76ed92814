//! The raw syscalls aya does not offer: a uprobe perf event whose semaphore the kernel
//! counts (`ref_ctr_offset`), and a BPF link that attaches a program to it with a cookie.

use std::{
    ffi::CString,
    io, mem,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{bpf_attach_type, bpf_cmd, perf_event_attr};

const UPROBE_PMU_TYPE: &str = "/sys/bus/event_source/devices/uprobe/type";
const UPROBE_REF_CTR_FORMAT: &str = "/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset";
/// From linux/perf_event.h (the libc crate does not define it).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// The uprobe PMU takes the semaphore's file offset in config bits 32-63.
const REF_CTR_OFFSET_SHIFT: u32 = 32;

/// Where to place one uprobe.
#[derive(Debug, Clone)]
pub struct UprobeTarget<'a> {
    /// The ELF file, as this process can open it.
    pub path: &'a Path,
    /// File offset of the instruction.
    pub offset: u64,
    /// File offset of the USDT semaphore the kernel should increment while attached.
    pub ref_ctr_offset: Option<u64>,
    /// Only this process, or every process that maps the file.
    pub pid: Option<u32>,
}

/// The perf event type of the uprobe PMU.
pub fn uprobe_pmu_type() -> io::Result<u32> {
    let text = std::fs::read_to_string(UPROBE_PMU_TYPE).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{UPROBE_PMU_TYPE}: {e} (kernel without CONFIG_UPROBES?)"),
        )
    })?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad uprobe PMU type"))
}

/// Whether the kernel can count USDT semaphores itself.
pub fn supports_ref_ctr_offset() -> bool {
    Path::new(UPROBE_REF_CTR_FORMAT).exists()
}

/// Opens a uprobe perf event. The returned fd keeps the probe (and its semaphore
/// increment) alive; closing it removes both, even when this process is killed.
pub fn open_uprobe(pmu_type: u32, target: &UprobeTarget<'_>) -> io::Result<OwnedFd> {
    let path = CString::new(target.path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: perf_event_attr = unsafe { mem::zeroed() };
    attr.type_ = pmu_type;
    attr.size = mem::size_of::<perf_event_attr>() as u32;
    attr.config = target.ref_ctr_offset.unwrap_or(0) << REF_CTR_OFFSET_SHIFT;
    attr.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = target.offset;
    let (pid, cpu) = match target.pid {
        Some(pid) => (pid as libc::pid_t, -1),
        // A uprobe for every process is opened on one CPU and fires on all of them.
        None => (-1, 0),
    };
    // SAFETY: attr is a valid perf_event_attr that outlives the call, and `path` (which
    // config1 points to) lives until after it returns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The `link_create` member of `union bpf_attr` for a perf event target.
#[repr(C)]
struct LinkCreatePerfEvent {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
    /// The kernel checks that bytes it does not know are zero; keep room for them.
    _reserved: [u64; 8],
}

/// Attaches a loaded kprobe-type program to a perf event, passing `cookie` to every run.
pub fn link_perf_event(
    prog: BorrowedFd<'_>,
    perf_event: BorrowedFd<'_>,
    cookie: u64,
) -> io::Result<OwnedFd> {
    let attr = LinkCreatePerfEvent {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: perf_event.as_raw_fd() as u32,
        attach_type: bpf_attach_type::BPF_PERF_EVENT as u32,
        flags: 0,
        bpf_cookie: cookie,
        _reserved: [0; 8],
    };
    // SAFETY: attr is a valid bpf_attr prefix of the size passed, alive for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_LINK_CREATE as libc::c_long,
            &attr as *const LinkCreatePerfEvent,
            mem::size_of::<LinkCreatePerfEvent>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
