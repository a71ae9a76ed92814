//! "Now" on the scheduler's clock of a CPU, to tell how long ago a thread last ran. Our own
//! thread is moved to that CPU to read it.

use std::collections::HashMap;
use std::fs;

use super::parse::parse_sched_exec_start;

/// "Now" on the scheduler's clock of each CPU, read once per CPU.
#[derive(Default)]
pub(super) struct SchedClock {
    now: HashMap<Option<u32>, Option<u64>>,
}

impl SchedClock {
    /// The clock of `cpu` (of the CPU we run on if `None` or if we may not run there).
    pub(super) fn now_on(&mut self, cpu: Option<u32>) -> Option<u64> {
        *self.now.entry(cpu).or_insert_with(|| sched_now(cpu))
    }
}

/// `se.exec_start` of this thread on `cpu`, brought up to date: reading our own CPU time
/// makes the kernel account our run up to now, which sets it to the CPU's clock now.
fn sched_now(cpu: Option<u32>) -> Option<u64> {
    let restore = cpu.and_then(pin_to_cpu);
    let mut cpu_time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut cpu_time) };
    let now = fs::read_to_string("/proc/thread-self/sched")
        .ok()
        .and_then(|text| parse_sched_exec_start(&text));
    if let Some(mask) = restore {
        // SAFETY: `mask` is the affinity mask read from this very thread.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const mask) };
    }
    now
}

/// Moves this thread to `cpu`; returns its previous affinity mask, or `None` (staying
/// where it is) if it may not run there.
fn pin_to_cpu(cpu: u32) -> Option<libc::cpu_set_t> {
    let cpu = usize::try_from(cpu).ok()?;
    if cpu >= libc::CPU_SETSIZE as usize {
        return None;
    }
    // SAFETY: cpu_set_t is plain data, all zeroes is the empty set; the calls get its
    // size and valid pointers; `cpu` is below CPU_SETSIZE.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut old) != 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        (libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const one) == 0)
            .then_some(old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheduler_clock_of_this_cpu_moves_with_time() {
        // Both readings on CPU 0: each CPU has a clock of its own, and the thread may
        // wake up on the other one.
        let Some(first) = sched_now(Some(0)) else {
            eprintln!("skipped: no /proc/thread-self/sched (CONFIG_SCHED_DEBUG)");
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let second = sched_now(Some(0)).unwrap();
        let elapsed = second.wrapping_sub(first);
        // The run queue's clock is only brought up to date when the CPU schedules, so
        // either reading may be a few ms behind (43 ms seen for the 50 ms, in CI).
        assert!((25_000_000..1_000_000_000).contains(&elapsed), "{elapsed}");
    }
}
