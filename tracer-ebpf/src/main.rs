//! The tracer's eBPF programs. Entry points are thin: they call into `usdt`, `offcpu`,
//! `oncpu` and `tasks`, which aggregate into the maps declared here (`args` decodes USDT
//! arguments, `stacks` takes stack ids). Names match
//! `tracer_common::map_names` and `tracer_common::program_names`.
#![no_std]
#![no_main]
// Atomic adds whose result is unused, which the BPF target's atomic types do not offer.
#![allow(internal_features)]
#![feature(core_intrinsics)]
// Kernel structures are read at the offsets BTF gives, which the kernel aligns; the
// verifier rejects a misaligned access at load time.
#![allow(clippy::cast_ptr_alignment)]

mod args;
mod offcpu;
mod oncpu;
mod python;
mod snapshot;
mod stacks;
mod targets;
mod tasks;
mod threads;
mod usdt;

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    macros::{btf_tracepoint, map, perf_event, tracepoint, uprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
    programs::{BtfTracePointContext, PerfEventContext, ProbeContext, TracePointContext},
};
use tracer_common::{
    BlockPlace, HitStackKey, KernelStack, LastSnapshot, LastUserStack, LatencyProcessKey,
    LatencyStart, LatencyStartKey, LatencyStats, MAX_LATENCIES, MAX_PROBES, MAX_USDT_SITES,
    OffCpuKey, OffCpuStart, OffCpuTotal, OnCpuKey, ProbeHits, ProcessMetricKey, STACK_WORDS_SPAN,
    SnapshotCheck, TargetProcess, TaskId, TaskKey, TaskName, TaskState, TaskTotal, TaskWallKey,
    ThreadTask, TimelineEvent, UsdtSite, UsdtStrEvent, control, counter, histogram,
    python::{PythonProcess, PythonStack, PythonThread},
};

/// Per-site argument specs and latency roles, indexed by the uprobe's BPF cookie.
#[map]
static USDT_SPECS: Array<UsdtSite> = Array::with_max_entries(MAX_USDT_SITES, 0);

/// Probe hits for `tracer trace`. User space may resize it before load.
#[map]
static USDT_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// Where an event with strings is assembled before it goes to `USDT_EVENTS`.
#[map]
static USDT_STR_SCRATCH: PerCpuArray<UsdtStrEvent> = PerCpuArray::with_max_entries(1, 0);

/// Entries allocated when inserted rather than all when the map is created, for the one
/// hash map the first USDT events wait for (the others are created meanwhile, see
/// `DEFERRED_MAPS` in the loader, and keep the faster preallocated inserts).
const NO_PREALLOC: u32 = aya_ebpf::bindings::BPF_F_NO_PREALLOC;

/// Start times of latencies open on a thread.
#[map]
static LATENCY_STARTS: HashMap<LatencyStartKey, LatencyStart> =
    HashMap::with_max_entries(16384, NO_PREALLOC);

/// Log-linear buckets of every latency: `latency_id * BUCKETS + bucket`. One array shared
/// by the CPUs (counted with atomic adds), not a per-CPU one: the kernel allocates a
/// per-CPU array's memory element by element, and thousands of allocations were
/// milliseconds of every launch, before its first event.
#[map]
static LATENCY_HIST: Array<u64> = Array::with_max_entries(MAX_LATENCIES * histogram::BUCKETS, 0);

/// Count, total, min and max of every latency.
#[map]
static LATENCY_STATS: PerCpuArray<LatencyStats> = PerCpuArray::with_max_entries(MAX_LATENCIES, 0);

/// Count, total, min and max of every latency in each process (allocated as processes
/// come: most runs have one).
#[map]
static LATENCY_BY_PROCESS: PerCpuHashMap<LatencyProcessKey, LatencyStats> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// Each process's figures for `--metrics` (see `tracer_common::process_metric`), with
/// `PROCESS_METRICS_ON` on: its latencies by histogram bucket (sparse: a few buckets
/// each) and their total, and its time off CPU. User space removes exited processes'.
#[map]
static PROCESS_METRICS: HashMap<ProcessMetricKey, u64> =
    HashMap::with_max_entries(65536, NO_PREALLOC);

