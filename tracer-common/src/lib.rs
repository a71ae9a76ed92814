//! Types shared by the tracer (user space) and its eBPF programs.
//!
//! Everything here is `#[repr(C)]` plain data: the eBPF side writes it into maps and the
//! ring buffer, user space reads it back byte for byte. Map, program and global names are
//! constants here so neither side repeats a string.
#![no_std]

pub mod histogram;
pub mod python;
pub mod stack_id;

pub use stack_id::{
    FIRST_SNAPSHOT_ID, FIRST_SWITCH_IN_STACK_ID, KERNEL_STACK_AT_SWITCH_IN, KERNEL_STACK_MISSED,
    KERNEL_STACK_NOT_SAMPLED, KERNEL_STACK_UNREADABLE, NO_STACK, STACK_BEFORE_START,
    STACK_NOT_TAKEN, SWITCH_IN_STACK_IDS, StackId,
};

/// The most arguments a USDT probe can carry (SystemTap SDT v3).
pub const MAX_USDT_ARGS: usize = 12;
/// Sites with at most this many arguments send events with a smaller decoder program.
pub const FEW_USDT_ARGS: usize = 3;
/// Capacity of the per-site argument spec table (one entry per attached probe site).
pub const MAX_USDT_SITES: u32 = 8192;
/// How many latencies (begin/end probe pairs) can be measured at once.
pub const MAX_LATENCIES: u32 = 32;
/// How many latencies a single probe can begin or end (`gc__begin` begins both the GC
/// pause and the stop-the-world latency).
pub const MAX_LATENCIES_PER_PROBE: usize = 4;
/// Sites that begin and end at most this many latencies each are counted by a smaller
/// program (every known runtime's are: `attach` verifies it before its first event).
pub const FEW_LATENCIES_PER_PROBE: usize = 2;
/// Capacity of the per-probe hit counters (`probe_id` is below this).
pub const MAX_PROBES: u32 = 1024;

/// Names of the eBPF maps, exactly as the statics are named in `tracer-ebpf`.
pub mod map_names {
    pub const USDT_SPECS: &str = "USDT_SPECS";
    pub const USDT_EVENTS: &str = "USDT_EVENTS";
    pub const LATENCY_STARTS: &str = "LATENCY_STARTS";
    pub const LATENCY_HIST: &str = "LATENCY_HIST";
    pub const LATENCY_STATS: &str = "LATENCY_STATS";
    pub const PROBE_HITS: &str = "PROBE_HITS";
    pub const OFFCPU_STARTS: &str = "OFFCPU_STARTS";
    pub const OFFCPU_TIME: &str = "OFFCPU_TIME";
    pub const TASK_STATES: &str = "TASK_STATES";
    pub const TASK_TIME: &str = "TASK_TIME";
    /// The task each thread is running, by thread id ([`super::TaskId`]).
    pub const THREAD_TASKS: &str = "THREAD_TASKS";
    /// On-CPU samples and off-CPU time of threads while a task ran on them
    /// ([`super::TaskWallKey`]).
    pub const TASK_WALL: &str = "TASK_WALL";
    /// Names and spawn locations runtimes gave their tasks ([`super::TaskName`]).
    pub const TASK_NAMES: &str = "TASK_NAMES";
    /// Intervals for `attach --timeline` ([`super::TimelineEvent`]).
    pub const TIMELINE: &str = "TIMELINE";
    pub const ONCPU_SAMPLES: &str = "ONCPU_SAMPLES";
    pub const STACKS: &str = "STACKS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const CONTROL: &str = "CONTROL";
    /// User stack snapshots for DWARF unwinding (`tracer profile --unwind dwarf`).
    pub const UNWIND_SAMPLES: &str = "UNWIND_SAMPLES";
    /// The last off-CPU snapshot of each thread ([`super::LastSnapshot`]).
    pub const OFFCPU_SNAPSHOTS: &str = "OFFCPU_SNAPSHOTS";
    /// Per-CPU sequence numbers of off-CPU snapshots.
    pub const SNAPSHOT_SEQ: &str = "SNAPSHOT_SEQ";
    /// What to check before reusing an off-CPU snapshot ([`super::SnapshotCheck`]).
    pub const SNAPSHOT_CHECKS: &str = "SNAPSHOT_CHECKS";
    /// The last frame-pointer user stack of each thread where it blocked
    /// ([`super::LastUserStack`]).
    pub const LAST_USER_STACKS: &str = "LAST_USER_STACKS";
    /// Off-CPU kernel stacks taken at switch in ([`super::KernelStack`]).
    pub const KERNEL_STACKS: &str = "KERNEL_STACKS";
    /// The processes traced, by tgid ([`super::TargetProcess`]).
    pub const TARGETS: &str = "TARGETS";
    /// Latency totals per process ([`super::LatencyProcessKey`]).
    pub const LATENCY_BY_PROCESS: &str = "LATENCY_BY_PROCESS";
    /// Each process's latencies by histogram bucket and its time off CPU, with
    /// `PROCESS_METRICS_ON` on ([`super::ProcessMetricKey`]).
    pub const PROCESS_METRICS: &str = "PROCESS_METRICS";
    /// The per-CPU buffer where an event with strings is assembled.
    pub const USDT_STR_SCRATCH: &str = "USDT_STR_SCRATCH";
    /// Probe hits by process and stacks (`trace --count --stack`, [`super::HitStackKey`]).
    pub const HIT_STACKS: &str = "HIT_STACKS";
    /// Processes held (stopped) at the dynamic loader's `_dl_debug_state` until user
    /// space has attached the objects they mapped.
    pub const HELD: &str = "HELD";
    /// Traced processes seen mapping code or starting a program, for user space to look
    /// at their maps (a [`super::held::LOOK`] each).
    pub const MAPPED_CODE: &str = "MAPPED_CODE";
    /// A tgid each time one is newly recorded in `HELD` or `MAPPED_CODE`: what user space
    /// waits on.
    pub const HELD_NOTICES: &str = "HELD_NOTICES";
    /// CPython interpreters of target processes, by tgid ([`super::python::PythonProcess`]).
    pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
    /// Each Python thread's thread state, by thread id ([`super::python::PythonThread`]).
    pub const PYTHON_THREADS: &str = "PYTHON_THREADS";
    /// Where a thread's Python frames are gathered before they go with a snapshot.
    pub const PYTHON_SCRATCH: &str = "PYTHON_SCRATCH";
    /// Every name above, for the test that each is in the eBPF object.
    pub const ALL: &[&str] = &[
        USDT_SPECS,
        USDT_EVENTS,
        LATENCY_STARTS,
        LATENCY_HIST,
        LATENCY_STATS,
        PROBE_HITS,
        OFFCPU_STARTS,
        OFFCPU_TIME,
        TASK_STATES,
        TASK_TIME,
        THREAD_TASKS,
        TASK_WALL,
        TASK_NAMES,
        TIMELINE,
        ONCPU_SAMPLES,
        STACKS,
        COUNTERS,
        CONTROL,
        UNWIND_SAMPLES,
        OFFCPU_SNAPSHOTS,
        SNAPSHOT_SEQ,
        SNAPSHOT_CHECKS,
        LAST_USER_STACKS,
        KERNEL_STACKS,
        TARGETS,
        LATENCY_BY_PROCESS,
        PROCESS_METRICS,
        USDT_STR_SCRATCH,
        HIT_STACKS,
        HELD,
        MAPPED_CODE,
        HELD_NOTICES,
        PYTHON_PROCESSES,
        PYTHON_THREADS,
        PYTHON_SCRATCH,
    ];
}

