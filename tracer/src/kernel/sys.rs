//! The raw syscalls of a load without aya's `EbpfLoader` (see `object.rs`): a uprobe perf
//! event whose semaphore the kernel counts (`ref_ctr_offset`), a BPF link that attaches a
//! program to a perf event with a cookie, uprobe_multi links with `ref_ctr_offsets` (aya's
//! attach passes none, and the kernel-counted semaphores need them), CPU_CLOCK sampling
//! events, BTF tracepoint attachment, task iterators, program loads and global-data maps.
//!
//! Every `bpf(2)` argument is a `union bpf_attr` from `aya_obj::generated`, zeroed and then
//! filled in, so no kernel struct is copied by hand (except `bpf_iter_link_info`, which
//! those bindings lack).

use std::{
    ffi::{CStr, CString},
    io, mem,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_info, bpf_prog_type, perf_event_attr,
    perf_sw_ids, perf_type_id,
};

const UPROBE_PMU_TYPE: &str = "/sys/bus/event_source/devices/uprobe/type";
/// From linux/perf_event.h (the libc crate does not define it).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// The uprobe PMU takes the semaphore's file offset in config bits 32-63.
const REF_CTR_OFFSET_SHIFT: u32 = 32;

/// Where to place one uprobe.
#[derive(Debug, Clone)]
pub(super) struct UprobeTarget<'a> {
    /// The ELF file, as this process can open it.
    pub path: &'a Path,
    /// File offset of the instruction.
    pub offset: u64,
    /// File offset of the USDT semaphore the kernel should increment while attached.
    pub ref_ctr_offset: Option<u64>,
    /// Only this process, or every process that maps the file.
    pub pid: Option<u32>,
}

/// bpf(2) with command `cmd` and `attr`, filled in for that command.
///
/// # Safety
/// Every pointer in `attr` that `cmd` reads or writes is valid for the call.
unsafe fn bpf(cmd: bpf_cmd, attr: &bpf_attr) -> libc::c_long {
    // SAFETY: the caller guarantees the pointers in `attr`; its size is the one passed
    // (the kernel checks that bytes it does not know are zero, and zeroed() made them so).
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_ref::<bpf_attr>(attr),
            mem::size_of::<bpf_attr>() as u32,
        )
    }
}

/// An all-zero `union bpf_attr`: every command's defaults.
fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is plain integers; all-zero is what the kernel expects unset.
    unsafe { mem::zeroed() }
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
pub(super) fn uprobe_pmu_type() -> io::Result<u32> {
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

/// Opens a uprobe perf event. The returned fd keeps the probe (and its semaphore
/// increment) alive; closing it removes both, even when this process is killed.
pub(super) fn open_uprobe(pmu_type: u32, target: &UprobeTarget<'_>) -> io::Result<OwnedFd> {
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
            &raw const attr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned_fd(fd)
}

/// Attaches a loaded kprobe-type program to a perf event, passing `cookie` to every run.
pub(super) fn link_perf_event(
    prog: BorrowedFd<'_>,
    perf_event: BorrowedFd<'_>,
    cookie: u64,
) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    // SAFETY: writing members of a zeroed union of plain integers.
    unsafe {
        let link = &mut attr.link_create;
        link.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
        link.__bindgen_anon_2.target_fd = perf_event.as_raw_fd() as u32;
        link.attach_type = bpf_attach_type::BPF_PERF_EVENT as u32;
        link.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    }
    // SAFETY: the attr holds no pointers.
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// One uprobe of a uprobe_multi link.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MultiUprobe {
    /// File offset of the instruction.
    pub offset: u64,
    /// File offset of the semaphore the kernel counts while attached; 0 for none.
    pub ref_ctr_offset: u64,
    /// What `bpf_get_attach_cookie` returns when it fires.
    pub cookie: u64,
}

/// `BPF_F_UPROBE_MULTI_RETURN`: the uprobes fire at the functions' returns.
const UPROBE_MULTI_RETURN: u32 = 1;

