//! `--unwind dwarf`: the stack-copy ring that brings stack snapshots from the kernel,
//! draining and unwinding them while the targets run, its size, and the report's line on
//! how the stacks were unwound.

use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use tracer_common::{UNWIND_STACK_BYTES, counter};

use crate::{
    kernel::{RecordRing, SnapshotChecks},
    stack::naming::FRAME_POINTER_SUFFIX,
    stack::processes::Processes,
    stack::python::Interpreters,
    stack::unwind::{DwarfUnwinder, Snapshot, StackMerger, UnwindStats},
};

/// How often the stack-copy ring is drained: the longest period that the last drain's
/// rate would fill no more than a quarter of the ring in. Fewer, larger drains unwind
/// with the unwind rules and tables still in the CPU's caches.
pub(crate) const DRAIN_PERIODS: RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_millis(100);

/// `--unwind dwarf`: the snapshots from the kernel, and what user space tells it back.
pub(super) struct Unwinding {
    pub(super) ring: RecordRing,
    pub(super) checks: SnapshotChecks,
    pub(super) unwinder: DwarfUnwinder,
    /// The ring's size.
    pub(super) ring_bytes: u64,
    /// When it was last drained, and the period that drain set (see [`DRAIN_PERIODS`]).
    pub(super) drained_at: Option<Instant>,
    pub(super) period: Duration,
}

impl Unwinding {
    /// Unwinds every stack snapshot waiting in the ring buffer, capturing the mappings
    /// of processes seen for the first time, and lets the kernel reuse the off-CPU ones.
    /// A process that joined the `targets` by forking is named from its parent's
    /// mappings when it is gone before its first snapshot is read.
    pub(super) fn drain(
        &mut self,
        processes: &mut Processes,
        interpreters: &mut Interpreters,
        targets: Option<&crate::kernel::TargetsMap>,
    ) {
        let Self {
            ring,
            checks,
            unwinder,
            ..
        } = self;
        // The checks of the off-CPU snapshots unwound, published at once after.
        let mut unwound = Vec::new();
        let mut bytes = 0;
        ring.drain(|record| {
            bytes += record.len() as u64;
            let Some(snapshot) = Snapshot::parse(record) else {
                return;
            };
            if processes.lacks_maps(snapshot.tgid)
                && let Some(parent) = targets.and_then(|t| t.forked_from(snapshot.tgid))
            {
                processes.observe_fork(snapshot.tgid, parent);
                interpreters.note_fork(snapshot.tgid, parent);
            }
            processes.observe(snapshot.tgid);
            let maps = processes
                .get(snapshot.tgid)
                .and_then(|info| info.maps.as_ref());
            let merger = match &snapshot.python {
                Some(_) => interpreters
                    .find(snapshot.tgid, maps)
                    .map(|p| p as &mut dyn StackMerger),
                None => None,
            };
            let check = unwinder.add(&snapshot, maps, merger);
            if let (Some(id), Some(check)) = (snapshot.snapshot, check) {
                unwound.push((id, check));
            }
        });
        let now = Instant::now();
        if let Some(at) = self.drained_at {
            self.period = drain_period(bytes, now - at, self.ring_bytes);
        }
        self.drained_at = Some(now);
        if let Err(e) = checks.publish(&unwound) {
            // The kernel then sends new snapshots each time: slower, not wrong.
            log::debug!(
                "cannot publish the checks of {} snapshots: {e}",
                unwound.len()
            );
        }
    }
}

/// The period after a drain of `bytes` that came in over `elapsed`, for a ring of
/// `ring_bytes` (see [`DRAIN_PERIODS`]).
fn drain_period(bytes: u64, elapsed: Duration, ring_bytes: u64) -> Duration {
    let quarter = ring_bytes / 4;
    let period = match bytes {
        0 => *DRAIN_PERIODS.end(),
        _ => elapsed.mul_f64(quarter as f64 / bytes as f64),
    };
    period.clamp(*DRAIN_PERIODS.start(), *DRAIN_PERIODS.end())
}

/// The stack-copy ring's bytes per CPU sampled: a set of targets, every process.
const UNWIND_RING_PER_CPU: [u32; 2] = [4 << 20, 16 << 20];
/// The bounds of a stack-copy ring sized from the CPUs.
const UNWIND_RING_AUTO: std::ops::RangeInclusive<u32> = (8 << 20)..=(128 << 20);