/// Names of the eBPF programs (their function names in `tracer-ebpf`).
pub mod program_names {
    /// Counting and latencies.
    pub const USDT: &str = "usdt_probe";
    /// `usdt_probe` for sites in at most [`super::FEW_LATENCIES_PER_PROBE`] latencies as
    /// begin and as end: the verifier walks each latency's code once per latency, so
    /// this one takes half the time to verify.
    pub const USDT_FEW: &str = "usdt_probe_few";
    /// `usdt_probe` that also counts hits by stack (`trace --count --stack`).
    pub const USDT_STACKS: &str = "usdt_probe_stacks";
    /// Counting, latencies and runtime task switches (a task id argument, park stacks):
    /// a program of its own, so runs without task probes never verify that part.
    pub const USDT_TASK: &str = "usdt_task";
    pub const USDT_EVENT: &str = "usdt_event";
    /// `usdt_event` for sites with at most [`super::FEW_USDT_ARGS`] arguments: quicker
    /// to verify.
    pub const USDT_EVENT_FEW: &str = "usdt_event_few";
    /// `usdt_event` for sites with string arguments (`trace --str`).
    pub const USDT_EVENT_STR: &str = "usdt_event_str";
    /// `usdt_event` that takes each hit's stacks (`trace --stack`).
    pub const USDT_EVENT_STACKS: &str = "usdt_event_stacks";
    pub const SCHED_SWITCH: &str = "sched_switch";
    /// On-CPU sampling, attached to one CPU_CLOCK perf event per CPU.
    pub const ONCPU_SAMPLE: &str = "oncpu_sample";
    /// On-CPU sampling that sends the user registers and stack bytes of samples to user
    /// space for DWARF unwinding (`UNWIND_SAMPLES`); samples without (kernel threads, or
    /// the ring buffer full) go to `ONCPU_SAMPLES`.
    pub const ONCPU_SAMPLE_DWARF: &str = "oncpu_sample_dwarf";
    /// Off-CPU accounting whose user stacks are snapshots unwound in user space with
    /// DWARF (`UNWIND_SAMPLES`), identified by snapshot ids instead of `STACKS` ids.
    pub const SCHED_SWITCH_DWARF: &str = "sched_switch_dwarf";
    /// `oncpu_sample_dwarf` whose snapshots also carry the Python frames of the threads
    /// of the Python processes user space registered; verified with the walk's loops.
    pub const ONCPU_SAMPLE_DWARF_PYTHON: &str = "oncpu_sample_dwarf_python";
    /// `sched_switch_dwarf` likewise with Python frames.
    pub const SCHED_SWITCH_DWARF_PYTHON: &str = "sched_switch_dwarf_python";
    /// A task iterator (`iter/task`) writing each thread's saved user registers
    /// ([`super::ThreadRegs`]) for `tracer stacks`.
    pub const THREAD_REGS: &str = "thread_regs";
    /// `sched_process_fork`: a process forked by a target becomes one (`--children`).
    pub const PROCESS_FORK: &str = "process_fork";
    /// `sched_process_exec`: a process that starts the `--exe` file (or takes the
    /// `--comm` name) becomes a target.
    pub const PROCESS_EXEC: &str = "process_exec";
    /// A uprobe at the dynamic loader's `_dl_debug_state` (called once a `dlopen` has
    /// mapped its objects): holds a traced process for user space (`HELD`).
    pub const DL_DEBUG_STATE: &str = "dl_debug_state";
    /// `syscalls:sys_exit_mmap`: a traced process that mapped part of a file executable
    /// is recorded in `HELD` (never stopped) for user space to look at its maps.
    pub const CODE_MAPPED: &str = "code_mapped";
    /// `sched:sched_process_exec`: a traced process that runs a new program is recorded
    /// in `HELD` likewise.
    pub const PROGRAM_STARTED: &str = "program_started";
    /// Every name above, for the test that each is in the eBPF object.
    pub const ALL: &[&str] = &[
        USDT,
        USDT_FEW,
        USDT_STACKS,
        USDT_TASK,
        USDT_EVENT,
        USDT_EVENT_FEW,
        USDT_EVENT_STR,
        USDT_EVENT_STACKS,
        SCHED_SWITCH,
        ONCPU_SAMPLE,
        ONCPU_SAMPLE_DWARF,
        SCHED_SWITCH_DWARF,
        ONCPU_SAMPLE_DWARF_PYTHON,
        SCHED_SWITCH_DWARF_PYTHON,
        THREAD_REGS,
        PROCESS_FORK,
        PROCESS_EXEC,
        DL_DEBUG_STATE,
    ];
}

