//! USDT probes: the limits, each site's argument specs, the events and strings sent per
//! hit, and the stacks counted per hit.

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
    /// [`STACK_NOT_TAKEN`](crate::STACK_NOT_TAKEN) unless the site has
    /// `site_flags::STACKS`.
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
