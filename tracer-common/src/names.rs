//! Names of the maps, programs and globals, exactly as the eBPF side declares them, so
//! neither side repeats a string.

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
    /// The task each thread is running, by thread id ([`crate::TaskId`]).
    pub const THREAD_TASKS: &str = "THREAD_TASKS";
    /// On-CPU samples and off-CPU time of threads while a task ran on them
    /// ([`crate::TaskWallKey`]).
    pub const TASK_WALL: &str = "TASK_WALL";
    /// Names and spawn locations runtimes gave their tasks ([`crate::TaskName`]).
    pub const TASK_NAMES: &str = "TASK_NAMES";
    /// Intervals for `attach --timeline` ([`crate::TimelineEvent`]).
    pub const TIMELINE: &str = "TIMELINE";
    pub const ONCPU_SAMPLES: &str = "ONCPU_SAMPLES";
    pub const STACKS: &str = "STACKS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const CONTROL: &str = "CONTROL";
    /// User stack snapshots for DWARF unwinding (`tracer profile --unwind dwarf`).
    pub const UNWIND_SAMPLES: &str = "UNWIND_SAMPLES";
    /// The last off-CPU snapshot of each thread ([`crate::LastSnapshot`]).
    pub const OFFCPU_SNAPSHOTS: &str = "OFFCPU_SNAPSHOTS";
    /// Per-CPU sequence numbers of off-CPU snapshots.
    pub const SNAPSHOT_SEQ: &str = "SNAPSHOT_SEQ";
    /// What to check before reusing an off-CPU snapshot ([`crate::SnapshotCheck`]).
    pub const SNAPSHOT_CHECKS: &str = "SNAPSHOT_CHECKS";
    /// The last frame-pointer user stack of each thread where it blocked
    /// ([`crate::LastUserStack`]).
    pub const LAST_USER_STACKS: &str = "LAST_USER_STACKS";
    /// Off-CPU kernel stacks taken at switch in ([`crate::KernelStack`]).
    pub const KERNEL_STACKS: &str = "KERNEL_STACKS";
    /// The processes traced, by tgid ([`crate::TargetProcess`]).
    pub const TARGETS: &str = "TARGETS";
    /// Latency totals per process ([`crate::LatencyProcessKey`]).
    pub const LATENCY_BY_PROCESS: &str = "LATENCY_BY_PROCESS";
    /// Each process's latencies by histogram bucket and its time off CPU, with
    /// `PROCESS_METRICS_ON` on ([`crate::ProcessMetricKey`]).
    pub const PROCESS_METRICS: &str = "PROCESS_METRICS";
    /// The per-CPU buffer where an event with strings is assembled.
    pub const USDT_STR_SCRATCH: &str = "USDT_STR_SCRATCH";
    /// Probe hits by process and stacks (`trace --count --stack`, [`crate::HitStackKey`]).
    pub const HIT_STACKS: &str = "HIT_STACKS";
    /// Processes held (stopped) at the dynamic loader's `_dl_debug_state` until user
    /// space has attached the objects they mapped.
    pub const HELD: &str = "HELD";
    /// Traced processes seen mapping code or starting a program, for user space to look
    /// at their maps (a [`crate::held::LOOK`] each).
    pub const MAPPED_CODE: &str = "MAPPED_CODE";
    /// A tgid each time one is newly recorded in `HELD` or `MAPPED_CODE`: what user space
    /// waits on.
    pub const HELD_NOTICES: &str = "HELD_NOTICES";
    /// CPython interpreters of target processes, by tgid
    /// ([`crate::python::PythonProcess`]).
    pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
    /// Each Python thread's thread state, by thread id ([`crate::python::PythonThread`]).
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
    /// `usdt_probe` for sites in at most [`crate::FEW_LATENCIES_PER_PROBE`] latencies as
    /// begin and as end: the verifier walks each latency's code once per latency, so
    /// this one takes half the time to verify.
    pub const USDT_FEW: &str = "usdt_probe_few";
    /// `usdt_probe` that also counts hits by stack (`trace --count --stack`).
    pub const USDT_STACKS: &str = "usdt_probe_stacks";
    /// Counting, latencies and runtime task switches (a task id argument, park stacks):
    /// a program of its own, so runs without task probes never verify that part.
    pub const USDT_TASK: &str = "usdt_task";
    pub const USDT_EVENT: &str = "usdt_event";
    /// `usdt_event` for sites with at most [`crate::FEW_USDT_ARGS`] arguments: quicker
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
    /// ([`crate::ThreadRegs`]) for `tracer stacks`.
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
    /// [`crate::target_filter`]); 0 means every process.
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
    /// What makes an executing process a target (bits of [`crate::target_match`]).
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
