//! Where CPython keeps the state a profiler reads from outside the process.
//!
//! [`Layout`] holds the byte offsets of the fields of CPython's runtime, interpreter,
//! thread, frame, code and string structures, for one minor version.
//! The offsets are for x86-64 Linux release builds of CPython with the GIL (neither
//! `Py_DEBUG` nor `Py_GIL_DISABLED`).
//! They come from the structures in CPython's headers.
//! They hold for every patch release of a minor version.
//! CPython 3.13 also describes most of them itself, in the `_Py_DebugOffsets` structure
//! at the start of `_PyRuntime`.
//! [`layout_from_debug_offsets`] reads that structure.
//!
//! # From the runtime to a thread's innermost frame
//!
//! `_PyRuntime` is an exported symbol of `libpython`, or of a statically linked `python`.
//! It holds the list of interpreters at [`Layout::runtime_interpreters_head`].
//! Each interpreter holds the list of its threads at [`Layout::interp_threads_head`].
//! The thread states are linked through [`Layout::tstate_next`].
//! A thread state's [`Layout::tstate_frame`] leads to the innermost frame of the thread:
//! - in 3.9 and 3.10 it is a pointer to that frame (`PyFrameObject *frame`);
//! - in 3.11 and 3.12 it is a pointer to a `_PyCFrame`, whose field at
//!   [`Layout::cframe_current_frame`] points to that frame;
//! - in 3.13 it is a pointer to that frame (`_PyInterpreterFrame *current_frame`).
//!
//! A null frame pointer means the thread has no Python frame.
//!
//! # The frame chain
//!
//! Each frame points to its caller's frame at [`Layout::frame_previous`].
//! The outermost frame points to null.
//! `_PyEval_EvalFrameDefault` is the C function that runs Python code, and a native stack
//! shows one call of it for each run of the interpreter loop.
//! How the frame chain splits into those calls differs per version:
//! - In 3.9 and 3.10 the frames are `PyFrameObject`s.
//!   Every Python frame has a `_PyEval_EvalFrameDefault` call of its own.
//! - In 3.11 the frames are `_PyInterpreterFrame`s.
//!   One `_PyEval_EvalFrameDefault` call runs a Python function together with the Python
//!   functions that it calls straight from Python code.
//!   The `is_entry` flag at [`Layout::frame_entry`] is set on the first (outermost) frame
//!   of each call.
//!   A call's frames run from the innermost one out to the next frame whose `is_entry` is
//!   set, that one included.
//! - In 3.12 and 3.13 one `_PyEval_EvalFrameDefault` call also runs many frames.
//!   Each call pushes an entry frame of its own (the "shim", on the C stack) below
//!   (outward of) the frames it runs.
//!   The shim's `owner` at [`Layout::frame_owner`] is [`FRAME_OWNED_BY_CSTACK`].
//!   The shim is no Python frame.
//!   A call's frames run from the innermost one out to the next shim, that one excluded.
//!   In 3.12 the shim's code is the interpreter's trampoline code object
//!   (`<interpreter trampoline>`).
//!   In 3.13 the shim's `f_executable` is `None`, which is no code object.
//!
//! A frame of a running generator or coroutine sits in the chain like any other frame.
//! From 3.11 its `owner` is 1 (`FRAME_OWNED_BY_GENERATOR`).
//!
//! # The instruction a frame is at
//!
//! [`Layout::frame_instr`] tells which instruction a frame is executing.
//! Its form differs per version:
//! - In 3.9 `f_lasti` is a C `int`.
//!   It is the byte offset of the last instruction started, or -1 before the first one.
//! - In 3.10 `f_lasti` is a C `int`.
//!   It is the index in code units (two bytes each) of the last instruction started, or -1
//!   before the first one.
//! - In 3.11 and 3.12 `prev_instr` points into the code object's `co_code_adaptive`.
//!   It points at the code unit just before the next instruction to run.
//!   That is usually the last code unit of the last instruction started.
//!   It may also be an inline cache entry of that instruction, or an instruction jumped
//!   over.
//!   A frame that has not started yet points one code unit before the first instruction.
//! - In 3.13 `instr_ptr` points into `co_code_adaptive`.
//!   It points at the instruction executing now (or about to begin).
//!   A frame that has not started yet points at the first instruction.
//!
//! While a frame calls another, the field of 3.11 and 3.12 points at the last inline cache
//! entry of the call instruction.
//! While a frame calls another, the field of 3.13 points at the call instruction itself.
//! CPython finds a frame's line from the offset of that field in the code, in every
//! version (`_PyInterpreterFrame_LASTI` from 3.11).
//! [`super::lines::instruction_offset`] turns the raw field into that offset in bytes.

