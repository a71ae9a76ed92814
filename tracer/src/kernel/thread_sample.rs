//! One sample of a running thread's user registers and stack, for `tracer stacks`: a
//! thread on a CPU has no saved registers to read from /proc. A CPU_CLOCK perf event on
//! that thread alone takes its first sample after a fraction of a millisecond of its CPU
//! time, with the user registers and the top of the user stack; the event is closed at
//! once. The thread is neither stopped nor ptraced.

use std::{
    io,
    os::fd::{AsRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use aya_obj::generated::{
    perf_event_attr, perf_event_mmap_page, perf_event_sample_format, perf_sw_ids, perf_type_id,
};

use super::sys;

/// The registers asked for, in the kernel's order of `perf_event_x86_regs`: bp, sp, ip.
const REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8);
/// `PERF_RECORD_SAMPLE`.
const RECORD_SAMPLE: u32 = 9;
/// CPU time of the thread between samples (ns).
const PERIOD_NS: u64 = 100_000;

/// A running thread's user registers and stack bytes from `sp` up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunningSample {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: Vec<u8>,
}

/// Samples thread `tid` once, waiting up to `timeout` for it to run; `None` when it did
/// not run meanwhile (or the sample had no user registers: a kernel thread).
pub(crate) fn sample_running_thread(
    tid: u32,
    stack_bytes: u32,
    timeout: Duration,
) -> io::Result<Option<RunningSample>> {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = perf_type_id::PERF_TYPE_SOFTWARE as u32;
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.config = perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK as u64;
    attr.__bindgen_anon_1.sample_period = PERIOD_NS;
    attr.sample_type = perf_event_sample_format::PERF_SAMPLE_REGS_USER as u64
        | perf_event_sample_format::PERF_SAMPLE_STACK_USER as u64;
    attr.sample_regs_user = REGS_MASK;
    attr.sample_stack_user = stack_bytes;
    attr.__bindgen_anon_2.wakeup_events = 1;
    attr.set_exclude_hv(1);
    let event = sys::open_thread_event(&attr, tid)?;
    // The data area holds a whole sample: the stack bytes, registers and headers.
    let page = 4096usize;
    let data_pages = (stack_bytes as usize + page)
        .div_ceil(page)
        .next_power_of_two();
    let ring = Ring::map(&event, page, data_pages)?;
    let started = Instant::now();
    loop {
        if let Some(record) = ring.first_record() {
            return Ok(parse_sample(&record));
        }
        if started.elapsed() >= timeout {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The event's ring buffer, unmapped when dropped.
struct Ring {
    base: *mut u8,
    len: usize,
    page: usize,
}

impl Ring {
    fn map(event: &OwnedFd, page: usize, data_pages: usize) -> io::Result<Self> {
        let len = page * (1 + data_pages);
        // Writable: the kernel then never overwrites what was not read (a read-only ring
        // is overwritten in a loop), so the first sample stays whole at its start.
        // SAFETY: a fresh shared mapping of the event's ring; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                event.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: base.cast(),
            len,
            page,
        })
    }

    /// The first record written, once it is whole.
    fn first_record(&self) -> Option<Vec<u8>> {
        // The mapping starts at a page boundary, so the header is aligned.
        #[allow(clippy::cast_ptr_alignment)]
        let meta = self.base as *const perf_event_mmap_page;
        // SAFETY: the first page is the kernel's `perf_event_mmap_page`, mapped for as
        // long as `self`; `data_head` is read volatile as the kernel moves it.
        let head = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*meta).data_head)) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        if head < 8 {
            return None;
        }
        let data_len = self.len - self.page;
        // SAFETY: the data area follows the first page, `data_len` bytes, mapped.
        let data = unsafe { std::slice::from_raw_parts(self.base.add(self.page), data_len) };
        let size = u16::from_ne_bytes([data[6], data[7]]) as usize;
        let kind = u32::from_ne_bytes(data[..4].try_into().ok()?);
        (size <= head as usize && size <= data_len && kind == RECORD_SAMPLE)
            .then(|| data[..size].to_vec())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping made in `map`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A `PERF_RECORD_SAMPLE` of `PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER`: the
/// header, the registers' ABI and values (bp, sp, ip), the stack's size, its bytes and
/// how many of them are valid.
fn parse_sample(record: &[u8]) -> Option<RunningSample> {
    let u64_at = |at: usize| Some(u64::from_ne_bytes(record.get(at..at + 8)?.try_into().ok()?));
    let abi = u64_at(8)?;
    if abi == 0 {
        return None;
    }
    let (bp, sp, ip) = (u64_at(16)?, u64_at(24)?, u64_at(32)?);
    let size = u64_at(40)? as usize;
    let bytes = record.get(48..48 + size)?;
    let valid = match size {
        0 => 0,
        _ => (u64_at(48 + size)? as usize).min(size),
    };
    Some(RunningSample {
        ip,
        sp,
        bp,
        stack: bytes[..valid].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sample_record() {
        let mut record = Vec::new();
        record.extend_from_slice(&RECORD_SAMPLE.to_ne_bytes());
        record.extend_from_slice(&0u16.to_ne_bytes());
        record.extend_from_slice(&0u16.to_ne_bytes());
        for word in [2u64, 0x7ff0, 0x7fe0, 0x401000, 16] {
            record.extend_from_slice(&word.to_ne_bytes());
        }
        record.extend_from_slice(&[7u8; 16]);
        record.extend_from_slice(&12u64.to_ne_bytes());
        let sample = parse_sample(&record).unwrap();
        assert_eq!(
            (sample.ip, sample.sp, sample.bp),
            (0x401000, 0x7fe0, 0x7ff0)
        );
        assert_eq!(sample.stack, [7u8; 12]);
        // No user registers: a kernel thread.
        record[8..16].copy_from_slice(&0u64.to_ne_bytes());
        assert_eq!(parse_sample(&record), None);
    }

    #[test]
    #[ignore = "needs root for perf events: run as root with --include-ignored (cargo xtask test does)"]
    fn samples_a_spinning_thread_of_our_own() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let spinner = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            while !spin.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let tid = rx.recv().unwrap();
        let sample = sample_running_thread(tid, 4096, Duration::from_secs(2))
            .unwrap()
            .expect("a spinning thread runs");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(sample.ip != 0 && sample.sp != 0 && !sample.stack.is_empty());
    }
}
