//! The eBPF programs' own diagnostics (aya-log): each failed argument read, stack capture
//! error and full map, with the probe, site and error, shown on standard error with
//! `--bpf-debug`. Off, the programs' log level is 0 in their frozen read-only data, so the
//! verifier drops every logging branch: they cost nothing.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya_log::EbpfLogger;

/// Set once, from the command line, before anything is loaded.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The global aya-log-ebpf reads its level from.
pub(super) const LEVEL_GLOBAL: &str = aya_log::LEVEL;

/// Shows the programs' diagnostics from now on (`--bpf-debug`).
pub(crate) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The level the programs log at: debug when enabled, else none.
pub(super) fn level() -> u8 {
    if ENABLED.load(Ordering::Relaxed) {
        aya_log::Level::Debug as u8
    } else {
        0
    }
}

/// Writes the programs' records to standard error, whatever `RUST_LOG` filters, with the
/// probe a record starts with (`probe N`, its id) named.
struct StderrLog {
    probe_names: Vec<String>,
}

impl StderrLog {
    fn named(&self, message: String) -> String {
        let Some(rest) = message.strip_prefix("probe ") else {
            return message;
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|id| self.probe_names.get(id))
        {
            Some(name) => format!(
                "{}{}",
                crate::system::text::escape_text(name),
                &rest[digits..]
            ),
            None => message,
        }
    }
}

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        crate::status!("tracer: bpf: {}", self.named(record.args().to_string()));
    }

    fn flush(&self) {}
}

/// Reads the programs' log records on a thread of its own until dropped; the records
/// still waiting then are written before it returns.
pub(crate) struct DiagnosticsReader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DiagnosticsReader {
    /// Starts reading the records of the program with kernel id `program_id` (any program
    /// that logs shares the one ring buffer), or `None` when it logs nothing. Records of
    /// probe N name it `probe_names[N]`.
    pub(super) fn start(program_id: u32, probe_names: &[String]) -> Option<Self> {
        let log = StderrLog {
            probe_names: probe_names.to_vec(),
        };
        let mut logger = EbpfLogger::init_from_id_with_logger(program_id, log).ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            loop {
                let done = stopping.load(Ordering::Acquire);
                let mut poll = libc::pollfd {
                    fd: logger.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the call; a failure only means flush now.
                unsafe { libc::poll(&raw mut poll, 1, POLL_PERIOD.as_millis() as i32) };
                logger.flush();
                if done {
                    break;
                }
            }
        });
        Some(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// How long the reader sleeps between looks when nothing arrives (and so how long a stop
/// may wait for it).
const POLL_PERIOD: Duration = Duration::from_millis(100);

impl Drop for DiagnosticsReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_their_probe() {
        let log = StderrLog {
            probe_names: vec!["usdt:/bin/a:p:one".into(), "usdt:/bin/a:p:two".into()],
        };
        assert_eq!(
            log.named("probe 1 (site 7): reading an argument failed: error -14".into()),
            "usdt:/bin/a:p:two (site 7): reading an argument failed: error -14"
        );
        // No such probe, or a record about no probe: as it came.
        assert_eq!(log.named("probe 9: x".into()), "probe 9: x");
        assert_eq!(
            log.named("user stack capture failed: error -14".into()),
            "user stack capture failed: error -14"
        );
    }
}