/// Byte offsets of the CPython structures the tracer reads, for one minor version.
///
/// Every offset is from the start of the structure it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The minor version, as `(major, minor)`.
    pub version: (u8, u8),
    /// Offset of `interpreters.head` (a `PyInterpreterState *`) in `_PyRuntimeState`.
    pub runtime_interpreters_head: u64,
    /// Offset of the head of an interpreter's list of thread states (a `PyThreadState *`).
    ///
    /// The field is `tstate_head` in 3.9 and 3.10, and `threads.head` from 3.11.
    /// The list starts with the newest thread.
    pub interp_threads_head: u64,
    /// Offset of `next` (a `PyThreadState *`) in `PyThreadState`.
    pub tstate_next: u64,
    /// Offset of `thread_id` in `PyThreadState`: the thread's `pthread_self()`.
    pub tstate_thread_id: u64,
    /// Offset of `native_thread_id` in `PyThreadState`: the thread's kernel thread ID.
    ///
    /// Versions before 3.11 do not record it.
    pub tstate_native_thread_id: Option<u64>,
    /// Offset of the pointer in `PyThreadState` that leads to the innermost frame.
    ///
    /// The field is `frame` in 3.9 and 3.10, `cframe` in 3.11 and 3.12, and
    /// `current_frame` in 3.13.
    pub tstate_frame: u64,
    /// Offset of `current_frame` in `_PyCFrame`, for 3.11 and 3.12 only.
    pub cframe_current_frame: Option<u64>,
    /// Offset of the pointer to the caller's frame: `f_back` before 3.11, `previous` from
    /// 3.11.
    pub frame_previous: u64,
    /// Offset of the frame's code object: `f_code` up to 3.12, `f_executable` in 3.13.
    ///
    /// In 3.13 the shim's `f_executable` is `None` rather than a code object.
    pub frame_code: u64,
    /// Offset of the frame's instruction field: `f_lasti` (a C `int`) in 3.9 and 3.10,
    /// `prev_instr` in 3.11 and 3.12, `instr_ptr` in 3.13.
    pub frame_instr: u64,
    /// Offset of `is_entry` (a `bool`), for 3.11 only.
    pub frame_entry: Option<u64>,
    /// Offset of `owner` (a `char`), from 3.11.
    pub frame_owner: Option<u64>,
    /// Bytes from the frame's start that cover every frame field above, rounded up to 8.
    pub frame_size: u64,
    /// Offset of `co_filename` (a `str`) in `PyCodeObject`.
    pub code_filename: u64,
    /// Offset of `co_name` (a `str`) in `PyCodeObject`.
    pub code_name: u64,
    /// Offset of `co_qualname` (a `str`) in `PyCodeObject`, from 3.11.
    pub code_qualname: Option<u64>,
    /// Offset of `co_firstlineno` (a C `int`) in `PyCodeObject`.
    pub code_firstlineno: u64,
    /// Offset of the line table (a `bytes` object) in `PyCodeObject`.
    ///
    /// The field is `co_lnotab` in 3.9 and `co_linetable` from 3.10.
    pub code_linetable: u64,
    /// Offset of `co_code_adaptive` in `PyCodeObject`, from 3.11.
    ///
    /// The instructions are stored inline in the code object from there on.
    pub code_adaptive: Option<u64>,
    /// Offset of the `state` bit field word in `PyASCIIObject`.
    ///
    /// Bits 2 to 4 hold the kind, bit 5 the compact flag and bit 6 the ASCII flag.
    pub unicode_state: u64,
    /// Offset of `length` (in code points) in `PyASCIIObject`.
    pub unicode_length: u64,
    /// `sizeof(PyASCIIObject)`: where the characters of a compact ASCII string start.
    pub ascii_data: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where the characters of a compact non-ASCII
    /// string start.
    pub compact_data: u64,
    /// Offset of `ob_size` (the length) in `PyBytesObject`.
    pub bytes_size: u64,
    /// Offset of `ob_sval` (the first byte) in `PyBytesObject`.
    pub bytes_data: u64,
}

/// The `owner` of the entry frame ("shim") that each `_PyEval_EvalFrameDefault` call
/// pushes in 3.12 and 3.13.
///
/// It is the value of `FRAME_OWNED_BY_CSTACK` in `enum _frameowner` of both versions.
pub(crate) const FRAME_OWNED_BY_CSTACK: u8 = 3;

