//! Stack ids: the `i32` by which every map key and event names a stack.
//!
//! One id space holds the stacks of every source, each in a range of its own, and the
//! sentinels that say why a stack is not there. The eBPF side writes the raw `i32`s;
//! user space decodes them once with [`StackId::decode`] and matches on what they mean.
//! The ranges and sentinels live here alone, so both sides agree on them.

use core::ops::Range;

/// Ids in `STACKS`, the kernel's stack map (`bpf_get_stackid`); its size stays below
/// the end of this range.
pub const STACK_MAP_IDS: Range<i32> = 0..FIRST_SWITCH_IN_STACK_ID;

/// Ids of the kernel stacks taken when a thread comes back on CPU (`KERNEL_STACKS`):
/// `FIRST_SWITCH_IN_STACK_ID + (hash % SWITCH_IN_STACK_IDS)`, the next ones tried when
/// taken by another stack.
pub const FIRST_SWITCH_IN_STACK_ID: i32 = 1 << 23;
pub const SWITCH_IN_STACK_IDS: u32 = 1 << 23;

/// Ids user space gives the on-CPU user stacks it unwinds from stack copies.
pub const UNWOUND_IDS: Range<i32> = FIRST_UNWOUND_ID..FIRST_SEEDED_ID;
pub const FIRST_UNWOUND_ID: i32 = FIRST_SWITCH_IN_STACK_ID + SWITCH_IN_STACK_IDS as i32;

/// Ids user space gives the stacks /proc shows for threads already blocked when
/// profiling started.
pub const SEEDED_IDS: Range<i32> = FIRST_SEEDED_ID..FIRST_SNAPSHOT_ID;
pub const FIRST_SEEDED_ID: i32 = 1 << 29;

/// Ids of off-CPU stack copies (snapshots), which user space unwinds; up to `i32::MAX`.
pub const FIRST_SNAPSHOT_ID: i32 = 1 << 30;

/// No stack of this kind to take (`-EFAULT` from `bpf_get_stackid`): a sample in user
/// mode has no kernel stack, a kernel thread no user stack. Not an error.
pub const NO_STACK: i32 = -14;

/// A thread user space marked as off CPU when profiling started: it may have blocked
/// long before, and where is not known. Never a kernel errno.
pub const STACK_BEFORE_START: i32 = i32::MIN;

/// An event of a site that was not asked for stacks.
pub const STACK_NOT_TAKEN: i32 = i32::MIN + 1;

/// The time of short off-CPU intervals whose kernel stack was not sampled (see
/// `KERNEL_STACK_ALWAYS_NS`).
pub const KERNEL_STACK_NOT_SAMPLED: i32 = i32::MIN + 2;

/// The kernel stack of a thread still blocked: it is taken when the thread comes back
/// (or, still blocked when tracing stops, read from /proc).
pub const KERNEL_STACK_AT_SWITCH_IN: i32 = i32::MIN + 3;

/// A thread came back on CPU, and the kernel gave no frames of where it blocked.
pub const KERNEL_STACK_UNREADABLE: i32 = i32::MIN + 4;

/// A thread's return to the CPU went unseen: where it blocked in the kernel was gone
/// from its stack by the time its interval was closed.
pub const KERNEL_STACK_MISSED: i32 = i32::MIN + 5;

/// What a raw stack id stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StackId {
    /// An id in `STACKS`.
    StackMap(i32),
    /// A kernel stack in `KERNEL_STACKS`, taken when its thread came back on CPU.
    SwitchIn(i32),
    /// An on-CPU user stack that user space unwound.
    Unwound(i32),
    /// A stack /proc showed for a thread blocked when profiling started.
    Seeded(i32),
    /// An off-CPU stack copy that user space unwinds.
    Snapshot(i32),
    /// No stack of this kind exists ([`NO_STACK`]).
    None,
    /// See [`STACK_BEFORE_START`].
    BeforeStart,
    /// See [`STACK_NOT_TAKEN`].
    NotTaken,
    /// See [`KERNEL_STACK_NOT_SAMPLED`].
    NotSampled,
    /// See [`KERNEL_STACK_AT_SWITCH_IN`].
    AtSwitchIn,
    /// See [`KERNEL_STACK_UNREADABLE`].
    Unreadable,
    /// See [`KERNEL_STACK_MISSED`].
    Missed,
    /// The kernel failed to record the stack with this errno (positive).
    Lost(i32),
}

