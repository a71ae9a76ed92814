//! Off-CPU and on-CPU accounting: where a thread left the CPU, and the time and samples
//! under each pair of stacks.

use crate::StackId;

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
    /// Why the thread left the CPU: an [`offcpu_state`](crate::offcpu_state).
    pub state: u32,
    /// The runtime task it was running when it left (its `THREAD_TASKS` entry, with task
    /// probes attached); 0 for none.
    pub task: u64,
}

impl OffCpuStart {
    /// The key under which thread `tid`'s interval from this start is counted.
    pub fn stack_key(&self, tid: u32) -> StackKey {
        StackKey {
            tgid: self.tgid,
            tid,
            user: StackId::decode(self.user_stack_id),
            kernel: StackId::decode(self.kernel_stack_id),
            state: self.state,
        }
    }
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
    /// Off CPU: why the thread left it, an [`offcpu_state`](crate::offcpu_state); 0 for
    /// on-CPU samples.
    pub state: u32,
}

/// An [`OffCpuKey`] (or [`OnCpuKey`]) as user space holds it: its stack ids decoded once,
/// where the kernel's maps are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    pub tid: u32,
    pub user: StackId,
    pub kernel: StackId,
    /// As [`OffCpuKey::state`].
    pub state: u32,
}

impl From<OffCpuKey> for StackKey {
    fn from(key: OffCpuKey) -> Self {
        StackKey {
            tgid: key.tgid,
            tid: key.tid,
            user: StackId::decode(key.user_stack_id),
            kernel: StackId::decode(key.kernel_stack_id),
            state: key.state,
        }
    }
}

impl From<StackKey> for OffCpuKey {
    fn from(key: StackKey) -> Self {
        OffCpuKey {
            tgid: key.tgid,
            tid: key.tid,
            user_stack_id: key.user.raw(),
            kernel_stack_id: key.kernel.raw(),
            state: key.state,
        }
    }
}

/// Why a thread was off CPU.
pub mod offcpu_state {
    /// It waited for something (a lock, IO, a timer): `prev_state` was not running.
    pub const BLOCKED: u32 = 0;
    /// It could have run but was preempted (or yielded): runnable, waiting for a CPU.
    pub const RUNNABLE: u32 = 1;
    /// Flag: not time but one sample of [`crate::KERNEL_STACK_ALWAYS_NS`] under the
    /// kernel stack of a short interval (see there).
    pub const SAMPLED: u32 = 0x100;
}

/// Key of `ONCPU_SAMPLES` (whose value is a sample count): a thread and the stacks it was
/// running when sampled. The kernel stack id is [`NO_STACK`](crate::NO_STACK) for samples
/// taken in user
/// mode, the user stack id is [`NO_STACK`](crate::NO_STACK) for kernel threads.
pub type OnCpuKey = OffCpuKey;

/// Value of `OFFCPU_TIME`: total blocked time and how many intervals made it up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuTotal {
    pub total_ns: u64,
    pub count: u64,
}

/// Off-CPU kernel stacks are taken when the thread comes back, when its interval is
/// known: always for an interval of at least this long (ns); a shorter one of `d` ns
/// with probability `d / KERNEL_STACK_ALWAYS_NS`, and then counted twice: its own time
/// under [`KERNEL_STACK_NOT_SAMPLED`](crate::KERNEL_STACK_NOT_SAMPLED), and one sample of
/// this weight under the stack
/// (with [`offcpu_state::SAMPLED`]). User space spreads each thread's unsampled time at
/// a user stack over the kernel stacks sampled there, in proportion.
pub const KERNEL_STACK_ALWAYS_NS: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KERNEL_STACK_MISSED, NO_STACK, STACK_BEFORE_START};

    #[test]
    fn a_key_decoded_and_encoded_again_is_the_same_key() {
        for (user, kernel) in [
            (1, 2),
            (STACK_BEFORE_START, STACK_BEFORE_START),
            (NO_STACK, KERNEL_STACK_MISSED),
            (-17, crate::FIRST_SNAPSHOT_ID),
        ] {
            let key = OffCpuKey {
                tgid: 7,
                tid: 8,
                user_stack_id: user,
                kernel_stack_id: kernel,
                state: offcpu_state::RUNNABLE,
            };
            let decoded = StackKey::from(key);
            assert_eq!(decoded.user, StackId::decode(user));
            assert_eq!(OffCpuKey::from(decoded), key);
        }
    }
}
