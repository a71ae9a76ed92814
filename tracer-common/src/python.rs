//! Python frames read by the eBPF programs from a CPython interpreter's own structures.
//!
//! User space finds the interpreter of a target process and writes where its thread
//! states are and how its frames are laid out ([`PythonProcess`], in `PYTHON_PROCESSES`).
//! Wherever the programs take a user stack snapshot they also walk the current thread's
//! Python frame chain and send each frame's code object and instruction
//! ([`PythonStack`]); user space names them and puts them in place of the interpreter's
//! native frames.

/// Python frames one stack holds at most (the innermost ones).
pub const MAX_PYTHON_FRAMES: usize = 64;

/// Thread states looked through, at most, to find the current thread's.
pub const MAX_PYTHON_THREADS: u32 = 64;

/// A [`PythonProcess`] offset for a field the version does not have.
pub const NO_FIELD: u16 = u16::MAX;

/// How a version marks where one `_PyEval_EvalFrameDefault` call's frames end.
pub mod boundary {
    /// Every frame has a native call of its own (3.9, 3.10).
    pub const EVERY_FRAME: u8 = 0;
    /// The outermost frame of each call has a flag set (`is_entry`, 3.11).
    pub const ENTRY_FLAG: u8 = 1;
    /// A frame owned by the C stack sits below each call's frames (3.12, 3.13).
    pub const CSTACK_OWNER: u8 = 2;
}

/// Value of `PYTHON_PROCESSES` (keyed by tgid): where a CPython interpreter keeps its
/// thread states and the byte offsets of the fields the frame walk reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// Address of the main interpreter's pointer to its first thread state.
    pub threads_head: u64,
    pub tstate_next: u16,
    /// `thread_id`: the thread's `pthread_self()`, which is its FS base on x86-64.
    pub tstate_thread_id: u16,
    /// The thread state's pointer to its current frame, or to the `_PyCFrame` that has it.
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame`, or [`NO_FIELD`] when `tstate_frame` is the frame.
    pub cframe_current_frame: u16,
    pub frame_previous: u16,
    pub frame_code: u16,
    /// The instruction field: `f_lasti`, `prev_instr` or `instr_ptr`.
    pub frame_instr: u16,
    /// `is_entry` (3.11), or [`NO_FIELD`].
    pub frame_entry: u16,
    /// `owner` (3.12+), or [`NO_FIELD`].
    pub frame_owner: u16,
    /// Bytes read of each frame: every field above lies below it (at most 128).
    pub frame_size: u16,
    /// One of [`boundary`].
    pub boundary: u8,
    /// The `owner` value of entry frames (`FRAME_OWNED_BY_CSTACK`).
    pub cstack_owner: u8,
    pub _pad: [u8; 2],
}

/// One Python frame: its code object and the raw instruction field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonFrame {
    pub code: u64,
    pub instr: u64,
}

/// A thread's Python frames, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonStack {
    /// Frames in `frames`.
    pub count: u32,
    /// Non-zero when the chain went on beyond [`MAX_PYTHON_FRAMES`].
    pub truncated: u32,
    /// Bit `i` set: frame `i` is the outermost of its `_PyEval_EvalFrameDefault` call.
    pub boundaries: u64,
    /// A hash of every frame's code and instruction: equal hashes, same Python stack.
    pub hash: u64,
    pub _pad: u64,
    pub frames: [PythonFrame; MAX_PYTHON_FRAMES],
}

impl PythonStack {
    pub const EMPTY: PythonStack = PythonStack {
        count: 0,
        truncated: 0,
        boundaries: 0,
        hash: 0,
        _pad: 0,
        frames: [PythonFrame { code: 0, instr: 0 }; MAX_PYTHON_FRAMES],
    };

    /// Bytes before `frames`.
    pub const HEADER_BYTES: usize = 32;
}

/// Value of `PYTHON_THREADS` (keyed by thread id): the thread state found for a thread,
/// checked at each use, and when it was found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonThread {
    pub tstate: u64,
    pub found_ns: u64,
}