/// Attaches a program loaded for `BPF_TRACE_UPROBE_MULTI` to `uprobes` of the ELF file at
/// `path` (to the returns of the functions they are at, with `ret`), in process `pid`
/// only or in every process; closing the returned link removes them all, waiting for the
/// kernel's grace period once rather than once per uprobe.
pub(super) fn link_uprobe_multi(
    prog: BorrowedFd<'_>,
    path: &Path,
    uprobes: &[MultiUprobe],
    pid: Option<u32>,
    ret: bool,
) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let offsets: Vec<u64> = uprobes.iter().map(|u| u.offset).collect();
    let ref_ctr_offsets: Vec<u64> = uprobes.iter().map(|u| u.ref_ctr_offset).collect();
    let cookies: Vec<u64> = uprobes.iter().map(|u| u.cookie).collect();
    let mut attr = zeroed_attr();
    // SAFETY: writing members of a zeroed union of plain integers.
    unsafe {
        let link = &mut attr.link_create;
        link.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
        link.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
        let multi = &mut link.__bindgen_anon_3.uprobe_multi;
        multi.path = path.as_ptr() as u64;
        multi.offsets = offsets.as_ptr() as u64;
        multi.ref_ctr_offsets = ref_ctr_offsets.as_ptr() as u64;
        multi.cookies = cookies.as_ptr() as u64;
        multi.cnt = uprobes.len() as u32;
        multi.pid = pid.unwrap_or(0);
        multi.flags = if ret { UPROBE_MULTI_RETURN } else { 0 };
    }
    // SAFETY: the path and the three arrays attr points to (cnt entries each) outlive the
    // call.
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// Attaches a loaded BTF tracepoint program to its tracepoint; closing the returned link
/// detaches it.
pub(super) fn attach_btf_tracepoint(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    // The name stays 0: a BTF tracepoint program named its tracepoint when it was loaded.
    attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    // SAFETY: the attr holds no pointers.
    let fd = unsafe { bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &attr) };
    owned_fd(fd)
}

/// The `task` member of `union bpf_iter_link_info`: which tasks a task iterator visits
/// (written here: `aya_obj::generated` has no `bpf_iter_link_info`).
#[repr(C)]
struct IterLinkInfoTask {
    tid: u32,
    /// Every thread of this process (Linux 6.1), in our PID namespace.
    pid: u32,
    pid_fd: u32,
}

/// Links a loaded task iterator program, to visit the threads of process `pid` only or
/// every task. Read it through [`create_iterator`].
pub(super) fn link_task_iterator(prog: BorrowedFd<'_>, pid: Option<u32>) -> io::Result<OwnedFd> {
    let info = IterLinkInfoTask {
        tid: 0,
        pid: pid.unwrap_or(0),
        pid_fd: 0,
    };
    let mut attr = zeroed_attr();
    // SAFETY: writing members of a zeroed union of plain integers.
    unsafe {
        let link = &mut attr.link_create;
        link.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
        link.attach_type = bpf_attach_type::BPF_TRACE_ITER as u32;
        if pid.is_some() {
            let iter = &mut link.__bindgen_anon_3.__bindgen_anon_1;
            iter.iter_info = &raw const info as u64;
            iter.iter_info_len = mem::size_of::<IterLinkInfoTask>() as u32;
        }
    }
    // SAFETY: the link info attr points to outlives the call.
    let fd = unsafe { bpf(bpf_cmd::BPF_LINK_CREATE, &attr) };
    owned_fd(fd)
}

/// A new run of the iterator `link`: reading the returned file runs the program over
/// every object it visits and returns what the program wrote.
pub(super) fn create_iterator(link: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.iter_create.link_fd = link.as_raw_fd() as u32;
    // SAFETY: the attr holds no pointers.
    let fd = unsafe { bpf(bpf_cmd::BPF_ITER_CREATE, &attr) };
    owned_fd(fd)
}

/// Opens a CPU_CLOCK software event on `cpu` for every process, sampling `frequency_hz`
/// times per second of CPU time; it runs the program linked to it at each sample.
pub(super) fn open_cpu_clock(cpu: u32, frequency_hz: u64) -> io::Result<OwnedFd> {
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
            &raw const attr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned_fd(fd)
}

/// Opens tracepoint `id` (from tracefs) for every process, to link a program to: the
/// program runs at each hit, on any CPU.
pub(super) fn open_tracepoint(id: u64) -> io::Result<OwnedFd> {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: perf_event_attr = unsafe { mem::zeroed() };
    attr.type_ = perf_type_id::PERF_TYPE_TRACEPOINT as u32;
    attr.size = mem::size_of::<perf_event_attr>() as u32;
    attr.config = id;
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    // SAFETY: attr is a valid perf_event_attr that outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1 as libc::pid_t,
            0 as libc::c_int,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned_fd(fd)
}

