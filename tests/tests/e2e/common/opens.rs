//! `strace` on a running process, to count the files it opens: how the tests see that the
//! tracer reads a target's `/proc/PID/maps` only when something changed.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A process's `openat` calls, followed by `strace` from [`OpenWatch::start`].
pub struct OpenWatch {
    strace: Child,
    log: PathBuf,
}

impl OpenWatch {
    /// Follows every thread of `pid` (and what it starts), writing to `log`; returns once
    /// `strace` is attached.
    pub fn start(pid: u32, log: &Path) -> OpenWatch {
        let strace = Command::new("strace")
            .args([
                "-f",
                "-qq",
                "-ttt",
                "-e",
                "trace=openat",
                "-e",
                "signal=none",
                "-o",
            ])
            .arg(log)
            .arg("-p")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strace is installed by `cargo xtask setup`");
        let deadline = Instant::now() + Duration::from_secs(10);
        while tracer_pid(pid) == Some(0) {
            assert!(Instant::now() < deadline, "strace did not attach to {pid}");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The other threads are attached right after the first.
        std::thread::sleep(Duration::from_millis(200));
        OpenWatch {
            strace,
            log: log.to_path_buf(),
        }
    }

    /// Detaches `strace`; returns when (seconds since the epoch) each `openat` of `path`
    /// began.
    pub fn finish(mut self, path: &str) -> Vec<f64> {
        // SAFETY: kill has no memory preconditions; strace is our child.
        unsafe { libc::kill(self.strace.id() as i32, libc::SIGTERM) };
        let _ = self.strace.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        opens_in(&log, path)
    }
}

/// The `TracerPid` of `pid`'s status: 0 when no one traces it.
fn tracer_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The start times of the `openat` calls of `path` in a `strace -f -ttt` log (an
/// interrupted call counts once, where it began).
fn opens_in(log: &str, path: &str) -> Vec<f64> {
    let quoted = format!("\"{path}\"");
    log.lines()
        .filter(|line| line.contains("openat(") && line.contains(&quoted))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            // `PID TIME openat(...)`: with -f, each line starts with the thread's id.
            let first = fields.next()?;
            let time = match first.contains('.') {
                true => first,
                false => fields.next()?,
            };
            time.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_opens_of_one_path_where_they_began() {
        let log = "\
123 1700000000.100000 openat(AT_FDCWD, \"/proc/42/maps\", O_RDONLY|O_CLOEXEC) = 7
124 1700000000.200000 openat(AT_FDCWD, \"/proc/42/maps\", O_RDONLY|O_CLOEXEC <unfinished ...>
124 1700000000.200100 <... openat resumed>) = 8
123 1700000000.300000 openat(AT_FDCWD, \"/proc/421/maps\", O_RDONLY) = 9
123 1700000000.400000 openat(AT_FDCWD, \"/proc/42/task\", O_RDONLY) = 9
";
        assert_eq!(opens_in(log, "/proc/42/maps"), [1700000000.1, 1700000000.2]);
    }
}
