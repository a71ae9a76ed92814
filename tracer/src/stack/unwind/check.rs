//! The check the kernel makes before it reuses an off-CPU snapshot: the stack words the
//! unwound frames depended on. A snapshot unwound through a signal frame is never reused.

use std::collections::HashSet;

use tracer_common::{MAX_SNAPSHOT_CHECKS, SnapshotCheck, StackWords};

use super::snapshot::Snapshot;

/// The check of a snapshot the kernel is not to reuse: more words than it can check.
pub(super) const NEVER_REUSE: SnapshotCheck = SnapshotCheck {
    uses_bp: 0,
    _pad: 0,
    words: StackWords {
        count: u32::MAX,
        ..StackWords::EMPTY
    },
};

/// A stack word unwinding tried to read, and what it found (`None`: outside the copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StackRead {
    pub(super) addr: u64,
    pub(super) value: Option<u64>,
}

/// Noted among the reads when unwinding went on through a signal frame: such a snapshot
/// is not to be reused.
pub(super) const THROUGH_SIGNAL_FRAME: StackRead = StackRead {
    addr: u64::MAX,
    value: None,
};

/// How far above a saved value a later read may be for the value to count as that read's
/// base (a frame pointer with the frame's words above it).
const BASE_REACH: u64 = 4096;

/// What the kernel checks before it reuses an off-CPU snapshot: the words read that the
/// frames depended on. Those are the return addresses (`frames`), the saved frame
/// pointers a later step may have used as the base of its reads (a later read at most
/// [`BASE_REACH`] above the value), and the last word read (where unwinding stopped). A
/// register saved on the stack that no step used is left out: code without frame
/// pointers keeps data in `rbp`, and a word that changes at every block (a loop counter)
/// would otherwise make every snapshot new. The frame pointer register itself matters
/// when a read may have been based on it (`unwind` notes one where frame pointer
/// unwinding stopped at it without reading). A snapshot unwound through a signal frame,
/// or whose words do not fit, is never reused.
pub(super) fn snapshot_check(
    snapshot: &Snapshot<'_>,
    reads: &[StackRead],
    frames: &[u64],
) -> SnapshotCheck {
    if reads.contains(&THROUGH_SIGNAL_FRAME) {
        return NEVER_REUSE;
    }
    let frames: HashSet<u64> = frames.iter().copied().collect();
    let used_as_base = |value: u64, later: &[StackRead]| {
        later
            .iter()
            .any(|r| r.addr >= value && r.addr - value < BASE_REACH)
    };
    let mut words = StackWords::EMPTY;
    for (i, read) in reads.iter().enumerate() {
        let Some(value) = read.value else {
            continue;
        };
        let last = i + 1 == reads.len();
        if !(last || frames.contains(&value) || used_as_base(value, &reads[i + 1..])) {
            continue;
        }
        let n = words.count as usize;
        if n == MAX_SNAPSHOT_CHECKS {
            return NEVER_REUSE;
        }
        // Within the copy, so less than UNWIND_STACK_BYTES from the stack pointer.
        let at = read.addr.wrapping_sub(snapshot.sp) as u32;
        words.offsets[n] = at;
        words.values[n] = value;
        words.count += 1;
        words.span = words.span.max(at + 8);
    }
    SnapshotCheck {
        uses_bp: u32::from(used_as_base(snapshot.bp, reads)),
        _pad: 0,
        words,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::StackId;

    /// The kernel checks the words the frames depended on: return addresses, saved frame
    /// pointers later reads were based on, and the last word read; a saved register no
    /// read used (data kept in rbp) is left out, so it may change.
    #[test]
    fn a_snapshot_check_holds_the_words_the_frames_depend_on() {
        let sp = 0x7000_0000u64;
        let snapshot = Snapshot {
            tgid: 1,
            tid: 1,
            ip: 0x1000,
            sp,
            bp: sp + 0x100,
            kernel_stack: StackId::None,
            snapshot: Some(StackId::decode(tracer_common::FIRST_SNAPSHOT_ID + 5)),
            task: 0,
            python: None,
            stack: &[],
        };
        let read = |offset: u64, value: u64| StackRead {
            addr: sp + offset,
            value: Some(value),
        };
        let reads = [
            // A loop counter saved where rbp was pushed: no read is based on it.
            read(0, 41),
            // The return address.
            read(8, 0x2000),
            // A saved frame pointer, the base of the next two reads.
            read(16, sp + 64),
            read(64, 0),
            read(72, 0x3000),
        ];
        let check = snapshot_check(&snapshot, &reads, &[0x1000, 0x2000, 0x3000]);
        let words = check.words;
        let kept: Vec<(u32, u64)> = (0..words.count as usize)
            .map(|i| (words.offsets[i], words.values[i]))
            .collect();
        assert_eq!(kept, [(8, 0x2000), (16, sp + 64), (72, 0x3000)]);
        assert_eq!(words.span, 80);
        // No read was based on the frame pointer register.
        assert_eq!(check.uses_bp, 0);
        let based_on_bp = [StackRead {
            addr: sp + 0x108,
            value: None,
        }];
        assert_eq!(snapshot_check(&snapshot, &based_on_bp, &[]).uses_bp, 1);
        // Through a signal frame: never reused.
        let through = [read(8, 0x2000), THROUGH_SIGNAL_FRAME];
        assert_eq!(snapshot_check(&snapshot, &through, &[]), NEVER_REUSE);
    }
}