/// Names of the read-only globals fixed before load.
pub mod global_names {
    /// The one process (tgid) traced when it is the only one and no other can join: a
    /// comparison instead of a `TARGETS` lookup. 0 otherwise.
    pub const TARGET_TGID: &str = "TARGET_TGID";
    /// That process's start time in clock ticks (as /proc/PID/stat gives it), so a
    /// process that reuses its PID is not taken for it; 0: no check.
    pub const TARGET_START_TICKS: &str = "TARGET_START_TICKS";
    /// Which programs trace only the processes in `TARGETS` (bits of
    /// [`super::target_filter`]); 0 means every process.
    pub const TARGET_FILTER: &str = "TARGET_FILTER";
    /// Off-CPU intervals shorter than this are not recorded.
    pub const MIN_BLOCK_NS: &str = "MIN_BLOCK_NS";
    /// Byte offsets of `pid` (the thread id), `tgid`, `group_leader`, `start_boottime`
    /// and `comm` in the kernel's `struct task_struct`.
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    pub const TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
    pub const TASK_GROUP_LEADER_OFFSET: &str = "TASK_GROUP_LEADER_OFFSET";
    pub const TASK_START_BOOTTIME_OFFSET: &str = "TASK_START_BOOTTIME_OFFSET";
    pub const TASK_COMM_OFFSET: &str = "TASK_COMM_OFFSET";
    /// Byte offset of `se.sum_exec_runtime` (the thread's CPU time, ns) in `task_struct`.
    pub const TASK_EXEC_RUNTIME_OFFSET: &str = "TASK_EXEC_RUNTIME_OFFSET";
    /// Byte offsets of `linux_binprm.file`, `file.f_inode`, `inode.i_ino`, `inode.i_sb`
    /// and `super_block.s_dev`: the file a process executes (`--exe`).
    pub const BPRM_FILE_OFFSET: &str = "BPRM_FILE_OFFSET";
    pub const FILE_INODE_OFFSET: &str = "FILE_INODE_OFFSET";
    pub const INODE_INO_OFFSET: &str = "INODE_INO_OFFSET";
    pub const INODE_SB_OFFSET: &str = "INODE_SB_OFFSET";
    pub const SB_DEV_OFFSET: &str = "SB_DEV_OFFSET";
    /// What makes an executing process a target (bits of [`super::target_match`]).
    pub const TARGET_MATCH: &str = "TARGET_MATCH";
    /// The `--exe` file: the kernel's device number (`MKDEV(major, minor)`) and inode.
    pub const MATCH_EXE_DEV: &str = "MATCH_EXE_DEV";
    pub const MATCH_EXE_INO: &str = "MATCH_EXE_INO";
    /// The `--comm` name, zero-padded to the kernel's 16 bytes.
    pub const MATCH_COMM: &str = "MATCH_COMM";
    /// Nanoseconds per clock tick (1e9 / USER_HZ).
    pub const CLOCK_TICK_NS: &str = "CLOCK_TICK_NS";
    /// The inode of the tracer's PID namespace when it is not the host's (a container's):
    /// every id the programs record or compare is then that namespace's, and tasks
    /// outside it are not traced. 0 on the host.
    pub const PID_NS_INO: &str = "PID_NS_INO";
    /// Byte offsets to read a task's number in a PID namespace: `task_struct.thread_pid`,
    /// `pid.level`, `pid.numbers`, the size of a `struct upid`, `upid.ns`, and
    /// `pid_namespace.ns.inum` (the namespace's inode).
    pub const TASK_THREAD_PID_OFFSET: &str = "TASK_THREAD_PID_OFFSET";
    pub const PID_LEVEL_OFFSET: &str = "PID_LEVEL_OFFSET";
    pub const PID_NUMBERS_OFFSET: &str = "PID_NUMBERS_OFFSET";
    pub const UPID_SIZE: &str = "UPID_SIZE";
    pub const UPID_NS_OFFSET: &str = "UPID_NS_OFFSET";
    pub const PID_NS_INUM_OFFSET: &str = "PID_NS_INUM_OFFSET";
    /// Non-zero when task probes are attached: on-CPU samples and off-CPU intervals of a
    /// thread running a task also go to `TASK_WALL`. Zero, the scheduler programs never
    /// look a thread's task up.
    pub const TASKS_TRACED: &str = "TASKS_TRACED";
    /// Non-zero with `attach --timeline`: latencies, task runs and parks, and off-CPU
    /// intervals of at least `TIMELINE_MIN_BLOCK_NS` also go to `TIMELINE`, each with its
    /// start and end.
    pub const TIMELINE_ON: &str = "TIMELINE_ON";
    pub const TIMELINE_MIN_BLOCK_NS: &str = "TIMELINE_MIN_BLOCK_NS";
    /// Byte offset of `thread.fsbase` in `task_struct`: a thread's `pthread_self()`,
    /// which CPython keeps in each thread state.
    pub const TASK_FSBASE_OFFSET: &str = "TASK_FSBASE_OFFSET";
    /// Non-zero with `--metrics`: each latency and off-CPU interval is also added to its
    /// process's figures in `PROCESS_METRICS`, which user space prunes of exited
    /// processes.
    pub const PROCESS_METRICS_ON: &str = "PROCESS_METRICS_ON";
    /// Every name above, for the test that each is in the eBPF object.
    pub const ALL: &[&str] = &[
        TARGET_TGID,
        TARGET_START_TICKS,
        TARGET_FILTER,
        MIN_BLOCK_NS,
        TASK_PID_OFFSET,
        TASK_TGID_OFFSET,
        TASK_GROUP_LEADER_OFFSET,
        TASK_START_BOOTTIME_OFFSET,
        TASK_COMM_OFFSET,
        TASK_EXEC_RUNTIME_OFFSET,
        BPRM_FILE_OFFSET,
        FILE_INODE_OFFSET,
        INODE_INO_OFFSET,
        INODE_SB_OFFSET,
        SB_DEV_OFFSET,
        TARGET_MATCH,
        MATCH_EXE_DEV,
        MATCH_EXE_INO,
        MATCH_COMM,
        CLOCK_TICK_NS,
        PID_NS_INO,
        TASK_THREAD_PID_OFFSET,
        PID_LEVEL_OFFSET,
        PID_NUMBERS_OFFSET,
        UPID_SIZE,
        UPID_NS_OFFSET,
        PID_NS_INUM_OFFSET,
        TASKS_TRACED,
        TIMELINE_ON,
        TIMELINE_MIN_BLOCK_NS,
        TASK_FSBASE_OFFSET,
        PROCESS_METRICS_ON,
    ];
}