impl StackId {
    /// What `raw`, as the kernel or user space wrote it, stands for.
    pub const fn decode(raw: i32) -> StackId {
        match raw {
            NO_STACK => StackId::None,
            STACK_BEFORE_START => StackId::BeforeStart,
            STACK_NOT_TAKEN => StackId::NotTaken,
            KERNEL_STACK_NOT_SAMPLED => StackId::NotSampled,
            KERNEL_STACK_AT_SWITCH_IN => StackId::AtSwitchIn,
            KERNEL_STACK_UNREADABLE => StackId::Unreadable,
            KERNEL_STACK_MISSED => StackId::Missed,
            0..FIRST_SWITCH_IN_STACK_ID => StackId::StackMap(raw),
            FIRST_SWITCH_IN_STACK_ID..FIRST_UNWOUND_ID => StackId::SwitchIn(raw),
            FIRST_UNWOUND_ID..FIRST_SEEDED_ID => StackId::Unwound(raw),
            FIRST_SEEDED_ID..FIRST_SNAPSHOT_ID => StackId::Seeded(raw),
            FIRST_SNAPSHOT_ID..=i32::MAX => StackId::Snapshot(raw),
            // Every other negative id is an errno of the helper that took the stack.
            _ => StackId::Lost(raw.wrapping_neg()),
        }
    }

    /// The raw id that [`StackId::decode`] reads back as `self`.
    pub const fn raw(self) -> i32 {
        match self {
            StackId::StackMap(id)
            | StackId::SwitchIn(id)
            | StackId::Unwound(id)
            | StackId::Seeded(id)
            | StackId::Snapshot(id) => id,
            StackId::None => NO_STACK,
            StackId::BeforeStart => STACK_BEFORE_START,
            StackId::NotTaken => STACK_NOT_TAKEN,
            StackId::NotSampled => KERNEL_STACK_NOT_SAMPLED,
            StackId::AtSwitchIn => KERNEL_STACK_AT_SWITCH_IN,
            StackId::Unreadable => KERNEL_STACK_UNREADABLE,
            StackId::Missed => KERNEL_STACK_MISSED,
            StackId::Lost(errno) => -errno,
        }
    }

    /// Whether the id names stored frames (as opposed to saying why there are none).
    pub const fn has_frames(self) -> bool {
        matches!(
            self,
            StackId::StackMap(_)
                | StackId::SwitchIn(_)
                | StackId::Unwound(_)
                | StackId::Seeded(_)
                | StackId::Snapshot(_)
        )
    }

    /// Whether a stack should be there and is not: the kernel failed to record it, or
    /// its moment passed unseen. The other sentinels are expected absences.
    pub const fn is_lost(self) -> bool {
        matches!(
            self,
            StackId::Lost(_) | StackId::Unreadable | StackId::Missed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_range_and_sentinel_reads_back() {
        let raws = [
            0,
            FIRST_SWITCH_IN_STACK_ID - 1,
            FIRST_SWITCH_IN_STACK_ID,
            FIRST_UNWOUND_ID - 1,
            FIRST_UNWOUND_ID,
            FIRST_SEEDED_ID - 1,
            FIRST_SEEDED_ID,
            FIRST_SNAPSHOT_ID - 1,
            FIRST_SNAPSHOT_ID,
            i32::MAX,
            NO_STACK,
            -17,
            -1,
            STACK_BEFORE_START,
            STACK_NOT_TAKEN,
            KERNEL_STACK_NOT_SAMPLED,
            KERNEL_STACK_AT_SWITCH_IN,
            KERNEL_STACK_UNREADABLE,
            KERNEL_STACK_MISSED,
        ];
        for raw in raws {
            assert_eq!(StackId::decode(raw).raw(), raw, "{raw}");
        }
    }

    #[test]
    fn ranges_meet_without_overlap() {
        assert_eq!(STACK_MAP_IDS.end, FIRST_SWITCH_IN_STACK_ID);
        assert_eq!(
            StackId::decode(FIRST_UNWOUND_ID - 1),
            StackId::SwitchIn(FIRST_UNWOUND_ID - 1)
        );
        assert_eq!(UNWOUND_IDS.end, SEEDED_IDS.start);
        assert_eq!(SEEDED_IDS.end, FIRST_SNAPSHOT_ID);
        assert_eq!(StackId::decode(-17), StackId::Lost(17));
        assert!(StackId::decode(KERNEL_STACK_MISSED).is_lost());
        assert!(!StackId::decode(NO_STACK).is_lost());
        assert!(!StackId::decode(KERNEL_STACK_NOT_SAMPLED).has_frames());
    }
}
