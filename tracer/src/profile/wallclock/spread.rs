//! Off-CPU totals with the time of short intervals whose kernel stack was not sampled
//! spread over the kernel stacks sampled at the same user stack and state. The shares are
//! in proportion to the samples. They add up exactly to the kernel's totals. Samples
//! themselves are not time and are dropped.

use std::collections::{BTreeMap, HashMap};

use tracer_common::{OffCpuTotal, StackId, StackKey, offcpu_state};

use crate::stack::naming::Weight;

/// The off-CPU totals by key, with the time of short intervals whose kernel stack was not
/// sampled ([`StackId::NotSampled`]) spread over the kernel stacks sampled at the
/// same user stack and state, in proportion to their samples: those of the same thread,
/// else (none there) those of the process's other threads. Samples themselves
/// ([`offcpu_state::SAMPLED`]) are not time and are not kept. Time with no sample to go
/// by stays under [`StackId::NotSampled`]. Per thread, user stack and state the
/// time and the intervals are exactly the kernel's.
pub(super) fn spread_unsampled(
    totals: &[(StackKey, OffCpuTotal)],
) -> foldhash::HashMap<StackKey, Weight> {
    type Place = (u32, StackId, u32);
    let mut by_thread: HashMap<(u32, Place), BTreeMap<i32, u64>> = HashMap::new();
    let mut by_process: HashMap<Place, BTreeMap<i32, u64>> = HashMap::new();
    // A profile has up to millions of keys: a fast hash, sized once.
    let mut spread = foldhash::HashMap::with_capacity_and_hasher(totals.len(), Default::default());
    let mut unsampled = Vec::new();
    for (key, total) in totals {
        let weight = Weight {
            events: total.count,
            ns: total.total_ns,
        };
        if key.state & offcpu_state::SAMPLED != 0 {
            let state = key.state & !offcpu_state::SAMPLED;
            let place = (key.tgid, key.user, state);
            // By raw id: the order in which shares are given out.
            *by_thread
                .entry((key.tid, place))
                .or_default()
                .entry(key.kernel.raw())
                .or_default() += total.count;
            *by_process
                .entry(place)
                .or_default()
                .entry(key.kernel.raw())
                .or_default() += total.count;
        } else if key.kernel == StackId::NotSampled {
            unsampled.push((*key, weight));
        } else {
            spread
                .entry(*key)
                .or_insert_with(Weight::default)
                .add(weight);
        }
    }
    for (key, weight) in unsampled {
        let place = (key.tgid, key.user, key.state);
        let samples = by_thread
            .get(&(key.tid, place))
            .or_else(|| by_process.get(&place));
        let Some(samples) = samples else {
            spread
                .entry(key)
                .or_insert_with(Weight::default)
                .add(weight);
            continue;
        };
        for (kernel, share) in proportional_shares(weight, samples) {
            let key = StackKey {
                kernel: StackId::decode(kernel),
                ..key
            };
            spread.entry(key).or_insert_with(Weight::default).add(share);
        }
    }
    spread
}

/// [`spread_unsampled`] for each task's entries apart.
pub(super) fn spread_task_unsampled(
    entries: &[(u64, StackKey, OffCpuTotal)],
) -> foldhash::HashMap<(u64, StackKey), Weight> {
    let mut by_task: BTreeMap<u64, Vec<(StackKey, OffCpuTotal)>> = BTreeMap::new();
    for &(task, key, total) in entries {
        by_task.entry(task).or_default().push((key, total));
    }
    let mut spread = foldhash::HashMap::default();
    for (task, totals) in by_task {
        spread.extend(
            spread_unsampled(&totals)
                .into_iter()
                .map(|(key, weight)| ((task, key), weight)),
        );
    }
    spread
}

/// `weight` split in proportion to `samples` (by kernel stack id), exactly: what rounding
/// leaves over goes to the stack with the most samples.
fn proportional_shares(weight: Weight, samples: &BTreeMap<i32, u64>) -> Vec<(i32, Weight)> {
    let total: u64 = samples.values().sum();
    let part = |of: u64, n: u64| (u128::from(of) * u128::from(n) / u128::from(total)) as u64;
    let mut shares: Vec<(i32, Weight)> = samples
        .iter()
        .map(|(&id, &n)| {
            let share = Weight {
                events: part(weight.events, n),
                ns: part(weight.ns, n),
            };
            (id, share)
        })
        .collect();
    let given = shares.iter().fold(Weight::default(), |mut sum, (_, w)| {
        sum.add(*w);
        sum
    });
    let most = samples
        .iter()
        .max_by_key(|&(&id, &n)| (n, std::cmp::Reverse(id)))
        .map(|(&id, _)| id);
    if let Some((_, share)) = shares.iter_mut().find(|(id, _)| Some(*id) == most) {
        share.events += weight.events - given.events;
        share.ns += weight.ns - given.ns;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{KERNEL_STACK_NOT_SAMPLED, OffCpuKey};

    /// Short intervals' time, kept under "not sampled", goes to the kernel stacks sampled
    /// at the same user stack and state: the thread's own samples first, else its
    /// process's; exactly, per thread and user stack; samples are not time.
    #[test]
    fn unsampled_time_is_spread_over_the_kernel_stacks_sampled_there() {
        let entry = |tid, user, kernel, state, ns, count| {
            let key = StackKey::from(OffCpuKey {
                tgid: 7,
                tid,
                user_stack_id: user,
                kernel_stack_id: kernel,
                state,
            });
            (
                key,
                OffCpuTotal {
                    total_ns: ns,
                    count,
                },
            )
        };
        let sampled = offcpu_state::BLOCKED | offcpu_state::SAMPLED;
        let totals = [
            // Thread 8 at user stack 1: 1001 ns in 10 short intervals, sampled 3 times
            // at kernel stack 20 and once at 21, plus a long interval at 21.
            entry(
                8,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::BLOCKED,
                1001,
                10,
            ),
            entry(8, 1, 20, sampled, 3_000_000, 3),
            entry(8, 1, 21, sampled, 1_000_000, 1),
            entry(8, 1, 21, offcpu_state::BLOCKED, 5_000_000, 1),
            // Thread 9 at user stack 1, never sampled: its process's samples say where.
            entry(
                9,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::BLOCKED,
                400,
                4,
            ),
            // Runnable at user stack 1: no runnable sample anywhere, so it stays.
            entry(
                9,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::RUNNABLE,
                50,
                1,
            ),
        ];
        let spread = spread_unsampled(&totals);
        let get = |tid, kernel, state| {
            let key = StackKey::from(OffCpuKey {
                tgid: 7,
                tid,
                user_stack_id: 1,
                kernel_stack_id: kernel,
                state,
            });
            spread.get(&key).map(|w| (w.ns, w.events))
        };
        let blocked = offcpu_state::BLOCKED;
        // 3/4 of 1001 ns rounds down to 750; the rest goes to the most sampled stack.
        assert_eq!(get(8, 20, blocked), Some((751, 8)));
        assert_eq!(get(8, 21, blocked), Some((5_000_250, 3)));
        assert_eq!(get(9, 20, blocked), Some((300, 3)));
        assert_eq!(get(9, 21, blocked), Some((100, 1)));
        let runnable = offcpu_state::RUNNABLE;
        assert_eq!(get(9, KERNEL_STACK_NOT_SAMPLED, runnable), Some((50, 1)));
        assert_eq!(spread.len(), 5, "{spread:?}");
        let total: u64 = spread.values().map(|w| w.ns).sum();
        assert_eq!(total, 1001 + 5_000_000 + 400 + 50);
    }
}