/// Bits of the `TARGET_FILTER` global: which programs look processes up in `TARGETS`.
pub mod target_filter {
    /// Off-CPU accounting and on-CPU sampling.
    pub const SCHED: u32 = 1;
    /// USDT probes (when their uprobes are not already limited to one process).
    pub const USDT: u32 = 2;
}

/// Bits of the `TARGET_MATCH` global.
pub mod target_match {
    /// A process that executes the `--exe` file.
    pub const EXE: u32 = 1;
    /// A process whose name becomes the `--comm` name when it executes.
    pub const COMM: u32 = 2;
}

/// Bits of [`TargetProcess::flags`].
pub mod target_flags {
    /// The processes it forks become targets too (`--children`, and processes found by
    /// file or name: their forks run the same file under the same name).
    pub const FOLLOW_FORKS: u32 = 1;
    /// A target because of what it runs (`--exe`, `--comm`): it stops being one when it
    /// executes something else.
    pub const BY_MATCH: u32 = 2;
}

/// Value of `TARGETS` (keyed by tgid): a process traced.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetProcess {
    /// When it started, in clock ticks since boot (as /proc/PID/stat gives it), so a
    /// process that reuses the PID is not taken for it; 0: not checked.
    pub start_ticks: u64,
    /// Bits of [`target_flags`].
    pub flags: u32,
    /// The process it forked from while it has not executed another program since
    /// (its memory and mappings are a copy of that one's); 0 otherwise.
    pub forked_from: u32,
    /// Its name when it joined (the kernel's `comm`, zero-padded): a process that exits
    /// before user space looks at it is still named.
    pub comm: [u8; 16],
}

/// Key of `PROCESS_METRICS`: one figure of one process, a [`process_metric`] and its
/// index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessMetricKey {
    pub tgid: u32,
    pub metric: u32,
    pub index: u32,
}

/// What a [`ProcessMetricKey`] counts.
pub mod process_metric {
    /// Latencies in one bucket of [`super::histogram`]: index `latency_id * BUCKETS +
    /// bucket`.
    pub const LATENCY_COUNT: u32 = 0;
    /// Nanoseconds of latencies: index `latency_id`.
    pub const LATENCY_NS: u32 = 1;
    /// Nanoseconds off CPU: index an [`super::offcpu_state`].
    pub const OFFCPU_NS: u32 = 2;
}

/// Key of `LATENCY_BY_PROCESS`: one latency in one process, of one class ([`NO_CLASS`]
/// for latencies without classes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyProcessKey {
    pub tgid: u32,
    pub latency_id: u32,
    pub class: u32,
}

/// How a USDT argument is located at the probe site.
pub mod arg_kind {
    /// A constant from the spec (`$5`).
    pub const CONST: u8 = 1;
    /// The value of a register (`%rdi`).
    pub const REG: u8 = 2;
    /// Memory at register + displacement (`-16(%rbp)`). With `rip` as the register the
    /// displacement is from the probe's own address, which is what `ip` holds when its
    /// uprobe fires: a global `sym(%rip)` is `sym - pc`, the same in every process
    /// whatever the object's load address.
    pub const REG_DEREF: u8 = 3;
    /// Memory at base + index * scale + displacement (`-96(%rbp,%rax,8)`).
    pub const REG_DEREF_INDEXED: u8 = 4;
}

/// One decoded USDT argument spec: where to read the value and how to widen it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArg {
    /// The constant (for `CONST`) or the memory displacement (for the deref kinds).
    pub val_off: i64,
    /// One of [`arg_kind`].
    pub kind: u8,
    /// Byte offset of the (base) register within `struct pt_regs`.
    pub reg_off: u8,
    /// Byte offset of the index register within `struct pt_regs` (indexed kind only).
    pub idx_reg_off: u8,
    /// Multiplier of the index register: 1, 2, 4 or 8 (indexed kind only).
    pub scale: u8,
    /// Size of the value in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// Non-zero when the value is signed and must be sign-extended.
    pub signed: u8,
    /// Non-zero when the bits are an IEEE float of `size` bytes (4 or 8): read as they
    /// are, and shown as a float by user space.
    pub float: u8,
    pub _pad: [u8; 1],
}

/// Flags of a [`UsdtSite`].
pub mod site_flags {
    /// Send every hit to user space through the ring buffer (`tracer trace`).
    pub const EMIT_EVENT: u8 = 1;
    /// The probe says a task starts (or resumes) running.
    pub const TASK_RUN: u8 = 2;
    /// The probe says a task stops running to wait (parks).
    pub const TASK_PAUSE: u8 = 4;
    /// The probe says a task finished: forget its state.
    pub const TASK_FINISH: u8 = 8;
    /// The probe names a task: its name (or spawn file) is the string argument
    /// `UsdtSite::task_name_arg`, a line and column may follow it (tokio's `task-spawn`).
    pub const TASK_NAME: u8 = 64;
    /// Take the user and kernel stacks of every hit: into the event, or (counting) as
    /// the key of `HIT_STACKS` (`tracer trace --stack`).
    pub const STACKS: u8 = 16;
    /// With `STACKS`, in events: the user stack as a snapshot of registers and stack
    /// bytes sent to `UNWIND_SAMPLES` for DWARF unwinding in user space (the event's
    /// user stack id is the snapshot's id), by frame pointers when the ring is full
    /// (`trace --stack --unwind dwarf`).
    pub const STACK_SNAPSHOT: u8 = 32;
    /// The site is a function's return (a uretprobe): its stack pointer is one return
    /// address above the one the function was entered with.
    pub const RETURN_PROBE: u8 = 128;
}