/// Hits by probe, process and stacks (`trace --count --stack`); one entry unless user
/// space sizes it before load. Per CPU: two CPUs may count the same stack at once.
#[map]
static HIT_STACKS: PerCpuHashMap<HitStackKey, u64> =
    PerCpuHashMap::with_max_entries(16384, NO_PREALLOC);

/// The processes traced, when more than one can be (see `targets`).
#[map]
static TARGETS: HashMap<u32, TargetProcess> = HashMap::with_max_entries(16384, 0);

/// Traced processes held at `_dl_debug_state`: stopped until user space has attached
/// what they mapped and continues them (see `targets::hold`).
#[map]
static HELD: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Traced processes seen mapping code or starting a program (or at `_dl_debug_state`
/// when not held) since user space last looked at their maps. Kept apart from `HELD`:
/// user space taking a process off this list never takes off a hold recorded meanwhile.
#[map]
static MAPPED_CODE: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// A process's tgid each time it is newly recorded in `HELD` or `MAPPED_CODE`: user space
/// waits on this ring instead of polling them, so a process that maps nothing costs it
/// nothing.
#[map]
static HELD_NOTICES: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Hits per probe id, whatever else the probe does.
#[map]
static PROBE_HITS: PerCpuArray<ProbeHits> = PerCpuArray::with_max_entries(MAX_PROBES, 0);

/// Each traced thread's last switch out: when it left and where; `ts_ns` is
/// `OFFCPU_START_ENDED` once it came back (the entry stays until the thread dies).
#[map]
static OFFCPU_STARTS: HashMap<u32, OffCpuStart> = HashMap::with_max_entries(65536, 0);

/// Off-CPU time by thread and stacks.
#[map]
static OFFCPU_TIME: HashMap<OffCpuKey, OffCpuTotal> = HashMap::with_max_entries(65536, 0);

/// On-CPU samples by thread and stacks.
#[map]
static ONCPU_SAMPLES: HashMap<OnCpuKey, u64> = HashMap::with_max_entries(65536, 0);

/// Runtime tasks: what each is doing since when.
#[map]
static TASK_STATES: HashMap<TaskId, TaskState> = HashMap::with_max_entries(65536, 0);

/// Running and parked time per task (parked time by the stack where it parked).
#[map]
static TASK_TIME: HashMap<TaskKey, TaskTotal> = HashMap::with_max_entries(65536, 0);

/// The task each thread runs right now (between its run and pause probes).
#[map]
static THREAD_TASKS: HashMap<u32, ThreadTask> = HashMap::with_max_entries(65536, 0);

/// Threads' on-CPU samples and off-CPU time while they ran a task, by task and stacks.
#[map]
static TASK_WALL: HashMap<TaskWallKey, OffCpuTotal> = HashMap::with_max_entries(65536, 0);

/// What runtimes called their tasks; the least recently named give way in a long run of
/// short tasks.
#[map]
static TASK_NAMES: LruHashMap<TaskId, TaskName> = LruHashMap::with_max_entries(65536, 0);

/// Intervals with their start and end, for `attach --timeline`; one page unless user space
/// sizes it before load.
#[map]
static TIMELINE: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Sends one interval to `TIMELINE` when the timeline is on (counted when it is full).
#[inline(always)]
fn timeline(event: &TimelineEvent) {
    if setting(&TIMELINE_ON) == 0 {
        return;
    }
    if TIMELINE.output(event, 0).is_err() {
        count(counter::TIMELINE_LOST);
    }
}

/// User and kernel stacks referenced by id.
#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(32768, 0);

/// On-CPU samples' user registers and stack bytes, for DWARF unwinding in user space. One
/// page unless user space sizes it before load (`tracer profile --unwind dwarf`).
#[map]
static UNWIND_SAMPLES: RingBuf = RingBuf::with_byte_size(4096, 0);

/// The last off-CPU snapshot of each thread (`sched_switch_dwarf`); one entry unless
/// user space sizes it before load.
#[map]
static OFFCPU_SNAPSHOTS: LruHashMap<BlockPlace, LastSnapshot> =
    LruHashMap::with_max_entries(65536, 0);

/// Per snapshot id, the stack words to check before reusing it, from user space; one
/// entry unless user space sizes it before load.
#[map]
static SNAPSHOT_CHECKS: LruHashMap<i32, SnapshotCheck> = LruHashMap::with_max_entries(16384, 0);

/// The last frame-pointer user stack of each thread where it blocked (`sched_switch`).
#[map]
static LAST_USER_STACKS: LruHashMap<BlockPlace, LastUserStack> =
    LruHashMap::with_max_entries(16384, 0);

/// Where a [`LastUserStack`] is assembled before it is stored.
#[map]
static USER_STACK_SCRATCH: PerCpuArray<LastUserStack> = PerCpuArray::with_max_entries(1, 0);

/// The first `STACK_WORDS_SPAN` bytes of a user stack, read at once to check its words.
#[map]
static STACK_WORDS_SCRATCH: PerCpuArray<[u64; STACK_WORDS_SPAN / 8]> =
    PerCpuArray::with_max_entries(1, 0);

/// Off-CPU kernel stacks taken at switch in, by id (from `FIRST_SWITCH_IN_STACK_ID`);
/// allocated as they come (`BPF_F_NO_PREALLOC`): a few hundred are typical.
#[map]
static KERNEL_STACKS: HashMap<i32, KernelStack> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Where a kernel stack is taken before it is stored.
#[map]
static KERNEL_STACK_SCRATCH: PerCpuArray<KernelStack> = PerCpuArray::with_max_entries(1, 0);

/// CPython interpreters of target processes, by tgid: where their thread states are and
/// how their frames are laid out (see `python`).
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> = HashMap::with_max_entries(4096, 0);

/// Each Python thread's thread state, by thread id.
#[map]
static PYTHON_THREADS: LruHashMap<u32, PythonThread> = LruHashMap::with_max_entries(16384, 0);

/// Where a thread's Python frames are gathered before they go with a snapshot.
#[map]
static PYTHON_SCRATCH: PerCpuArray<PythonStack> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU sequence numbers of off-CPU snapshots.
#[map]
static SNAPSHOT_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// `BPF_F_NO_PREALLOC` (include/uapi/linux/bpf.h).
const BPF_F_NO_PREALLOC: u32 = 1;

/// Switches set by user space while programs run (see `tracer_common::control`).
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(control::COUNT, 0);

/// Whether user space has stopped the trace.
#[inline(always)]
fn stopped() -> bool {
    CONTROL.get(control::STOPPED).is_some_and(|&v| v != 0)
}

/// Whether user space has started the wall-clock profile.
#[inline(always)]
fn recording() -> bool {
    CONTROL.get(control::RECORDING).is_some_and(|&v| v != 0)
}

/// What could not be recorded (see `tracer_common::counter`).
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Read-only settings, fixed by user space before load (see `tracer_common::global_names`).
#[unsafe(no_mangle)]
static TARGET_TGID: u32 = 0;
#[unsafe(no_mangle)]
static TARGET_START_TICKS: u64 = 0;
#[unsafe(no_mangle)]
static TARGET_FILTER: u32 = 0;
#[unsafe(no_mangle)]
static MIN_BLOCK_NS: u64 = 0;
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_START_BOOTTIME_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_COMM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_EXEC_RUNTIME_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static BPRM_FILE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static FILE_INODE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static INODE_INO_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static INODE_SB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SB_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TARGET_MATCH: u32 = 0;
#[unsafe(no_mangle)]
static MATCH_EXE_DEV: u64 = 0;
#[unsafe(no_mangle)]
static MATCH_EXE_INO: u64 = 0;
#[unsafe(no_mangle)]
static MATCH_COMM: [u8; 16] = [0; 16];
#[unsafe(no_mangle)]
static CLOCK_TICK_NS: u64 = 10_000_000;
#[unsafe(no_mangle)]
static PID_NS_INO: u32 = 0;
#[unsafe(no_mangle)]
static TASK_THREAD_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PID_LEVEL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PID_NUMBERS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static UPID_SIZE: u32 = 16;
#[unsafe(no_mangle)]
static UPID_NS_OFFSET: u32 = 8;
#[unsafe(no_mangle)]
static PID_NS_INUM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASKS_TRACED: u32 = 0;
#[unsafe(no_mangle)]
static TIMELINE_ON: u32 = 0;
#[unsafe(no_mangle)]
static TIMELINE_MIN_BLOCK_NS: u64 = 0;
#[unsafe(no_mangle)]
static TASK_FSBASE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static PROCESS_METRICS_ON: u32 = 0;

/// A map insert's flag: only if the key is absent, else fail with `EEXIST`.
const BPF_NOEXIST: u64 = 1;

/// Adds `value` to a process's figure in `PROCESS_METRICS` (shared by the CPUs: atomic
/// adds), when `--metrics` asked for them.
#[inline(always)]
fn add_process_metric(tgid: u32, metric: u32, index: u32, value: u64) {
    if setting(&PROCESS_METRICS_ON) == 0 {
        return;
    }
    let key = ProcessMetricKey {
        tgid,
        metric,
        index,
    };
    if let Some(slot) = PROCESS_METRICS.get_ptr_mut(&key) {
        // SAFETY: an aligned u64 map value, only ever added to atomically (xadd).
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(slot, value) };
        return;
    }
    if PROCESS_METRICS.insert(&key, &value, BPF_NOEXIST).is_ok() {
        return;
    }
    // Another CPU inserted it first, or the map is full.
    match PROCESS_METRICS.get_ptr_mut(&key) {
        // SAFETY: as above.
        Some(slot) => unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(slot, value);
        },
        None => count(counter::MAP_FULL),
    }
}