/// Opens a perf event described by `attr` on thread `tid` alone, on any CPU.
pub(super) fn open_thread_event(attr: &perf_event_attr, tid: u32) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid perf_event_attr that outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            std::ptr::from_ref::<perf_event_attr>(attr),
            tid as libc::pid_t,
            -1 as libc::c_int,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    owned_fd(fd)
}

/// What kind of program a load creates.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProgramKind {
    pub prog_type: bpf_prog_type,
    pub expected_attach_type: Option<bpf_attach_type>,
    /// The kernel type a tracing program is verified against.
    pub attach_btf_id: Option<u32>,
}

/// How many times more a program load interrupted by a signal is made.
const LOAD_ATTEMPTS_ON_SIGNAL: usize = 5;

/// Loads a program without BTF of its own (the kernel verifies it here). On a verifier
/// rejection the load is repeated with a log, whose tail is returned in the error.
pub(super) fn load_program(
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
        let mut attr = zeroed_attr();
        // SAFETY: writing members of a zeroed union of plain integers. No BTF of the
        // program's own; attach_btf_obj_fd stays 0: attach_btf_id is a type of vmlinux.
        unsafe {
            let load = &mut attr.__bindgen_anon_3;
            load.prog_type = kind.prog_type as u32;
            load.insn_cnt = insns.len() as u32;
            load.insns = insns.as_ptr() as u64;
            load.license = license.as_ptr() as u64;
            load.log_level = log_level;
            load.log_size = log_size;
            load.log_buf = log_buf;
            for (to, &from) in load.prog_name.iter_mut().zip(&prog_name) {
                *to = from as libc::c_char;
            }
            load.expected_attach_type = kind.expected_attach_type.map_or(0, |t| t as u32);
            load.attach_btf_id = kind.attach_btf_id.unwrap_or(0);
        }
        // SAFETY: the instructions, license and log buffer attr points to outlive the call.
        let fd = unsafe { bpf(bpf_cmd::BPF_PROG_LOAD, &attr) };
        owned_fd(fd)
    };
    // EAGAIN: a signal came while the verifier ran (a child stopping sends SIGCHLD), and
    // the kernel gave up on the load; libbpf repeats it too.
    let mut first = attempt(None);
    for _ in 0..LOAD_ATTEMPTS_ON_SIGNAL {
        match &first {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => first = attempt(None),
            _ => break,
        }
    }
    first.or_else(|error| {
        // E2BIG: the verifier gave up on a program too complex to check.
        let rejected = [libc::EACCES, libc::EINVAL, libc::E2BIG];
        if !error.raw_os_error().is_some_and(|e| rejected.contains(&e)) {
            return Err(error);
        }
        let mut log = vec![0u8; 1 << 20];
        if let Ok(fd) = attempt(Some(&mut log)) {
            Ok(fd)
        } else {
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
    })
}

