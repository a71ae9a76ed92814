//! The snapshots the kernel sends ([`tracer_common::UnwindSample`]), parsed from their ring
//! buffer records. Each holds a thread's registers, a copy of the top of its stack and its
//! Python frames when the kernel walked them.

use std::mem::offset_of;

use tracer_common::{StackId, UNWIND_STACK_BYTES, UnwindSample, python::PythonStack};

/// Byte offsets of the fields of [`tracer_common::UnwindSample`].
const TGID_AT: usize = offset_of!(UnwindSample, tgid);
const TID_AT: usize = offset_of!(UnwindSample, tid);
const IP_AT: usize = offset_of!(UnwindSample, ip);
const SP_AT: usize = offset_of!(UnwindSample, sp);
const BP_AT: usize = offset_of!(UnwindSample, bp);
const STACK_LEN_AT: usize = offset_of!(UnwindSample, stack_len);
const KERNEL_STACK_AT: usize = offset_of!(UnwindSample, kernel_stack_id);
const SNAPSHOT_ID_AT: usize = offset_of!(UnwindSample, snapshot_id);
const TASK_AT: usize = offset_of!(UnwindSample, task);
const PYTHON_AT: usize = offset_of!(UnwindSample, python);
const STACK_AT: usize = offset_of!(UnwindSample, stack);

/// One snapshot as read from the ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot<'a> {
    pub tgid: u32,
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The kernel stack in the stack map; [`StackId::None`] for a sample in user mode.
    pub kernel_stack: StackId,
    /// The off-CPU snapshot's id; `None` for an on-CPU sample.
    pub snapshot: Option<StackId>,
    /// For an on-CPU sample, the runtime task the thread ran (0: none known).
    pub task: u64,
    /// The thread's Python frames, when its process is a CPython interpreter the kernel
    /// walks.
    pub python: Option<Box<PythonStack>>,
    /// The stack bytes from `sp` up.
    pub stack: &'a [u8],
}

impl<'a> Snapshot<'a> {
    /// Parses a ring buffer record; `None` if it is too short.
    pub(crate) fn parse(record: &'a [u8]) -> Option<Self> {
        let u32_at = |at: usize| Some(u32::from_ne_bytes(record.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |at: usize| Some(u64::from_ne_bytes(record.get(at..at + 8)?.try_into().ok()?));
        let stack_len = (u32_at(STACK_LEN_AT)? as usize).min(UNWIND_STACK_BYTES);
        Some(Self {
            tgid: u32_at(TGID_AT)?,
            tid: u32_at(TID_AT)?,
            ip: u64_at(IP_AT)?,
            sp: u64_at(SP_AT)?,
            bp: u64_at(BP_AT)?,
            kernel_stack: StackId::decode(u32_at(KERNEL_STACK_AT)? as i32),
            // The kernel numbers snapshots from FIRST_SNAPSHOT_ID; 0 marks a sample.
            snapshot: match u32_at(SNAPSHOT_ID_AT)? {
                0 => None,
                id => Some(StackId::decode(id as i32)),
            },
            task: u64_at(TASK_AT)?,
            python: python_frames(record.get(PYTHON_AT..STACK_AT)?),
            stack: record.get(STACK_AT..STACK_AT + stack_len)?,
        })
    }
}

/// The Python frames of a snapshot's [`PythonStack`] bytes; `None` when it has none.
fn python_frames(bytes: &[u8]) -> Option<Box<PythonStack>> {
    let count = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    if count == 0 || bytes.len() < std::mem::size_of::<PythonStack>() {
        return None;
    }
    // SAFETY: `bytes` holds a whole `PythonStack`, a #[repr(C)] struct of integers for
    // which every bit pattern is valid; `read_unaligned` makes no alignment demand.
    let stack = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<PythonStack>()) };
    Some(Box::new(stack))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_fields_are_where_the_kernel_puts_them() {
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, stack),
            STACK_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, stack_len),
            STACK_LEN_AT
        );
        assert_eq!(std::mem::offset_of!(tracer_common::UnwindSample, bp), BP_AT);
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, kernel_stack_id),
            KERNEL_STACK_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, snapshot_id),
            SNAPSHOT_ID_AT
        );
        assert_eq!(
            std::mem::offset_of!(tracer_common::UnwindSample, task),
            TASK_AT
        );
        let mut record = vec![0u8; STACK_AT + 16];
        record[TGID_AT..TGID_AT + 4].copy_from_slice(&7u32.to_ne_bytes());
        record[TID_AT..TID_AT + 4].copy_from_slice(&8u32.to_ne_bytes());
        record[IP_AT..IP_AT + 8].copy_from_slice(&0x1000u64.to_ne_bytes());
        record[STACK_LEN_AT..STACK_LEN_AT + 4].copy_from_slice(&16u32.to_ne_bytes());
        record[KERNEL_STACK_AT..KERNEL_STACK_AT + 4].copy_from_slice(&(-14i32).to_ne_bytes());
        let snapshot = Snapshot::parse(&record).unwrap();
        assert_eq!((snapshot.tgid, snapshot.tid, snapshot.ip), (7, 8, 0x1000));
        assert_eq!(snapshot.kernel_stack, StackId::None);
        assert_eq!(snapshot.snapshot, None);
        assert_eq!(snapshot.stack.len(), 16);
        // A stack length beyond the record is refused.
        record[STACK_LEN_AT..STACK_LEN_AT + 4].copy_from_slice(&17u32.to_ne_bytes());
        assert_eq!(Snapshot::parse(&record), None);
    }
}