/// Reads a global set before load; volatile so the compiler cannot fold the default in.
#[inline(always)]
fn setting<T: Copy>(global: &'static T) -> T {
    // SAFETY: the global is a valid, aligned static; it lives in .rodata and never changes
    // after load.
    unsafe { core::ptr::read_volatile(global) }
}

/// Adds one to a `COUNTERS` slot.
#[inline(always)]
fn count(index: u32) {
    count_by(index, 1);
}

/// Adds `n` to a `COUNTERS` slot.
#[inline(always)]
fn count_by(index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, valid while the program runs; no other writer on this CPU.
        unsafe { *slot += n };
    }
}

/// USDT sites for counting and latencies: the cookie says which site fired, the site says
/// what to do.
#[uprobe]
pub fn usdt_probe(ctx: ProbeContext) -> u32 {
    usdt::on_hit::<false, false, { tracer_common::MAX_LATENCIES_PER_PROBE }>(&ctx);
    0
}

/// `usdt_probe` for sites in at most `FEW_LATENCIES_PER_PROBE` latencies as begin and as
/// end (every known runtime's): half the time to verify, before `attach`'s first event.
#[uprobe]
pub fn usdt_probe_few(ctx: ProbeContext) -> u32 {
    usdt::on_hit::<false, false, { tracer_common::FEW_LATENCIES_PER_PROBE }>(&ctx);
    0
}