/// The class of a latency nothing classified.
pub const NO_CLASS: u32 = u32::MAX;
/// Bit of `UsdtSite::class_latency`: the latency classified is frame-keyed.
pub const CLASSIFIES_INNERMOST: u8 = 0x80;
/// The frame of the `LATENCY_STARTS` entry whose `start_ns` holds the frame of a
/// frame-keyed latency's innermost call open on the thread (no stack pointer is this).
pub const INNERMOST_FRAME: u64 = u64::MAX;

/// `UsdtSite::task_arg` value meaning "the task is the thread that hit the probe" (the
/// JVM's thread__park probes); otherwise it is the index of the argument holding the task.
pub const TASK_IS_THREAD: u8 = 0xff;

/// Everything the eBPF program needs to know about one attached probe site. Stored in
/// `USDT_SPECS` at the index passed as the uprobe's BPF cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSite {
    pub args: [UsdtArg; MAX_USDT_ARGS],
    /// Latencies (indices below [`MAX_LATENCIES`]) this probe starts on the hitting thread.
    pub latency_begins: [u32; MAX_LATENCIES_PER_PROBE],
    /// Latencies this probe ends on the hitting thread.
    pub latency_ends: [u32; MAX_LATENCIES_PER_PROBE],
    /// Index of the probe (provider:name) in user space's probe table; several sites of
    /// one probe share it. Below [`MAX_PROBES`].
    pub probe_id: u32,
    pub arg_count: u8,
    /// Bits of [`site_flags`].
    pub flags: u8,
    pub latency_begin_count: u8,
    pub latency_end_count: u8,
    /// For task probes: which argument identifies the task, or [`TASK_IS_THREAD`].
    pub task_arg: u8,
    /// For a [`site_flags::TASK_NAME`] probe: the argument that points to the name; the
    /// next two, when the site has them, are a line and a column.
    pub task_name_arg: u8,
    /// Bit `i` set: argument `i` could not be decoded at this site (its spec is read as
    /// 0); copied into each event so user space shows it as unavailable.
    pub unavailable: u16,
    /// The arguments read as NUL-terminated strings at the hit (`trace --str`), the
    /// first `str_count`; their events carry a [`UsdtStrHeader`] area.
    pub str_args: [u8; MAX_STR_ARGS],
    /// The most bytes shown of each (at most [`MAX_STR_LEN`]).
    pub str_max: [u16; MAX_STR_ARGS],
    pub str_count: u8,
    /// Bit `i`: `latency_begins[i]` is keyed on the stack pointer at the hit, so a
    /// recursive function's calls each end at their own return; bit `4 + i`: so is
    /// `latency_ends[i]` (see [`site_flags::RETURN_PROBE`]).
    pub latency_frames: u8,
    /// 1 + the index of the argument whose value classifies the latencies this site
    /// begins (a collection's generation); 0 for none (so a default site has none).
    pub class_arg: u8,
    /// 1 + the id of a latency open on the hitting thread that this site classifies with
    /// `class_arg` without beginning or ending it (V8's collector, chosen after the
    /// collection began); 0 for none. With [`CLASSIFIES_INNERMOST`] set, the latency is
    /// frame-keyed, and the innermost call open is the one classified.
    pub class_latency: u8,
    /// Bit `i`: note the frame of `latency_begins[i]` as its latency's innermost call
    /// open on the thread (at [`INNERMOST_FRAME`]), for a site that classifies it.
    pub latency_innermost: u8,
    pub _pad: [u8; 3],
}

/// Arguments one probe can show as strings.
pub const MAX_STR_ARGS: usize = 4;
/// The hard cap on a string's length (`--str ...:LEN`), in bytes.
pub const MAX_STR_LEN: u16 = 4096;
/// bpftrace's default `str()` buffer.
pub const DEFAULT_STR_LEN: u16 = 64;
/// What the kernel reads of a string of at most `max` bytes: one byte more, so a cut
/// string is told from one of exactly `max` bytes, and the NUL.
pub const fn str_read_size(max: u16) -> u32 {
    max as u32 + 2
}

/// Before each string after the fixed part of a USDT event record: the record is a
/// [`UsdtEvent`], then for each string argument of the site this header followed by
/// `result` bytes (when positive), packed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtStrHeader {
    /// `bpf_probe_read_user_str`'s result: the bytes copied, NUL included, or a negative
    /// errno (a NULL or unmapped pointer) and then no bytes.
    pub result: i32,
    /// The argument's index.
    pub arg: u8,
    pub _pad: u8,
    /// The most bytes to show: a string of more (the kernel reads one more) was cut.
    pub max: u16,
}

/// Start offsets of strings within [`UsdtStrEvent::area`] are masked with this, so the
/// verifier sees every write in bounds whatever the lengths before it (they never
/// exceed it: `MAX_STR_ARGS - 1` full strings end below).
pub const STR_OFFSET_MASK: usize = 0x3fff;
/// Lengths copied are masked with this for the same reason.
pub const STR_LENGTH_MASK: usize = 0x1fff;

/// A USDT event with strings, assembled in a per-CPU buffer (a ring buffer reservation
/// must have a constant size) and copied to the ring buffer at its actual length.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UsdtStrEvent {
    pub event: UsdtEvent,
    pub area:
        [u8; STR_OFFSET_MASK + 1 + core::mem::size_of::<UsdtStrHeader>() + STR_LENGTH_MASK + 1],
    /// How many programs on this CPU are between claiming the buffer and sending it: one
    /// preempted mid-event leaves it above 1 for the next, which then drops its event
    /// rather than overwrite the buffer. Not sent.
    pub users: u64,
}

/// One probe hit, sent through the `USDT_EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the hit.
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub probe_id: u32,
    pub arg_count: u16,
    /// [`UsdtSite::unavailable`] of the site that was hit.
    pub unavailable: u16,
    /// Ids in `STACKS` (or negative errnos) of the user and kernel stacks at the hit;
    /// [`STACK_NOT_TAKEN`] unless the site has `site_flags::STACKS`.
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Each argument widened to 64 bits (sign-extended when signed).
    pub args: [u64; MAX_USDT_ARGS],
}

/// Key of `HIT_STACKS`: the probe, the process (its user stack's addresses are named in
/// its mappings) and the stacks at the hit (ids in `STACKS`, or negative errnos). The
/// value is how many hits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HitStackKey {
    pub probe_id: u32,
    pub tgid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
}