/// A map command on `map`'s element at `key` (null: none), with `value`.
fn map_command(cmd: bpf_cmd, map: u32, key: u64, value: u64) -> io::Result<()> {
    let mut attr = zeroed_attr();
    // SAFETY: writing members of a zeroed union of plain integers.
    unsafe {
        let elem = &mut attr.__bindgen_anon_2;
        elem.map_fd = map;
        elem.key = key;
        elem.__bindgen_anon_1.value = value;
    }
    // SAFETY: the caller's key and value pointers outlive the call.
    let ret = unsafe { bpf(cmd, &attr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes the single value of a global-data map (`.rodata`, `.data`, `.bss`) and, for
/// read-only data, freezes it so the verifier may treat it as constants.
pub(super) fn fill_data_map(map: BorrowedFd<'_>, value: &[u8], freeze: bool) -> io::Result<()> {
    let key = 0u32;
    let fd = map.as_raw_fd() as u32;
    map_command(
        bpf_cmd::BPF_MAP_UPDATE_ELEM,
        fd,
        &raw const key as u64,
        value.as_ptr() as u64,
    )?;
    if freeze {
        map_command(bpf_cmd::BPF_MAP_FREEZE, fd, 0, 0)?;
    }
    Ok(())
}

/// The kernel's id of loaded program `prog` (what `bpftool prog` lists).
pub(super) fn program_id(prog: BorrowedFd<'_>) -> io::Result<u32> {
    program_info(prog).map(|info| info.id)
}

/// How many times the kernel skipped program `prog` because it was already running on
/// that CPU (`recursion_misses`, as `bpftool prog` shows them).
pub(super) fn program_misses(prog: BorrowedFd<'_>) -> io::Result<u64> {
    program_info(prog).map(|info| info.recursion_misses)
}

fn program_info(prog: BorrowedFd<'_>) -> io::Result<bpf_prog_info> {
    // SAFETY: bpf_prog_info is plain integers and pointers the kernel only fills when their
    // lengths are set; all-zero asks for the fixed part alone.
    let mut info: bpf_prog_info = unsafe { mem::zeroed() };
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = prog.as_raw_fd() as u32;
    attr.info.info_len = mem::size_of::<bpf_prog_info>() as u32;
    attr.info.info = &raw mut info as u64;
    // SAFETY: `info` is writable for info_len bytes and outlives the call.
    let ret = unsafe { bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &attr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// The keys of a hash map of `u32` keys (the kernel's order; keys removed meanwhile may
/// end the walk early).
pub(super) fn hash_keys_u32(map: BorrowedFd<'_>) -> Vec<u32> {
    let mut keys = Vec::new();
    let mut next = 0u32;
    let mut at: Option<u32> = None;
    while keys.len() < 1 << 20 {
        let key = at
            .as_ref()
            .map_or(0, |k| std::ptr::from_ref::<u32>(k) as u64);
        let got = map_command(
            bpf_cmd::BPF_MAP_GET_NEXT_KEY,
            map.as_raw_fd() as u32,
            key,
            &raw mut next as u64,
        );
        if got.is_err() {
            break;
        }
        keys.push(next);
        at = Some(next);
    }
    keys
}

/// The value of `key` in a hash map of `u32` keys and values.
pub(super) fn hash_lookup_u32(map: BorrowedFd<'_>, key: u32) -> Option<u32> {
    let mut value = 0u32;
    map_command(
        bpf_cmd::BPF_MAP_LOOKUP_ELEM,
        map.as_raw_fd() as u32,
        &raw const key as u64,
        &raw mut value as u64,
    )
    .ok()
    .map(|()| value)
}

/// Entries asked for per `BPF_MAP_LOOKUP_BATCH` at first (doubled while a bucket holds
/// more).
const LOOKUP_BATCH: usize = 256;

/// `bpf(2)` with an attr the kernel writes back into (the batch commands' `count`).
fn bpf_in_out(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<()> {
    // SAFETY: the caller's attr pointers are valid for the call; the kernel writes only
    // into `attr` and the buffers it points to, all ours and mutable.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut::<bpf_attr>(attr),
            mem::size_of::<bpf_attr>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Every entry of hash map `map` (not per-CPU: one value per key), read a batch at a
/// time with `BPF_MAP_LOOKUP_BATCH`: a call per batch, where a walk key by key takes two
/// per entry. An error where the kernel cannot (the caller then walks the keys).
pub(super) fn hash_entries<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
) -> io::Result<Vec<(K, V)>> {
    let mut entries = Vec::new();
    // The kernel's place in the map (a bucket index for a hash map), given back to it.
    let (mut at, mut next) = (0u64, 0u64);
    let mut first = true;
    let mut capacity = LOOKUP_BATCH;
    loop {
        let mut keys: Vec<mem::MaybeUninit<K>> = vec![mem::MaybeUninit::uninit(); capacity];
        let mut values: Vec<mem::MaybeUninit<V>> = vec![mem::MaybeUninit::uninit(); capacity];
        let mut attr = zeroed_attr();
        // SAFETY: writing members of a zeroed union of plain integers.
        unsafe {
            let batch = &mut attr.batch;
            batch.in_batch = if first { 0 } else { &raw const at as u64 };
            batch.out_batch = &raw mut next as u64;
            batch.keys = keys.as_mut_ptr() as u64;
            batch.values = values.as_mut_ptr() as u64;
            batch.count = capacity as u32;
            batch.map_fd = map.as_raw_fd() as u32;
        }
        let result = bpf_in_out(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        let done = match &result {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            // A bucket holds more entries than fit: ask for more at once.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && capacity < 1 << 20 => {
                capacity *= 2;
                continue;
            }
            Err(_) => return result.map(|()| Vec::new()),
        };
        // SAFETY: reading back the count the kernel wrote.
        let count = (unsafe { attr.batch.count } as usize).min(capacity);
        entries.extend(keys[..count].iter().zip(&values[..count]).map(|(k, v)| {
            // SAFETY: the kernel filled the first `count` keys and values; K and V are
            // plain data, valid for any bytes.
            unsafe { (k.assume_init(), v.assume_init()) }
        }));
        if done {
            return Ok(entries);
        }
        at = next;
        first = false;
    }
}

/// Sets `entries` in hash map `map` in one `BPF_MAP_UPDATE_BATCH` call. An error where
/// the kernel cannot (the caller then sets them one by one).
pub(super) fn hash_update<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> io::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = zeroed_attr();
    // SAFETY: writing members of a zeroed union of plain integers.
    unsafe {
        let batch = &mut attr.batch;
        batch.keys = keys.as_ptr() as u64;
        batch.values = values.as_ptr() as u64;
        batch.count = keys.len().min(values.len()) as u32;
        batch.map_fd = map.as_raw_fd() as u32;
    }
    bpf_in_out(bpf_cmd::BPF_MAP_UPDATE_BATCH, &mut attr)
}

/// Removes `key` from a hash map of `u32` keys.
pub(super) fn hash_delete_u32(map: BorrowedFd<'_>, key: u32) -> io::Result<()> {
    map_command(
        bpf_cmd::BPF_MAP_DELETE_ELEM,
        map.as_raw_fd() as u32,
        &raw const key as u64,
        0,
    )
}

/// Pins BPF object `fd` (a link, a map) at `path` in a BPF filesystem: the object lives
/// on, whoever closes its descriptors, until the pin is removed.
pub(super) fn pin_object(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    attr.__bindgen_anon_4.bpf_fd = fd.as_raw_fd() as u32;
    // SAFETY: the path outlives the call.
    let ret = unsafe { bpf(bpf_cmd::BPF_OBJ_PIN, &attr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new descriptor of the BPF object pinned at `path`.
pub(super) fn pinned_object(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    // SAFETY: the path outlives the call.
    owned_fd(unsafe { bpf(bpf_cmd::BPF_OBJ_GET, &attr) })
}

/// What a uprobe_multi link is attached to, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UprobeMultiLinkInfo {
    /// The file the uprobes are in.
    pub path: std::path::PathBuf,
    /// How many uprobes.
    pub count: u32,
    /// The one process they fire in, or 0 for every process.
    pub pid: u32,
}

/// The file, uprobe count and process of uprobe_multi link `link`.
pub(super) fn uprobe_multi_link_info(link: BorrowedFd<'_>) -> io::Result<UprobeMultiLinkInfo> {
    // SAFETY: bpf_link_info is plain integers and pointers; all-zero asks for nothing
    // beyond the fixed part but the path buffer set below.
    let mut info: aya_obj::generated::bpf_link_info = unsafe { mem::zeroed() };
    let mut path = vec![0u8; libc::PATH_MAX as usize];
    info.__bindgen_anon_1.uprobe_multi.path = path.as_mut_ptr() as u64;
    info.__bindgen_anon_1.uprobe_multi.path_size = path.len() as u32;
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = link.as_raw_fd() as u32;
    attr.info.info_len = mem::size_of_val(&info) as u32;
    attr.info.info = &raw mut info as u64;
    // SAFETY: `info` and the path buffer are writable for their lengths and outlive the call.
    let ret = unsafe { bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &attr) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if info.type_ != aya_obj::generated::bpf_link_type::BPF_LINK_TYPE_UPROBE_MULTI as u32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a uprobe_multi link",
        ));
    }
    // SAFETY: the kernel filled the uprobe_multi member of a uprobe_multi link's info.
    let multi = unsafe { info.__bindgen_anon_1.uprobe_multi };
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    path.truncate(end);
    Ok(UprobeMultiLinkInfo {
        path: std::path::PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(path),
        ),
        count: multi.count,
        pid: multi.pid,
    })
}

/// Sets element `index` of an array map of `u32` values.
pub(super) fn array_set_u32(map: BorrowedFd<'_>, index: u32, value: u32) -> io::Result<()> {
    map_command(
        bpf_cmd::BPF_MAP_UPDATE_ELEM,
        map.as_raw_fd() as u32,
        &raw const index as u64,
        &raw const value as u64,
    )
}
