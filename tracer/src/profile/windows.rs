//! Rolling windows (`--profile-every`): the wall-clock profile of each window, from the
//! kernel's totals since the start minus those read at the window's start. An interval
//! still open at a window's end counts in that window up to its end; when it ends, the
//! time the earlier windows took is left out of the window it ends in. The kernel's maps
//! are never reset: the metrics read the same totals.

use std::collections::{HashMap, HashSet};

use tracer_common::{
    KERNEL_STACK_AT_SWITCH_IN, NO_STACK, OffCpuStart, OffCpuTotal, StackId, StackKey,
};

/// A window's off-CPU intervals: the totals of those that ended in it, and the starts of
/// those open at its end (from the window's start at the earliest).
pub(crate) type OffCpuWindow = (Vec<(StackKey, OffCpuTotal)>, Vec<(u32, OffCpuStart)>);

/// What the next window subtracts: the totals read at its start.
#[derive(Debug, Default)]
pub(crate) struct WindowBase {
    offcpu: HashMap<StackKey, OffCpuTotal>,
    oncpu: HashMap<StackKey, u64>,
    /// The intervals open at the last window's end, by thread: each one's start, its user
    /// stack, and the time the windows gave it so far.
    open: HashMap<u32, OpenInterval>,
    /// The last window's end (CLOCK_MONOTONIC ns).
    pub end_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenInterval {
    start_ns: u64,
    user: StackId,
    given_ns: u64,
}

impl WindowBase {
    /// Drops what the windows gave the processes `tgids`: let go (see
    /// [`crate::profile::retire`]), they have no more time to give.
    pub(crate) fn forget(&mut self, tgids: &HashSet<u32>) {
        self.offcpu.retain(|key, _| !tgids.contains(&key.tgid));
        self.oncpu.retain(|key, _| !tgids.contains(&key.tgid));
    }

    /// A base for windows from `start_ns` on.
    pub(crate) fn starting_at(start_ns: u64) -> Self {
        Self {
            end_ns: start_ns,
            ..Self::default()
        }
    }

    /// The off-CPU totals of the window that ends at `now_ns`, from the kernel's totals
    /// `totals` and the intervals open now (`open`): what ended in it (less what earlier
    /// windows took of it), and the open intervals' time in it, as starts from the later
    /// of their start and the window's.
    pub(crate) fn offcpu_window(
        &mut self,
        totals: Vec<(StackKey, OffCpuTotal)>,
        open: Vec<(u32, OffCpuStart)>,
        now_ns: u64,
    ) -> OffCpuWindow {
        let mut ended: Vec<(StackKey, OffCpuTotal)> = Vec::new();
        for (key, total) in totals {
            let before = self.offcpu.insert(key, total).unwrap_or_default();
            let count = total.count.saturating_sub(before.count);
            if count > 0 {
                let total_ns = total.total_ns.saturating_sub(before.total_ns);
                ended.push((key, OffCpuTotal { total_ns, count }));
            }
        }
        let open_now: HashMap<u32, OffCpuStart> = open.into_iter().collect();
        // Those open at the last end and ended since: earlier windows had their time up
        // to then.
        self.open.retain(|tid, interval| {
            if open_now
                .get(tid)
                .is_some_and(|s| s.ts_ns == interval.start_ns)
            {
                return true;
            }
            let of_thread = ended.iter_mut().filter(|(key, _)| key.tid == *tid);
            let entry =
                of_thread.max_by_key(|(key, total)| (key.user == interval.user, total.total_ns));
            if let Some((_, total)) = entry {
                total.total_ns = total.total_ns.saturating_sub(interval.given_ns);
            }
            false
        });
        let mut pending = Vec::with_capacity(open_now.len());
        for (tid, start) in open_now {
            let from = start.ts_ns.max(self.end_ns);
            if from >= now_ns {
                continue;
            }
            let interval = self.open.entry(tid).or_insert(OpenInterval {
                start_ns: start.ts_ns,
                user: StackId::decode(start.user_stack_id),
                given_ns: 0,
            });
            interval.given_ns += now_ns - from;
            // Where it blocked in the kernel is known once it ends; until then, its user
            // stack alone.
            let kernel_stack_id = match start.kernel_stack_id {
                KERNEL_STACK_AT_SWITCH_IN => NO_STACK,
                id => id,
            };
            pending.push((
                tid,
                OffCpuStart {
                    ts_ns: from,
                    kernel_stack_id,
                    ..start
                },
            ));
        }
        (ended, pending)
    }