/// Key of `LATENCY_STARTS`: a latency open on a thread, at a stack frame (the stack
/// pointer at a function's entry; 0 for latencies between USDT probes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyStartKey {
    pub tid: u32,
    pub latency_id: u32,
    pub frame: u64,
}

/// Value of `LATENCY_STARTS`: when the latency began, and its class so far ([`NO_CLASS`]
/// or an argument's value, see `UsdtSite::class_arg`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStart {
    pub start_ns: u64,
    pub class: u32,
    pub _pad: u32,
}

/// Value of `PROBE_HITS` (by probe id), per CPU: how often the probe fired and when it
/// first did on this CPU (CLOCK_MONOTONIC, like `bpf_ktime_get_ns`; 0 while `count` is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeHits {
    pub count: u64,
    pub first_ns: u64,
}

/// Running totals of one latency, per CPU (summed in user space).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStats {
    pub count: u64,
    pub total_ns: u64,
    /// Smallest value seen; `u64::MAX` while `count` is 0.
    pub min_ns: u64,
    pub max_ns: u64,
}

/// Value of `OFFCPU_STARTS` (keyed by thread id): the thread left the CPU at `ts_ns` with
/// these stacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuStart {
    pub ts_ns: u64,
    /// The thread's CPU time (`se.sum_exec_runtime`) when it left: should its switch back
    /// in go unseen, its next switch out (or its death) finds this start still open, and
    /// the CPU time it has had since tells when it came back. [`EXEC_NS_UNKNOWN`] for
    /// starts user space marked.
    pub exec_ns: u64,
    pub tgid: u32,
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Why the thread left the CPU: an [`offcpu_state`].
    pub state: u32,
    /// The runtime task it was running when it left (its `THREAD_TASKS` entry, with task
    /// probes attached); 0 for none.
    pub task: u64,
}

/// [`OffCpuStart::ts_ns`] of a thread's entry once its interval has ended (it is running).
/// A thread keeps its entry while it lives, overwritten at each switch out and marked
/// ended at each switch in: a hash map insert and delete at every switch cost a third of
/// the off-CPU program's time.
pub const OFFCPU_START_ENDED: u64 = 0;

/// [`OffCpuStart::exec_ns`] of a start marked by user space (a thread maybe running): its
/// next switch out replaces it and nothing is recovered.
pub const EXEC_NS_UNKNOWN: u64 = u64::MAX;

/// Key of `OFFCPU_TIME`: a thread and the stacks where it blocked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub tgid: u32,
    pub tid: u32,
    /// Id in the `STACKS` map, or a negative errno when the stack could not be taken.
    pub user_stack_id: i32,
    pub kernel_stack_id: i32,
    /// Off CPU: why the thread left it, an [`offcpu_state`]; 0 for on-CPU samples.
    pub state: u32,
}

/// Why a thread was off CPU.
pub mod offcpu_state {
    /// It waited for something (a lock, IO, a timer): `prev_state` was not running.
    pub const BLOCKED: u32 = 0;
    /// It could have run but was preempted (or yielded): runnable, waiting for a CPU.
    pub const RUNNABLE: u32 = 1;
    /// Flag: not time but one sample of [`super::KERNEL_STACK_ALWAYS_NS`] under the
    /// kernel stack of a short interval (see there).
    pub const SAMPLED: u32 = 0x100;
}

/// Key of `ONCPU_SAMPLES` (whose value is a sample count): a thread and the stacks it was
/// running when sampled. The kernel stack id is [`NO_STACK`] for samples taken in user
/// mode, the user stack id is [`NO_STACK`] for kernel threads.
pub type OnCpuKey = OffCpuKey;

/// Value of `OFFCPU_TIME`: total blocked time and how many intervals made it up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuTotal {
    pub total_ns: u64,
    pub count: u64,
}

/// Key of `TASK_STATES`: a runtime's task id within its process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskId {
    pub task: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// Value of `TASK_STATES`: what a task is doing since when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskState {
    /// When it started running; 0 while parked.
    pub run_start_ns: u64,
    /// When it parked; 0 while running.
    pub park_start_ns: u64,
    /// User stack where it parked (id in `STACKS`, or a negative errno).
    pub park_stack_id: i32,
    /// The thread it runs on (or parked on).
    pub tid: u32,
}

/// Whether a `TaskKey` accounts running or parked time.
pub mod task_phase {
    pub const RUNNING: u32 = 0;
    pub const PARKED: u32 = 1;
}

/// Key of `TASK_TIME`: a task, a phase, and for parked time the stack where it parked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub task: u64,
    pub tgid: u32,
    /// One of [`task_phase`].
    pub phase: u32,
    /// User stack id for parked time; -1 for running time.
    pub stack_id: i32,
    /// The thread it ran on (for parked time: the one it parked on).
    pub tid: u32,
}

/// Value of `TASK_TIME`: a task's time in one phase (and park stack), how many intervals
/// made it up, and the longest of them (its longest poll, for tokio).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskTotal {
    pub total_ns: u64,
    pub count: u64,
    pub max_ns: u64,
}

/// Value of `THREAD_TASKS`: the task a thread runs, from the task's run probe to its
/// pause probe; with [`FINISHED_IN_RUN`] set, a task that finished in that run (its
/// time is no longer the task's, and its pause ends nothing).
pub type ThreadTask = u64;

/// The bit of a [`ThreadTask`] that marks a task finished inside its run (task ids —
/// addresses, counters, thread ids — never have it).
pub const FINISHED_IN_RUN: u64 = 1 << 63;

/// Key of `TASK_WALL`: a thread's time while it ran `task` (what a [`OffCpuKey`] is for
/// the thread's own time), so each task's running time splits into on CPU (samples,
/// value `OffCpuTotal::count`), blocked in the kernel and runnable.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskWallKey {
    pub task: u64,
    pub key: OffCpuKey,
    /// One of [`task_wall`].
    pub kind: u32,
}

