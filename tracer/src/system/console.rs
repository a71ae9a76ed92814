//! Standard output and standard error, written so that they never panic and never hold a
//! stop hostage.
//!
//! - Status lines go to standard error through [`crate::status!`], which ignores write errors: a
//!   closed or full standard error must not end a trace or hide its report elsewhere.
//! - Everything for standard output goes through an [`OutputStream`]: a thread of its own
//!   writes it, so a reader that stalls (a paused pager, a FIFO nobody reads) never stops
//!   the tracer from noticing Ctrl-C, detaching and reporting; a reader that goes away
//!   (`EPIPE`) or a full device (`ENOSPC`) is an [`OutputError`], never a panic.

use std::{
    fmt,
    fs::File,
    io::{self, Write as _},
    mem::ManuallyDrop,
    os::fd::FromRawFd as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

/// Writes one line to standard error, ignoring failure.
#[macro_export]
macro_rules! status {
    ($($arg:tt)*) => {
        $crate::system::console::status_line(format_args!($($arg)*))
    };
}

#[doc(hidden)]
pub(crate) fn status_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{args}");
}

/// Why standard output could not take what the tracer wrote.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputError {
    /// The reader went away (`EPIPE`): like `tracer list | head -1`.
    #[error("standard output was closed")]
    Closed,
    /// The reader stopped reading for longer than the tracer waits when it stops.
    #[error(
        "standard output is not being read (nothing written for {secs} s): {0} bytes not \
         written",
        secs = STALL_TIMEOUT.as_secs()
    )]
    Stalled(u64),
    #[error("cannot write to standard output: {0}")]
    Failed(io::Error),
}

impl From<io::Error> for OutputError {
    fn from(error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::BrokenPipe {
            OutputError::Closed
        } else {
            OutputError::Failed(error)
        }
    }
}

/// How long a stopping tracer waits for standard output to take anything more.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Buffers waiting for the writer thread; past that, senders wait (and `trace` stops
/// draining the kernel's ring buffer, whose overflow the kernel counts).
const QUEUED_BUFFERS: usize = 64;

/// Standard output, written by a thread of its own.
pub(crate) struct OutputStream {
    sender: Option<mpsc::Sender<Chunk>>,
    failed: watch::Receiver<bool>,
    progress: Arc<Progress>,
    writer: JoinHandle<Result<(), OutputError>>,
}

/// Bytes for standard output, and how many items (events) they hold.
struct Chunk {
    bytes: Vec<u8>,
    items: u64,
}

#[derive(Default)]
struct Progress {
    /// Items of chunks written whole.
    items_written: AtomicU64,
    bytes_queued: AtomicU64,
    bytes_written: AtomicU64,
    /// When the writer last got anything out, or took a chunk to write.
    last_progress: Mutex<Option<Instant>>,
    /// Whether the writer is writing a chunk (rather than waiting for one).
    busy: AtomicBool,
}

impl Progress {
    fn touch(&self) {
        *self.last_progress.lock().unwrap() = Some(Instant::now());
    }

    /// A chunk is queued: if the writer was idle, the stall clock starts now (a stall is
    /// time spent in write(2), not time waiting for something to write).
    fn queued(&self, bytes: usize) {
        self.bytes_queued.fetch_add(bytes as u64, Ordering::Relaxed);
        if !self.busy.load(Ordering::Acquire) {
            self.touch();
        }
    }
}

impl OutputStream {
    /// Starts the writer thread on file descriptor 1.
    pub(crate) fn stdout() -> Self {
        let (sender, mut receiver) = mpsc::channel::<Chunk>(QUEUED_BUFFERS);
        let (fail, failed) = watch::channel(false);
        let progress = Arc::new(Progress::default());
        progress.touch();
        let shared = Arc::clone(&progress);
        let writer = std::thread::spawn(move || {
            // SAFETY: fd 1 is open for the life of the process; ManuallyDrop never closes it.
            let mut out = ManuallyDrop::new(unsafe { File::from_raw_fd(1) });
            while let Some(chunk) = receiver.blocking_recv() {
                shared.busy.store(true, Ordering::Release);
                shared.touch();
                let mut rest = chunk.bytes.as_slice();
                while !rest.is_empty() {
                    match out.write(rest) {
                        Ok(0) => {
                            let _ = fail.send(true);
                            return Err(OutputError::Failed(io::ErrorKind::WriteZero.into()));
                        }
                        Ok(n) => {
                            rest = &rest[n..];
                            shared.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
                            shared.touch();
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = fail.send(true);
                            return Err(e.into());
                        }
                    }
                }
                shared
                    .items_written
                    .fetch_add(chunk.items, Ordering::Relaxed);
                shared.busy.store(false, Ordering::Release);
            }
            Ok(())
        });
        Self {
            sender: Some(sender),
            failed,
            progress,
            writer,
        }
    }

