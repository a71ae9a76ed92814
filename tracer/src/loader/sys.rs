//! The raw syscalls of a load without aya's `EbpfLoader` (see `object.rs`): a uprobe perf
//! event whose semaphore the kernel counts (`ref_ctr_offset`), a BPF link that attaches a
//! program to a perf event with a cookie, CPU_CLOCK sampling events, BTF tracepoint
//! attachment, program loads and global-data maps.

use std::{
    ffi::{CStr, CString},
    io, mem,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{
    bpf_attach_type, bpf_cmd, bpf_insn, bpf_prog_type, perf_event_attr, perf_sw_ids, perf_type_id,
};

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

/// bpf(2) with command `cmd` and `attr`, the member of `union bpf_attr` it takes (the kernel
/// reads `size_of::<T>()` bytes of it).
///
/// # Safety
/// `T` is that member, `repr(C)`, and every pointer in it is valid for the call.
unsafe fn bpf<T>(cmd: bpf_cmd, attr: &T) -> libc::c_long {
    // SAFETY: the caller guarantees `attr`; its size is the one passed.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *const T,
            mem::size_of::<T>() as u32,
        )
    }
}

/// The new fd a syscall returned, or the error it reported.
fn owned_fd(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
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
    owned_fd(fd)
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
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// The `link_create` member of `union bpf_attr` for a uprobe_multi link.
#[repr(C)]
struct LinkCreateUprobeMulti {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
    /// The kernel checks that bytes it does not know are zero; keep room for them.
    _reserved: [u64; 4],
}

/// One uprobe of a uprobe_multi link.
#[derive(Debug, Clone, Copy)]
pub struct MultiUprobe {
    /// File offset of the instruction.
    pub offset: u64,
    /// File offset of the semaphore the kernel counts while attached; 0 for none.
    pub ref_ctr_offset: u64,
    /// What `bpf_get_attach_cookie` returns when it fires.
    pub cookie: u64,
}

/// Attaches a program loaded for `BPF_TRACE_UPROBE_MULTI` to `uprobes` of the ELF file at
/// `path`, in process `pid` only or in every process; closing the returned link removes
/// them all, waiting for the kernel's grace period once rather than once per uprobe.
pub fn link_uprobe_multi(
    prog: BorrowedFd<'_>,
    path: &Path,
    uprobes: &[MultiUprobe],
    pid: Option<u32>,
) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let offsets: Vec<u64> = uprobes.iter().map(|u| u.offset).collect();
    let ref_ctr_offsets: Vec<u64> = uprobes.iter().map(|u| u.ref_ctr_offset).collect();
    let cookies: Vec<u64> = uprobes.iter().map(|u| u.cookie).collect();
    let attr = LinkCreateUprobeMulti {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: 0,
        attach_type: bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        flags: 0,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        ref_ctr_offsets: ref_ctr_offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: uprobes.len() as u32,
        multi_flags: 0,
        pid: pid.unwrap_or(0),
        _pad: 0,
        _reserved: [0; 4],
    };
    // SAFETY: attr is the link_create member; the path and the three arrays it points to
    // (cnt entries each) outlive the call.
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// The `raw_tracepoint` member of `union bpf_attr`.
#[repr(C)]
struct RawTracepointOpen {
    /// 0 for BTF tracepoint programs, which name their tracepoint when loaded.
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}

/// Attaches a loaded BTF tracepoint program to its tracepoint; closing the returned link
/// detaches it.
pub fn attach_btf_tracepoint(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let attr = RawTracepointOpen {
        name: 0,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
        cookie: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix of the size passed, alive for the call.
    let fd = unsafe { bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &attr) };
    owned_fd(fd)
}

/// The `link_create` member of `union bpf_attr` for an iterator.
#[repr(C)]
struct LinkCreateIter {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    /// A `union bpf_iter_link_info`, or 0.
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
}

/// The `task` member of `union bpf_iter_link_info`: which tasks a task iterator visits.
#[repr(C)]
struct IterLinkInfoTask {
    tid: u32,
    /// Every thread of this process (Linux 6.1), in our PID namespace.
    pid: u32,
    pid_fd: u32,
}

/// Links a loaded task iterator program, to visit the threads of process `pid` only or
/// every task. Read it through [`create_iterator`].
pub fn link_task_iterator(prog: BorrowedFd<'_>, pid: Option<u32>) -> io::Result<OwnedFd> {
    let info = IterLinkInfoTask {
        tid: 0,
        pid: pid.unwrap_or(0),
        pid_fd: 0,
    };
    let attr = LinkCreateIter {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: 0,
        attach_type: bpf_attach_type::BPF_TRACE_ITER as u32,
        flags: 0,
        iter_info: if pid.is_some() {
            &info as *const IterLinkInfoTask as u64
        } else {
            0
        },
        iter_info_len: if pid.is_some() {
            mem::size_of::<IterLinkInfoTask>() as u32
        } else {
            0
        },
        _pad: 0,
    };
    // SAFETY: attr is the link_create member; the link info it points to outlives the call.
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// The `iter_create` member of `union bpf_attr`.
#[repr(C)]
struct IterCreate {
    link_fd: u32,
    flags: u32,
}

/// A new run of the iterator `link`: reading the returned file runs the program over
/// every object it visits and returns what the program wrote.
pub fn create_iterator(link: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let attr = IterCreate {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix of the size passed, alive for the call.
    let fd = unsafe { bpf(bpf_cmd::BPF_ITER_CREATE, &attr) };
    owned_fd(fd)
}

/// Opens a CPU_CLOCK software event on `cpu` for every process, sampling `frequency_hz`
/// times per second of CPU time; it runs the program linked to it at each sample.
pub fn open_cpu_clock(cpu: u32, frequency_hz: u64) -> io::Result<OwnedFd> {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: perf_event_attr = unsafe { mem::zeroed() };
    attr.type_ = perf_type_id::PERF_TYPE_SOFTWARE as u32;
    attr.size = mem::size_of::<perf_event_attr>() as u32;
    attr.config = perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64;
    attr.__bindgen_anon_1.sample_freq = frequency_hz;
    attr.set_freq(1);
    // SAFETY: attr is a valid perf_event_attr that outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned_fd(fd)
}

/// The `prog_load` member of `union bpf_attr`, up to `attach_btf_obj_fd`.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    /// 0: `attach_btf_id` is a type of vmlinux.
    attach_btf_obj_fd: u32,
    /// The kernel checks that bytes it does not know are zero; keep room for them.
    _reserved: [u64; 8],
}

/// What kind of program a load creates.
#[derive(Debug, Clone, Copy)]
pub struct ProgramKind {
    pub prog_type: bpf_prog_type,
    pub expected_attach_type: Option<bpf_attach_type>,
    /// The kernel type a tracing program is verified against.
    pub attach_btf_id: Option<u32>,
}

/// Loads a program without BTF of its own (the kernel verifies it here). On a verifier
/// rejection the load is repeated with a log, whose tail is returned in the error.
pub fn load_program(
    kind: &ProgramKind,
    name: &str,
    insns: &[bpf_insn],
    license: &CStr,
) -> io::Result<OwnedFd> {
    let mut prog_name = [0u8; 16];
    // The kernel takes at most 15 bytes and a NUL.
    let len = name.len().min(prog_name.len() - 1);
    prog_name[..len].copy_from_slice(&name.as_bytes()[..len]);
    let attempt = |log: Option<&mut Vec<u8>>| {
        let (log_level, log_size, log_buf) = match log {
            Some(log) => (1, log.len() as u32, log.as_mut_ptr() as u64),
            None => (0, 0, 0),
        };
        let attr = ProgLoad {
            prog_type: kind.prog_type as u32,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level,
            log_size,
            log_buf,
            kern_version: 0,
            prog_flags: 0,
            prog_name,
            prog_ifindex: 0,
            expected_attach_type: kind.expected_attach_type.map_or(0, |t| t as u32),
            prog_btf_fd: 0,
            func_info_rec_size: 0,
            func_info: 0,
            func_info_cnt: 0,
            line_info_rec_size: 0,
            line_info: 0,
            line_info_cnt: 0,
            attach_btf_id: kind.attach_btf_id.unwrap_or(0),
            attach_btf_obj_fd: 0,
            _reserved: [0; 8],
        };
        // SAFETY: attr is a valid bpf_attr prefix of the size passed; the instructions,
        // license and log buffer it points to outlive the call.
        let fd = unsafe { bpf(bpf_cmd::BPF_PROG_LOAD, &attr) };
        owned_fd(fd)
    };
    attempt(None).or_else(|error| {
        if error.raw_os_error() != Some(libc::EACCES) && error.raw_os_error() != Some(libc::EINVAL)
        {
            return Err(error);
        }
        let mut log = vec![0u8; 1 << 20];
        match attempt(Some(&mut log)) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let text = CStr::from_bytes_until_nul(&log)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(io::Error::new(
                    error.kind(),
                    format!("{error}; verifier log (end):\n{}", tail.join("\n")),
                ))
            }
        }
    })
}

/// The `map_elem` member of `union bpf_attr`.
#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn map_command(cmd: bpf_cmd, attr: &MapElem) -> io::Result<()> {
    // SAFETY: attr is a valid bpf_attr prefix of the size passed; what it points to
    // outlives the call.
    let ret = unsafe { bpf(cmd, attr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes the single value of a global-data map (`.rodata`, `.data`, `.bss`) and, for
/// read-only data, freezes it so the verifier may treat it as constants.
pub fn fill_data_map(map: BorrowedFd<'_>, value: &[u8], freeze: bool) -> io::Result<()> {
    let key = 0u32;
    let fd = map.as_raw_fd() as u32;
    map_command(
        bpf_cmd::BPF_MAP_UPDATE_ELEM,
        &MapElem {
            map_fd: fd,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: value.as_ptr() as u64,
            flags: 0,
        },
    )?;
    if freeze {
        map_command(
            bpf_cmd::BPF_MAP_FREEZE,
            &MapElem {
                map_fd: fd,
                _pad: 0,
                key: 0,
                value: 0,
                flags: 0,
            },
        )?;
    }
    Ok(())
}