/// What a [`TaskWallKey`] holds.
pub mod task_wall {
    /// Off CPU while running the task: `key.state` says blocked or runnable.
    pub const OFF_CPU: u32 = 0;
    /// On-CPU samples (frame-pointer stacks; unwound ones are aggregated in user space).
    pub const ON_CPU: u32 = 1;
}

/// One interval of `attach --timeline`, as the programs saw it end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    /// CLOCK_MONOTONIC (ns).
    pub start_ns: u64,
    pub end_ns: u64,
    /// For task intervals: the runtime's task id.
    pub task: u64,
    pub tgid: u32,
    /// The thread it happened on (a parked task's: the one it parked on).
    pub tid: u32,
    /// One of [`timeline_kind`].
    pub kind: u32,
    /// For a latency, its id; for time off CPU, an [`offcpu_state`].
    pub detail: u32,
}

/// What a [`TimelineEvent`] is.
pub mod timeline_kind {
    /// A latency between two probes (a GC pause, a phase of it).
    pub const LATENCY: u32 = 0;
    /// A task ran (from its run probe to its pause).
    pub const TASK_RUN: u32 = 1;
    /// A task was parked (from its pause to its next run).
    pub const TASK_PARKED: u32 = 2;
    /// A thread was off CPU (blocked or runnable) for at least the threshold.
    pub const OFF_CPU: u32 = 3;
}

/// Bytes of a task's name kept (the rest is cut).
pub const TASK_NAME_BYTES: usize = 120;

/// Value of `TASK_NAMES`: what a runtime called a task (a name, or the file of its spawn
/// location), NUL-terminated, and the line and column that go with a file (0 if none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskName {
    pub text: [u8; TASK_NAME_BYTES],
    pub line: u32,
    pub column: u32,
}

impl Default for TaskName {
    fn default() -> Self {
        Self {
            text: [0; TASK_NAME_BYTES],
            line: 0,
            column: 0,
        }
    }
}

/// Indices of the `CONTROL` array: switches user space flips while programs run.
pub mod control {
    /// Non-zero once tracing stopped: USDT programs record nothing more while the (slow)
    /// detach proceeds, so the trace ends at one instant and the ring buffer cannot
    /// overflow after the stop.
    pub const STOPPED: u32 = 0;
    /// Non-zero once a CPython interpreter is in `PYTHON_PROCESSES`: until then, stack
    /// snapshots skip looking their process up there.
    pub const PYTHON: u32 = 1;
    /// Non-zero once the wall-clock profile started: until then the scheduler and
    /// sampling programs record nothing, so every thread's time starts at one instant
    /// however long attaching them took (threads blocked then are seeded from it).
    pub const RECORDING: u32 = 2;
    /// Until this second of `CLOCK_MONOTONIC`, a traced process that maps a library is
    /// stopped until its probes are attached (`--hold-at-dlopen`); 0 by default. User
    /// space pushes it a little ahead while it runs: a tracer that dies stops no more.
    pub const HOLD_UNTIL_S: u32 = 3;
    pub const COUNT: u32 = 4;
}

/// Values of the `HELD` map: what the kernel did to a process whose dynamic loader mapped
/// a library.
pub mod held {
    /// Nothing: user space looks at its maps.
    pub const LOOK: u32 = 1;
    /// Stopped it (SIGSTOP): user space looks at its maps and continues it.
    pub const STOPPED: u32 = 2;
}

/// Indices of the `COUNTERS` per-CPU array: things the eBPF side could not record, so
/// user space reports them instead of hiding them.
pub mod counter {
    /// Ring buffer full: a `tracer trace` event was lost.
    pub const EVENTS_LOST: u32 = 0;
    /// A map was full: a latency start or off-CPU interval was dropped.
    pub const MAP_FULL: u32 = 1;
    /// A stack could not be captured (collision in the stack map or a fault).
    pub const STACK_ERRORS: u32 = 2;
    /// A latency end without a matching begin on that thread.
    pub const UNMATCHED_ENDS: u32 = 3;
    /// An argument could not be read from user memory.
    pub const ARG_READ_ERRORS: u32 = 4;
    /// DWARF unwinding: a sample went to the frame-pointer path instead because the
    /// `UNWIND_SAMPLES` ring buffer was full.
    pub const UNWIND_RING_FULL: u32 = 5;
    /// DWARF unwinding: a sample whose user registers could not be had (a kernel thread,
    /// or its saved registers unreadable), walked with frame pointers instead.
    pub const UNWIND_NO_USER_REGS: u32 = 6;
    /// DWARF unwinding: not a single byte of the user stack could be read; sent anyway.
    pub const UNWIND_STACK_UNREADABLE: u32 = 7;
    /// Off-CPU: a thread's switch back in was not seen (the interval was closed at its next
    /// switch out or its death, from the CPU time it had had since).
    pub const SWITCH_INS_MISSED: u32 = 8;
    /// The timeline's ring buffer was full: an interval is missing from it.
    pub const TIMELINE_LOST: u32 = 9;
    /// Of [`STACK_ERRORS`]: another stack held the slot of the stack map the stack's hash
    /// chose (`EEXIST`).
    pub const STACK_COLLISIONS: u32 = 10;
    /// Of [`STACK_ERRORS`]: the stack map had no room left (`ENOMEM`).
    pub const STACK_MAP_FULL: u32 = 11;
    pub const COUNT: u32 = 12;
}

/// Maximum frames in a captured stack (the kernel's default perf_event_max_stack).
pub const MAX_STACK_DEPTH: usize = 127;

/// Bytes of user stack copied (from the user stack pointer up) for DWARF unwinding.
pub const UNWIND_STACK_BYTES: usize = 16384;

/// An on-CPU sample for DWARF unwinding in user space, through the `UNWIND_SAMPLES` ring
/// buffer: the thread, its user registers (those interrupted, or for a sample in kernel
/// mode those saved when it entered the kernel), the bytes of its user stack from `sp` up
/// (`stack_len` of them; fewer than [`UNWIND_STACK_BYTES`] near the top of the stack), and
/// its kernel stack when it was in kernel mode.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindSample {
    pub tgid: u32,
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack_len: u32,
    /// Id in `STACKS` (or a negative errno); [`NO_STACK`] for a sample in user mode.
    pub kernel_stack_id: i32,
    /// 0 for an on-CPU sample. Otherwise the snapshot of where a thread blocked, taken
    /// at `sched_switch`: off-CPU keys carry this id (from [`FIRST_SNAPSHOT_ID`]) as
    /// their user stack id.
    pub snapshot_id: u32,
    pub _pad: u32,
    /// For an on-CPU sample: the runtime task the thread was running (0: none known).
    pub task: u64,
    /// The thread's Python frames, when its process is a CPython interpreter.
    pub python: python::PythonStack,
    pub stack: [u8; UNWIND_STACK_BYTES],
}