/// `usdt_probe` for sites whose hits are counted by stack (`trace --count --stack`).
#[uprobe]
pub fn usdt_probe_stacks(ctx: ProbeContext) -> u32 {
    usdt::on_hit::<false, true, { tracer_common::MAX_LATENCIES_PER_PROBE }>(&ctx);
    0
}

/// The dynamic loader has mapped new objects (`dlopen`): a traced process is held for
/// user space to attach their probes before any of them can run.
#[uprobe]
pub fn dl_debug_state(_ctx: ProbeContext) -> u32 {
    targets::hold();
    0
}

/// `syscalls:sys_exit_mmap`: a traced process that mapped code is recorded in `HELD`
/// for user space to look at its maps, without being stopped.
#[tracepoint]
pub fn code_mapped(ctx: TracePointContext) -> u32 {
    targets::on_code_mapped(&ctx);
    0
}

/// `sched:sched_process_exec`: a traced process that runs a new program is recorded in
/// `HELD` for user space to look at its maps.
#[tracepoint]
pub fn program_started(_ctx: TracePointContext) -> u32 {
    targets::on_program_started();
    0
}

/// `usdt_probe` for sites that are also runtime task switches.
#[uprobe]
pub fn usdt_task(ctx: ProbeContext) -> u32 {
    usdt::on_hit::<true, false, { tracer_common::MAX_LATENCIES_PER_PROBE }>(&ctx);
    0
}