    /// The on-CPU samples of the window, from the kernel's counts since the start.
    pub(crate) fn oncpu_window(&mut self, counts: Vec<(StackKey, u64)>) -> Vec<(StackKey, u64)> {
        counts
            .into_iter()
            .filter_map(|(key, count)| {
                let before = self.oncpu.insert(key, count).unwrap_or(0);
                (count > before).then_some((key, count - before))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{EXEC_NS_UNKNOWN, OffCpuKey, offcpu_state};

    fn key(tid: u32, user_stack_id: i32) -> StackKey {
        StackKey::from(OffCpuKey {
            tgid: 1,
            tid,
            user_stack_id,
            kernel_stack_id: 7,
            state: offcpu_state::BLOCKED,
        })
    }

    fn start(ts_ns: u64, user_stack_id: i32) -> OffCpuStart {
        OffCpuStart {
            ts_ns,
            exec_ns: EXEC_NS_UNKNOWN,
            tgid: 1,
            user_stack_id,
            kernel_stack_id: KERNEL_STACK_AT_SWITCH_IN,
            state: offcpu_state::BLOCKED,
            task: 0,
        }
    }

    fn total(total_ns: u64, count: u64) -> OffCpuTotal {
        OffCpuTotal { total_ns, count }
    }

    #[test]
    fn each_window_has_what_ended_in_it_and_its_part_of_what_is_open() {
        let mut base = WindowBase::starting_at(1000);
        // Window 1 (1000..2000): thread 5 blocked 300 ns twice; thread 6 blocked since 1200.
        let (ended, open) = base.offcpu_window(
            vec![(key(5, 1), total(600, 2))],
            vec![(6, start(1200, 2))],
            2000,
        );
        assert_eq!(ended, vec![(key(5, 1), total(600, 2))]);
        assert_eq!(open.len(), 1);
        assert_eq!((open[0].0, open[0].1.ts_ns), (6, 1200));
        assert_eq!(open[0].1.kernel_stack_id, NO_STACK);
        base.end_ns = 2000;

        // Window 2 (2000..3000): thread 5 nothing new; thread 6 still blocked.
        let (ended, open) = base.offcpu_window(
            vec![(key(5, 1), total(600, 2))],
            vec![(6, start(1200, 2))],
            3000,
        );
        assert!(ended.is_empty());
        assert_eq!((open[0].0, open[0].1.ts_ns), (6, 2000));
        base.end_ns = 3000;

        // Window 3 (3000..4000): thread 6 woke at 3500 (2300 ns in all, 1800 given).
        let (ended, open) = base.offcpu_window(
            vec![(key(5, 1), total(600, 2)), (key(6, 2), total(2300, 1))],
            Vec::new(),
            4000,
        );
        assert_eq!(ended, vec![(key(6, 2), total(500, 1))]);
        assert!(open.is_empty());
    }

    #[test]
    fn a_thread_that_blocks_again_is_a_new_interval() {
        let mut base = WindowBase::starting_at(0);
        let (_, open) = base.offcpu_window(Vec::new(), vec![(3, start(100, 4))], 1000);
        assert_eq!(open.len(), 1);
        base.end_ns = 1000;
        // It woke at 1100 (1000 ns, 900 given) and blocks again since 1500.
        let (ended, open) = base.offcpu_window(
            vec![(key(3, 4), total(1000, 1))],
            vec![(3, start(1500, 4))],
            2000,
        );
        assert_eq!(ended, vec![(key(3, 4), total(100, 1))]);
        assert_eq!((open[0].1.ts_ns, 2000 - open[0].1.ts_ns), (1500, 500));
    }

    #[test]
    fn on_cpu_samples_are_counted_once() {
        let mut base = WindowBase::default();
        assert_eq!(
            base.oncpu_window(vec![(key(1, 1), 3)]),
            vec![(key(1, 1), 3)]
        );
        assert_eq!(
            base.oncpu_window(vec![(key(1, 1), 5), (key(2, 1), 1)]),
            vec![(key(1, 1), 2), (key(2, 1), 1)]
        );
        assert!(base.oncpu_window(vec![(key(1, 1), 5)]).is_empty());
    }
}