/// One thread's user registers as saved when it last entered the kernel, written by the
/// `thread_regs` task iterator: `/proc/PID/task/TID/syscall` gives the instruction and
/// stack pointers of a blocked thread but not its frame pointer, which unwinding code built
/// with frame pointers needs (their call frame information is relative to it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadRegs {
    /// The thread id (the kernel's `pid`).
    pub tid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Its FS base (`pthread_self()`), which finds its Python thread state.
    pub fsbase: u64,
}

/// Key of `OFFCPU_SNAPSHOTS` and `LAST_USER_STACKS`: a thread and the user instruction
/// and stack pointers where it blocked. A thread blocks at a few places in turn (a write
/// preempted, then a read; one system call's wrapper reached by different paths), each
/// remembered on its own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockPlace {
    pub tid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
}

/// Value of `OFFCPU_SNAPSHOTS` (keyed by [`BlockPlace`]): the last snapshot of the thread's
/// user stack sent at a `sched_switch`. A thread blocking again with the same user
/// instruction and stack pointers (and frame pointer, when unwinding used it) reuses it
/// if the stack words its unwinding read are still the same ([`SnapshotCheck`]):
/// unwinding would give the same frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastSnapshot {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// When it was sent (CLOCK_MONOTONIC ns).
    pub sent_ns: u64,
    pub snapshot_id: i32,
    pub _pad: u32,
    /// [`python::PythonStack::hash`] of the Python frames sent with it (0: none).
    pub python_hash: u64,
}

/// Stack words a [`StackWords`] holds at most: a stack whose walk depends on more is
/// only checked on its first ones (the innermost frames).
pub const MAX_SNAPSHOT_CHECKS: usize = 64;

/// Bytes from the stack pointer up that the kernel reads at once to check
/// [`StackWords`]; words further up are not checked that way (the stack is walked again).
pub const STACK_WORDS_SPAN: usize = 8192;

/// Words of a user stack that a walk of it depended on, as offsets from the stack pointer
/// (multiples of 8, below `span`) and the values found there: while they are unchanged,
/// walking the stack again from the same registers gives the same frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackWords {
    pub count: u32,
    /// One past the highest byte the words cover (the largest offset + 8).
    pub span: u32,
    pub offsets: [u32; MAX_SNAPSHOT_CHECKS],
    pub values: [u64; MAX_SNAPSHOT_CHECKS],
}

impl StackWords {
    pub const EMPTY: StackWords = StackWords {
        count: 0,
        span: 0,
        offsets: [0; MAX_SNAPSHOT_CHECKS],
        values: [0; MAX_SNAPSHOT_CHECKS],
    };
}

/// Value of `SNAPSHOT_CHECKS` (keyed by snapshot id), written by user space once it
/// unwound the snapshot: the stack words unwinding depended on, and whether it used the
/// frame pointer register (then that must be the same too).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotCheck {
    pub uses_bp: u32,
    pub _pad: u32,
    pub words: StackWords,
}

/// Value of `LAST_USER_STACKS` (keyed by [`BlockPlace`]), with frame-pointer unwinding: the
/// user stack id last taken where the thread blocked, with the registers and the frame
/// chain words (saved frame pointers and return addresses) the kernel's walk followed.
/// A thread blocking again with the same registers and words gets the same id without
/// a walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastUserStack {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack_id: i32,
    pub _pad: u32,
    pub words: StackWords,
}

/// Off-CPU: a kernel stack taken when its thread comes back (`bpf_get_task_stack`), in
/// `KERNEL_STACKS` under an id from [`FIRST_SWITCH_IN_STACK_ID`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelStack {
    /// Frames in `ips` (the rest are 0).
    pub len: u32,
    pub _pad: u32,
    /// FNV-1a of all of `ips`: stacks of the same length and hash are taken to be the same.
    pub hash: u64,
    pub ips: [u64; MAX_STACK_DEPTH],
}

/// Off-CPU kernel stacks are taken when the thread comes back, when its interval is
/// known: always for an interval of at least this long (ns); a shorter one of `d` ns
/// with probability `d / KERNEL_STACK_ALWAYS_NS`, and then counted twice: its own time
/// under [`KERNEL_STACK_NOT_SAMPLED`], and one sample of this weight under the stack
/// (with [`offcpu_state::SAMPLED`]). User space spreads each thread's unsampled time at
/// a user stack over the kernel stacks sampled there, in proportion.
pub const KERNEL_STACK_ALWAYS_NS: u64 = 1_000_000;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    /// `unsafe impl aya::Pod` for each type.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {
            $(
                // SAFETY: all of these are #[repr(C)] structs of integers with explicit
                // padding fields, so every bit pattern is valid and there are no implicit
                // padding bytes.
                unsafe impl aya::Pod for $t {}
            )*
        };
    }
    pod!(
        UsdtArg,
        UsdtSite,
        UsdtEvent,
        UsdtStrHeader,
        HitStackKey,
        LatencyStartKey,
        LatencyStart,
        LatencyStats,
        TargetProcess,
        LatencyProcessKey,
        ProcessMetricKey,
        ProbeHits,
        OffCpuStart,
        OffCpuKey,
        OffCpuTotal,
        TaskState,
        TaskId,
        TaskKey,
        TaskWallKey,
        TaskTotal,
        TaskName,
        TimelineEvent,
        UnwindSample,
        BlockPlace,
        LastSnapshot,
        SnapshotCheck,
        StackWords,
        LastUserStack,
        KernelStack,
        ThreadRegs,
        python::PythonProcess,
        python::PythonThread,
    );
}