/// `--unwind-buffer auto`: so much per CPU, within [`UNWIND_RING_AUTO`], a power of two.
pub(super) fn auto_unwind_ring_bytes(cpus: usize, system_wide: bool) -> u32 {
    let per_cpu = u64::from(UNWIND_RING_PER_CPU[usize::from(system_wide)]);
    let bytes = (per_cpu * cpus as u64).clamp(
        u64::from(*UNWIND_RING_AUTO.start()),
        u64::from(*UNWIND_RING_AUTO.end()),
    );
    bytes.next_power_of_two() as u32
}

/// The line on the off-CPU stacks that reused a snapshot not yet unwound (see
/// [`counter::SNAPSHOTS_REUSED_UNCHECKED`]), with a ring of `ring_bytes`.
pub(crate) fn reused_unchecked_line(reused: u64, ring_bytes: u32) -> String {
    format!(
        "Reused unchecked: {reused} off-CPU stacks took the snapshot their thread had just \
         sent from the same place, not yet unwound, as the stack-copy buffer was half full \
         (--unwind-buffer above its {} sends them all).",
        crate::system::text::binary_size(ring_bytes.into())
    )
}

/// The `--unwind dwarf` line: how many stacks were unwound, how deep, with which method,
/// and how many were walked with frame pointers instead (with a ring of `ring_bytes`).
pub(crate) fn unwind_summary(stats: &UnwindStats, counters: &[u64], ring_bytes: u32) -> String {
    let no_regs = counters[counter::UNWIND_NO_USER_REGS as usize];
    let ring_full = counters[counter::UNWIND_RING_FULL as usize];
    let unreadable = counters[counter::UNWIND_STACK_UNREADABLE as usize];
    let stacks = stats.samples + stats.offcpu_snapshots;
    let mean = stats.frames as f64 / stacks.max(1) as f64;
    format!(
        "Unwinding: {} on-CPU samples ({} of them in kernel mode) and {} off-CPU snapshots \
         unwound with DWARF: {} user frames, {mean:.1} per stack, deepest {}; {} frames \
         found by frame pointers where no call frame information covered the callee \
         (marked{FRAME_POINTER_SUFFIX}); {} stacks deeper than the {} KiB copied, {} \
         stopped early where unwind information ended, {} without mappings, \
         {unreadable} with an unreadable stack. {} stacks walked with frame pointers in \
         the kernel instead (marked{FRAME_POINTER_SUFFIX}; {no_regs} without user \
         registers, {ring_full} with the snapshot ring buffer full){}.\n",
        stats.samples,
        stats.in_kernel,
        stats.offcpu_snapshots,
        stats.frames,
        stats.max_depth,
        stats.frame_pointer_frames,
        stats.out_of_stack,
        UNWIND_STACK_BYTES / 1024,
        stats.truncated,
        stats.no_maps,
        no_regs + ring_full,
        match ring_full {
            0 => String::new(),
            _ => format!(
                ": --unwind-buffer above its {} keeps them",
                crate::system::text::binary_size(ring_bytes.into())
            ),
        },
    ) + &match counters[counter::SNAPSHOTS_REUSED_UNCHECKED as usize] {
        0 => String::new(),
        reused => reused_unchecked_line(reused, ring_bytes) + "\n",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_filling_slowly_is_drained_seldom_and_a_busy_one_often() {
        let ms = Duration::from_millis;
        // 2 MiB in 100 ms fills a quarter of an 8 MiB ring in 100 ms.
        assert_eq!(drain_period(2 << 20, ms(100), 8 << 20), ms(100));
        assert_eq!(drain_period(4 << 20, ms(100), 8 << 20), ms(50));
        assert_eq!(drain_period(0, ms(100), 8 << 20), ms(100));
        assert_eq!(drain_period(1 << 20, ms(100), 8 << 20), ms(100));
        assert_eq!(drain_period(64 << 20, ms(100), 8 << 20), ms(10));
    }

    #[test]
    fn the_stack_copy_ring_grows_with_the_cpus_within_bounds() {
        assert_eq!(auto_unwind_ring_bytes(1, false), 8 << 20);
        assert_eq!(auto_unwind_ring_bytes(2, false), 8 << 20);
        assert_eq!(auto_unwind_ring_bytes(6, false), 32 << 20);
        assert_eq!(auto_unwind_ring_bytes(2, true), 32 << 20);
        assert_eq!(auto_unwind_ring_bytes(64, true), 128 << 20);
    }
}