const PY_3_9: Layout = Layout {
    version: (3, 9),
    runtime_interpreters_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_native_thread_id: None,
    tstate_frame: 24,
    cframe_current_frame: None,
    frame_previous: 24,
    frame_code: 32,
    frame_instr: 104,
    frame_entry: None,
    frame_owner: None,
    frame_size: 112,
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    code_firstlineno: 40,
    code_linetable: 120,
    code_adaptive: None,
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 48,
    compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const PY_3_10: Layout = Layout {
    version: (3, 10),
    runtime_interpreters_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_native_thread_id: None,
    tstate_frame: 24,
    cframe_current_frame: None,
    frame_previous: 24,
    frame_code: 32,
    frame_instr: 96,
    frame_entry: None,
    frame_owner: None,
    frame_size: 104,
    code_filename: 104,
    code_name: 112,
    code_qualname: None,
    code_firstlineno: 40,
    code_linetable: 120,
    code_adaptive: None,
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 48,
    compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const PY_3_11: Layout = Layout {
    version: (3, 11),
    runtime_interpreters_head: 40,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_native_thread_id: Some(160),
    tstate_frame: 56,
    cframe_current_frame: Some(8),
    frame_previous: 48,
    frame_code: 32,
    frame_instr: 56,
    frame_entry: Some(68),
    frame_owner: Some(69),
    frame_size: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 72,
    code_linetable: 136,
    code_adaptive: Some(184),
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 48,
    compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const PY_3_12: Layout = Layout {
    version: (3, 12),
    runtime_interpreters_head: 40,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_native_thread_id: Some(144),
    tstate_frame: 56,
    cframe_current_frame: Some(0),
    frame_previous: 8,
    frame_code: 0,
    frame_instr: 56,
    frame_entry: None,
    frame_owner: Some(70),
    frame_size: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 68,
    code_linetable: 136,
    code_adaptive: Some(192),
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 40,
    compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
};

const PY_3_13: Layout = Layout {
    version: (3, 13),
    runtime_interpreters_head: 632,
    interp_threads_head: 7344,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_native_thread_id: Some(160),
    tstate_frame: 72,
    cframe_current_frame: None,
    frame_previous: 8,
    frame_code: 0,
    frame_instr: 56,
    frame_entry: None,
    frame_owner: Some(70),
    frame_size: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_firstlineno: 68,
    code_linetable: 136,
    code_adaptive: Some(200),
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 40,
    compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
};

/// The layout of CPython `major.minor`, or `None` for a version without one.
pub(crate) fn layout(major: u8, minor: u8) -> Option<Layout> {
    match (major, minor) {
        (3, 9) => Some(PY_3_9),
        (3, 10) => Some(PY_3_10),
        (3, 11) => Some(PY_3_11),
        (3, 12) => Some(PY_3_12),
        (3, 13) => Some(PY_3_13),
        _ => None,
    }
}

/// The bytes `_Py_DebugOffsets` starts with.
pub(crate) const DEBUG_OFFSETS_COOKIE: &[u8; 8] = b"xdebugpy";

/// `sizeof(_Py_DebugOffsets)` in 3.13: how many bytes from the start of `_PyRuntime`
/// [`layout_from_debug_offsets`] reads.
pub(crate) const DEBUG_OFFSETS_SIZE_3_13: usize = 584;

/// Where the fields of 3.13's `_Py_DebugOffsets` are, from its start.
///
/// Each nested structure of `_Py_DebugOffsets` starts with the size of the structure it
/// describes, followed by offsets into that structure, all `uint64_t`.
mod debug_offsets_3_13 {
    pub(super) const VERSION: usize = 8;
    pub(super) const FREE_THREADED: usize = 16;

    pub(super) const RUNTIME_SIZE: usize = 24;
    pub(super) const RUNTIME_INTERPRETERS_HEAD: usize = 40;

    pub(super) const INTERP_SIZE: usize = 48;
    pub(super) const INTERP_THREADS_HEAD: usize = 72;

    pub(super) const TSTATE_SIZE: usize = 152;
    pub(super) const TSTATE_NEXT: usize = 168;
    pub(super) const TSTATE_CURRENT_FRAME: usize = 184;
    pub(super) const TSTATE_THREAD_ID: usize = 192;
    pub(super) const TSTATE_NATIVE_THREAD_ID: usize = 200;

    pub(super) const FRAME_SIZE: usize = 224;
    pub(super) const FRAME_PREVIOUS: usize = 232;
    pub(super) const FRAME_EXECUTABLE: usize = 240;
    pub(super) const FRAME_INSTR_PTR: usize = 248;
    pub(super) const FRAME_OWNER: usize = 264;

    pub(super) const CODE_SIZE: usize = 272;
    pub(super) const CODE_FILENAME: usize = 280;
    pub(super) const CODE_NAME: usize = 288;
    pub(super) const CODE_QUALNAME: usize = 296;
    pub(super) const CODE_LINETABLE: usize = 304;
    pub(super) const CODE_FIRSTLINENO: usize = 312;
    pub(super) const CODE_ADAPTIVE: usize = 344;

    pub(super) const BYTES_SIZE: usize = 512;
    pub(super) const BYTES_OB_SIZE: usize = 520;
    pub(super) const BYTES_OB_SVAL: usize = 528;

    pub(super) const UNICODE_SIZE: usize = 536;
    pub(super) const UNICODE_STATE: usize = 544;
    pub(super) const UNICODE_LENGTH: usize = 552;
    pub(super) const UNICODE_ASCIIOBJECT_SIZE: usize = 560;
}

/// The layout that a 3.13 process describes in `_Py_DebugOffsets`, the structure at the
/// start of its `_PyRuntime`, given at least the first [`DEBUG_OFFSETS_SIZE_3_13`] bytes
/// of `_PyRuntime`.
///
/// The bytes must start with [`DEBUG_OFFSETS_COOKIE`].
/// The version word (`PY_VERSION_HEX`) must say 3.13, because the structure changes
/// between minor versions.
/// A free-threaded build is refused, because its objects differ from what the rest of
/// [`Layout`] describes.
/// An offset that lies outside the structure it belongs to (by that structure's size, as
/// recorded alongside) is refused.
/// `_Py_DebugOffsets` does not record `sizeof(PyCompactUnicodeObject)`, which comes from
/// the 3.13 table, as do the fields 3.13 does not have.
/// [`Layout::frame_size`] is derived from the frame offsets read.
pub(crate) fn layout_from_debug_offsets(bytes: &[u8]) -> Option<Layout> {
    use debug_offsets_3_13 as at;

    if bytes.len() < DEBUG_OFFSETS_SIZE_3_13 || !bytes.starts_with(DEBUG_OFFSETS_COOKIE) {
        return None;
    }
    let word = |offset: usize| -> Option<u64> {
        let field = bytes.get(offset..offset + 8)?;
        Some(u64::from_le_bytes(field.try_into().ok()?))
    };
    // An offset into a structure of the recorded size, holding a field of `width` bytes.
    let field = |offset: usize, size_at: usize, width: u64| -> Option<u64> {
        let value = word(offset)?;
        let size = word(size_at)?;
        (value.checked_add(width)? <= size).then_some(value)
    };

    let version = word(at::VERSION)?;
    let (major, minor) = ((version >> 24) & 0xff, (version >> 16) & 0xff);
    if (major, minor) != (3, 13) || word(at::FREE_THREADED)? != 0 {
        return None;
    }
    let table = layout(3, 13)?;

    let frame_previous = field(at::FRAME_PREVIOUS, at::FRAME_SIZE, 8)?;
    let frame_code = field(at::FRAME_EXECUTABLE, at::FRAME_SIZE, 8)?;
    let frame_instr = field(at::FRAME_INSTR_PTR, at::FRAME_SIZE, 8)?;
    let frame_owner = field(at::FRAME_OWNER, at::FRAME_SIZE, 1)?;
    let frame_end = (frame_previous + 8)
        .max(frame_code + 8)
        .max(frame_instr + 8)
        .max(frame_owner + 1);

    Some(Layout {
        version: (3, 13),
        runtime_interpreters_head: field(at::RUNTIME_INTERPRETERS_HEAD, at::RUNTIME_SIZE, 8)?,
        interp_threads_head: field(at::INTERP_THREADS_HEAD, at::INTERP_SIZE, 8)?,
        tstate_next: field(at::TSTATE_NEXT, at::TSTATE_SIZE, 8)?,
        tstate_thread_id: field(at::TSTATE_THREAD_ID, at::TSTATE_SIZE, 8)?,
        tstate_native_thread_id: Some(field(at::TSTATE_NATIVE_THREAD_ID, at::TSTATE_SIZE, 8)?),
        tstate_frame: field(at::TSTATE_CURRENT_FRAME, at::TSTATE_SIZE, 8)?,
        cframe_current_frame: None,
        frame_previous,
        frame_code,
        frame_instr,
        frame_entry: None,
        frame_owner: Some(frame_owner),
        frame_size: frame_end.div_ceil(8) * 8,
        code_filename: field(at::CODE_FILENAME, at::CODE_SIZE, 8)?,
        code_name: field(at::CODE_NAME, at::CODE_SIZE, 8)?,
        code_qualname: Some(field(at::CODE_QUALNAME, at::CODE_SIZE, 8)?),
        code_firstlineno: field(at::CODE_FIRSTLINENO, at::CODE_SIZE, 4)?,
        code_linetable: field(at::CODE_LINETABLE, at::CODE_SIZE, 8)?,
        // The instructions follow the fixed part of the code object, so the offset may
        // equal the recorded size.
        code_adaptive: Some(field(at::CODE_ADAPTIVE, at::CODE_SIZE, 0)?),
        unicode_state: field(at::UNICODE_STATE, at::UNICODE_SIZE, 4)?,
        unicode_length: field(at::UNICODE_LENGTH, at::UNICODE_SIZE, 8)?,
        ascii_data: field(at::UNICODE_ASCIIOBJECT_SIZE, at::UNICODE_SIZE, 0)?,
        compact_data: table.compact_data,
        bytes_size: field(at::BYTES_OB_SIZE, at::BYTES_SIZE, 8)?,
        bytes_data: field(at::BYTES_OB_SVAL, at::BYTES_SIZE, 1)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes of `_PyRuntime` of a running CPython 3.13.0 (pyenv build, x86-64).
    const RUNTIME_3_13: &[u8] = include_bytes!("testdata/pyruntime_3.13.0.bin");

    #[test]
    fn debug_offsets_match_the_table() {
        assert_eq!(layout_from_debug_offsets(RUNTIME_3_13), layout(3, 13));
    }

    #[test]
    fn debug_offsets_need_the_cookie_the_version_and_enough_bytes() {
        let mut bytes = RUNTIME_3_13.to_vec();
        assert!(layout_from_debug_offsets(&bytes[..DEBUG_OFFSETS_SIZE_3_13]).is_some());
        assert_eq!(
            layout_from_debug_offsets(&bytes[..DEBUG_OFFSETS_SIZE_3_13 - 1]),
            None
        );

        bytes[0] = b'X';
        assert_eq!(layout_from_debug_offsets(&bytes), None);
        bytes[0] = b'x';

        // PY_VERSION_HEX of 3.14.0 final.
        bytes[8..16].copy_from_slice(&0x030e_00f0_u64.to_le_bytes());
        assert_eq!(layout_from_debug_offsets(&bytes), None);
        // A later 3.13 patch release is accepted.
        bytes[8..16].copy_from_slice(&0x030d_05f0_u64.to_le_bytes());
        assert_eq!(layout_from_debug_offsets(&bytes), layout(3, 13));

        bytes[16] = 1;
        assert_eq!(layout_from_debug_offsets(&bytes), None);
    }

    #[test]
    fn debug_offsets_refuse_an_offset_outside_its_structure() {
        let mut bytes = RUNTIME_3_13.to_vec();
        let at = debug_offsets_3_13::TSTATE_THREAD_ID;
        bytes[at..at + 8].copy_from_slice(&1_000_000_u64.to_le_bytes());
        assert_eq!(layout_from_debug_offsets(&bytes), None);
    }

    #[test]
    fn the_table_covers_3_9_to_3_13() {
        for minor in 9..=13 {
            let table = layout(3, minor).expect("a supported version");
            assert_eq!(table.version, (3, minor));
        }
        assert_eq!(layout(3, 8), None);
        assert_eq!(layout(3, 14), None);
        assert_eq!(layout(2, 7), None);
    }

    #[test]
    fn optional_fields_follow_the_version() {
        for minor in 9..=13 {
            let table = layout(3, minor).expect("a supported version");
            assert_eq!(table.tstate_native_thread_id.is_some(), minor >= 11);
            assert_eq!(
                table.cframe_current_frame.is_some(),
                minor == 11 || minor == 12
            );
            assert_eq!(table.frame_entry.is_some(), minor == 11);
            assert_eq!(table.frame_owner.is_some(), minor >= 11);
            assert_eq!(table.code_qualname.is_some(), minor >= 11);
            assert_eq!(table.code_adaptive.is_some(), minor >= 11);
        }
    }

    #[test]
    fn frame_size_covers_the_frame_fields() {
        for minor in 9..=13 {
            let table = layout(3, minor).expect("a supported version");
            let instr_width = if minor <= 10 { 4 } else { 8 };
            let ends = [
                table.frame_previous + 8,
                table.frame_code + 8,
                table.frame_instr + instr_width,
                table.frame_entry.map_or(0, |at| at + 1),
                table.frame_owner.map_or(0, |at| at + 1),
            ];
            let end = ends.into_iter().max().unwrap_or(0);
            assert_eq!(table.frame_size, end.div_ceil(8) * 8, "3.{minor}");
        }
    }
}