    /// Waits for room in the queue, then queues what `make` returns (bytes holding that
    /// many events), taken only once there is room: cancelled while it waits (a stop
    /// signal won the race), nothing was taken, so nothing is lost. False once the writer
    /// has failed.
    pub(crate) async fn send_made(&self, make: impl FnOnce() -> (Vec<u8>, u64)) -> bool {
        let Some(sender) = &self.sender else {
            return false;
        };
        let Ok(permit) = sender.reserve().await else {
            return false;
        };
        let (bytes, items) = make();
        if items > 0 || !bytes.is_empty() {
            self.progress.queued(bytes.len());
            permit.send(Chunk { bytes, items });
        }
        true
    }

    /// Queues `bytes` from code outside the runtime, waiting at most until `deadline`
    /// passes without the writer getting anything out.
    pub(crate) fn send_blocking(&self, bytes: Vec<u8>, items: u64) -> bool {
        let Some(sender) = &self.sender else {
            return false;
        };
        self.progress.queued(bytes.len());
        let mut chunk = Chunk { bytes, items };
        loop {
            match sender.try_send(chunk) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
                Err(mpsc::error::TrySendError::Full(back)) => {
                    if self.stalled() {
                        return false;
                    }
                    chunk = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Resolves when the writer has failed (the reader went away, the device is full).
    pub(crate) async fn failed(&self) {
        let mut failed = self.failed.clone();
        let _ = failed.wait_for(|&f| f).await;
    }

    /// Items (events) of the chunks written whole so far.
    pub(crate) fn items_written(&self) -> u64 {
        self.progress.items_written.load(Ordering::Relaxed)
    }

    /// Whether the writer is stuck in write(2): busy with a chunk and nothing got out for
    /// [`STALL_TIMEOUT`]. An idle writer is never stalled (it has nothing to write).
    fn stalled(&self) -> bool {
        self.progress.busy.load(Ordering::Acquire)
            && self
                .progress
                .last_progress
                .lock()
                .unwrap()
                .is_none_or(|at| at.elapsed() >= STALL_TIMEOUT)
    }

    /// Writes out what is queued, waiting as long as the reader makes progress but not
    /// longer than [`STALL_TIMEOUT`] without any, and says how it went. Returns the items
    /// written in all, with the error if any.
    pub(crate) fn finish(mut self) -> (u64, Result<(), OutputError>) {
        self.sender = None;
        while !self.writer.is_finished() {
            if self.stalled() {
                let queued = self.progress.bytes_queued.load(Ordering::Relaxed);
                let written = self.progress.bytes_written.load(Ordering::Relaxed);
                // The writer stays blocked in write(2); the process exits without it.
                return (
                    self.items_written(),
                    Err(OutputError::Stalled(queued.saturating_sub(written))),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let result = self
            .writer
            .join()
            .unwrap_or_else(|_| Err(OutputError::Failed(io::Error::other("writer panicked"))));
        (self.progress.items_written.load(Ordering::Relaxed), result)
    }
}

/// Prints `text` on standard output through a writer of its own (see [`OutputStream`]).
pub(crate) fn print(text: impl Into<String>) -> Result<(), OutputError> {
    let out = OutputStream::stdout();
    // A refusal means the writer failed already: `finish` says how.
    let _ = out.send_blocking(text.into().into_bytes(), 1);
    out.finish().1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_pipes_are_closed_output_and_other_errors_failures() {
        assert!(matches!(
            OutputError::from(io::Error::from_raw_os_error(libc::EPIPE)),
            OutputError::Closed
        ));
        let full = OutputError::from(io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(full, OutputError::Failed(_)));
        assert!(
            full.to_string()
                .starts_with("cannot write to standard output: No space")
        );
    }
}
