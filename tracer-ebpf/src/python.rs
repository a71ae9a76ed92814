//! The current thread's Python frames, walked from its CPython thread state (see
//! `tracer_common::python`). The thread state is found by the thread's FS base, which
//! CPython keeps in `thread_id`, and remembered per thread once found (`PYTHON_THREADS`),
//! checked again at each use.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_get_current_task_btf, bpf_probe_read_user};
use tracer_common::control;
use tracer_common::python::{
    MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS, NO_FIELD, PythonProcess, PythonStack, PythonThread,
    boundary,
};

use crate::{PYTHON_PROCESSES, PYTHON_SCRATCH, PYTHON_THREADS, TASK_FSBASE_OFFSET, setting};

/// Words of a frame read at once: every field the walk needs lies in its first 128 bytes.
const FRAME_WORDS: usize = 16;

/// The current thread's Python frames, gathered in this CPU's scratch buffer; `None` when
/// its process is not a Python target or the thread runs no Python. `WALK`: false in the
/// programs loaded while no target runs Python, which the verifier then checks without
/// the walk's loops.
#[inline(always)]
pub fn current_stack<const WALK: bool>(
    tgid: u32,
    tid: u32,
    now: u64,
) -> Option<&'static PythonStack> {
    if !WALK {
        return None;
    }
    // An array slot, before a hash lookup that most runs (no Python) would make for
    // nothing at every switch.
    if crate::CONTROL
        .get(control::PYTHON)
        .is_none_or(|&on| on == 0)
    {
        return None;
    }
    // SAFETY: the value is copied out at once.
    let process = *unsafe { PYTHON_PROCESSES.get(&tgid) }?;
    let tstate = thread_state(&process, tid, now)?;
    let scratch = PYTHON_SCRATCH.get_ptr_mut(0)?;
    let mut frame = read_u64(tstate + u64::from(process.tstate_frame))?;
    if process.cframe_current_frame != NO_FIELD && frame != 0 {
        frame = read_u64(frame + u64::from(process.cframe_current_frame))?;
    }
    let size = u32::from(process.frame_size).min(FRAME_WORDS as u32 * 8);
    let mut words = [0u64; FRAME_WORDS];
    // The running totals live in the scratch map, not in registers: the verifier then
    // sees one state per iteration, not one per path through the earlier ones.
    // SAFETY: per-CPU scratch, valid while the program runs; only this CPU writes it.
    unsafe {
        (*scratch).count = 0;
        (*scratch).truncated = 0;
        (*scratch).boundaries = 0;
        (*scratch).hash = FNV_OFFSET;
    }
    for _ in 0..MAX_PYTHON_FRAMES + 8 {
        if frame == 0 {
            break;
        }
        // SAFETY: as above.
        let count = unsafe { (*scratch).count } as usize;
        if count >= MAX_PYTHON_FRAMES {
            // SAFETY: as above.
            unsafe { (*scratch).truncated = 1 };
            break;
        }
        // SAFETY: `words` has room for 128 bytes and `size` is at most that; the helper
        // checks the user address and fails on a fault.
        let read = unsafe {
            bpf_probe_read_user(
                words.as_mut_ptr().cast::<c_void>(),
                size,
                frame as *const c_void,
            )
        };
        if read != 0 {
            break;
        }
        let previous = word_at(&words, process.frame_previous);
        if process.frame_owner != NO_FIELD
            && byte_at(&words, process.frame_owner) == process.cstack_owner
        {
            // The entry frame of a `_PyEval_EvalFrameDefault` call: the frame above it
            // was that call's outermost.
            if count > 0 && process.boundary == boundary::CSTACK_OWNER {
                // SAFETY: as above.
                unsafe { (*scratch).boundaries |= 1 << ((count - 1) & 63) };
            }
            frame = previous;
            continue;
        }
        let code = word_at(&words, process.frame_code);
        let instr = word_at(&words, process.frame_instr);
        let outermost = match process.boundary {
            boundary::EVERY_FRAME => true,
            boundary::ENTRY_FLAG => byte_at(&words, process.frame_entry) != 0,
            _ => false,
        };
        // SAFETY: as above; the index is masked into the array.
        unsafe {
            let slot = &mut (*scratch).frames[count & (MAX_PYTHON_FRAMES - 1)];
            slot.code = code;
            slot.instr = instr;
            if outermost {
                (*scratch).boundaries |= 1 << (count & 63);
            }
            let hash = ((*scratch).hash ^ code).wrapping_mul(FNV_PRIME);
            (*scratch).hash = (hash ^ instr).wrapping_mul(FNV_PRIME);
            (*scratch).count = count as u32 + 1;
        }
        frame = previous;
    }
    // SAFETY: as above.
    unsafe {
        if (*scratch).count == 0 {
            return None;
        }
        (*scratch).hash |= 1;
        Some(&*scratch)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 8-byte word at byte offset `offset` (a multiple of 8) of a frame read.
#[inline(always)]
fn word_at(words: &[u64; FRAME_WORDS], offset: u16) -> u64 {
    words[(offset as usize >> 3) & (FRAME_WORDS - 1)]
}

/// The byte at `offset` of a frame read.
#[inline(always)]
fn byte_at(words: &[u64; FRAME_WORDS], offset: u16) -> u8 {
    (word_at(words, offset & !7) >> ((offset & 7) * 8)) as u8
}

/// The current thread's thread state: the one remembered if it still names this thread,
/// else found in the interpreter's list (and remembered).
#[inline(always)]
fn thread_state(process: &PythonProcess, tid: u32, now: u64) -> Option<u64> {
    // SAFETY: the helper takes no memory from us and returns the current task (trusted by
    // the verifier); the field is read by a plain load the verifier checks against BTF.
    let fsbase: u64 = crate::targets::trusted_field(
        unsafe { bpf_get_current_task_btf() } as *const u8,
        setting(&TASK_FSBASE_OFFSET),
    );
    if fsbase == 0 {
        return None;
    }
    let thread_id_at = u64::from(process.tstate_thread_id);
    // SAFETY: the value is copied out at once.
    if let Some(known) = unsafe { PYTHON_THREADS.get(&tid) }.copied()
        && read_u64(known.tstate + thread_id_at) == Some(fsbase)
    {
        return Some(known.tstate);
    }
    let mut tstate = read_u64(process.threads_head).unwrap_or(0);
    let mut found = 0;
    for _ in 0..MAX_PYTHON_THREADS {
        if tstate == 0 {
            break;
        }
        if read_u64(tstate + thread_id_at) == Some(fsbase) {
            found = tstate;
            break;
        }
        tstate = read_u64(tstate + u64::from(process.tstate_next)).unwrap_or(0);
    }
    // Not found is not remembered: a thread's state is linked before the thread binds to
    // it, and a thread that blocks soon after binding would otherwise go unnamed.
    if found == 0 {
        return None;
    }
    let entry = PythonThread {
        tstate: found,
        found_ns: now,
    };
    // LRU: a full map forgets the thread used least recently, found again when it runs.
    let _ = PYTHON_THREADS.insert(&tid, &entry, 0);
    Some(found)
}

/// An 8-byte word of user memory; `None` where it faults.
#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: the destination is our 8-byte local; the helper checks the user address.
    let ret = unsafe {
        bpf_probe_read_user(
            core::ptr::addr_of_mut!(value).cast::<c_void>(),
            8,
            addr as *const c_void,
        )
    };
    (ret == 0).then_some(value)
}