/// USDT sites whose every hit goes to user space with its arguments. A program of its own
/// so counting runs never carry (or verify) the argument decoder.
#[uprobe]
pub fn usdt_event(ctx: ProbeContext) -> u32 {
    usdt::on_hit_with_event::<{ tracer_common::MAX_USDT_ARGS }, false>(&ctx);
    0
}

/// `usdt_event` for sites that take their stacks (`trace --stack`): the others never
/// wait for the stack map, which `attach` creates big, on another thread.
#[uprobe]
pub fn usdt_event_stacks(ctx: ProbeContext) -> u32 {
    usdt::on_hit_with_event::<{ tracer_common::MAX_USDT_ARGS }, true>(&ctx);
    0
}

/// `usdt_event` for sites with at most `FEW_USDT_ARGS` arguments (most GC and task
/// probes): the verifier walks a fraction of the paths, so a trace starts sooner.
#[uprobe]
pub fn usdt_event_few(ctx: ProbeContext) -> u32 {
    usdt::on_hit_with_event::<{ tracer_common::FEW_USDT_ARGS }, false>(&ctx);
    0
}

/// `usdt_event` for sites with string arguments (`trace --str`): the strings are read at
/// the hit, while their pointers are valid.
#[uprobe]
pub fn usdt_event_str(ctx: ProbeContext) -> u32 {
    usdt::on_hit_with_strings(&ctx);
    0
}

/// Off-CPU accounting on every context switch.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    offcpu::on_switch::<false, false>(&ctx);
    0
}

/// Off-CPU accounting for DWARF unwinding: where a thread blocks, its user stack is a
/// snapshot sent to `UNWIND_SAMPLES` (reused while it blocks at the same place).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_dwarf(ctx: BtfTracePointContext) -> i32 {
    offcpu::on_switch::<true, false>(&ctx);
    0
}

/// `sched_switch_dwarf` with the Python frames of the threads of Python targets.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_dwarf_python(ctx: BtfTracePointContext) -> i32 {
    offcpu::on_switch::<true, true>(&ctx);
    0
}

/// On-CPU sampling, from one CPU_CLOCK perf event per CPU.
#[perf_event]
pub fn oncpu_sample(ctx: PerfEventContext) -> u32 {
    oncpu::on_sample(&ctx);
    0
}

/// On-CPU sampling for DWARF unwinding: samples of user threads go to `UNWIND_SAMPLES` as
/// raw snapshots, the others are aggregated like `oncpu_sample`'s.
#[perf_event]
pub fn oncpu_sample_dwarf(ctx: PerfEventContext) -> u32 {
    oncpu::on_sample_dwarf::<false>(&ctx);
    0
}

/// `oncpu_sample_dwarf` with the Python frames of the threads of Python targets.
#[perf_event]
pub fn oncpu_sample_dwarf_python(ctx: PerfEventContext) -> u32 {
    oncpu::on_sample_dwarf::<true>(&ctx);
    0
}

/// Processes forked by targets become targets (`--children`).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn process_fork(ctx: BtfTracePointContext) -> i32 {
    targets::on_fork(&ctx);
    0
}

/// Processes that start the `--exe` file or take the `--comm` name become targets.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn process_exec(ctx: BtfTracePointContext) -> i32 {
    targets::on_exec(&ctx);
    0
}

/// Every thread's saved user registers, from a task iterator (`tracer stacks`). Written
/// out as aya's macros would (they have none for iterators).
// The function is entered by the kernel, not called from Rust: aya's program macros
// leave its ABI as Rust too.
#[allow(clippy::no_mangle_with_rust_abi)]
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn thread_regs(ctx: *mut core::ffi::c_void) -> i32 {
    threads::on_task(ctx as *const threads::IterTask);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
