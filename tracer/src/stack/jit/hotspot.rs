//! Asking a HotSpot JVM for its perf map, as `jcmd PID Compiler.perfmap` does, through
//! the JVM's own attach mechanism: a `.attach_pid<NSPID>` file in its working directory
//! (or its /tmp) and a SIGQUIT make it open the socket `/tmp/.java_pid<NSPID>` (in its
//! own mount namespace), on which it takes one command and answers. The map lands in
//! the JVM's `/tmp/perf-<NSPID>.map`, where the symbolizer reads it.
//!
//! A SIGQUIT is only sent where the JVM handles it: its signal dispatcher thread runs,
//! and it was not started with `-Xrs` (which leaves SIGQUIT's default action, a core
//! dump) or with the attach mechanism disabled (it would print a thread dump instead).

use std::{
    fs,
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long the JVM may take to open its attach socket after the SIGQUIT.
const LISTENER_WAIT: Duration = Duration::from_secs(5);
/// How long a command may take to answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Why a JVM could not be asked, or what it answered instead of success.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    #[error("process {0} is not a HotSpot JVM whose signal dispatcher runs")]
    NotReady(u32),
    #[error("process {0} was started with {1}: its attach mechanism is off")]
    Refused(u32, &'static str),
    #[error("the JVM opened no attach socket within {0:?} of the SIGQUIT")]
    NoListener(Duration),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the JVM answered {0:?}")]
    Failed(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AttachError {
    let what = what.into();
    move |source| AttachError::Io { what, source }
}

/// Whether process `pid` is a HotSpot JVM: it maps `libjvm.so`.
pub(crate) fn is_hotspot(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.lines().any(|l| l.ends_with("/libjvm.so")))
}

/// Asks JVM `pid` to write its perf map (`Compiler.perfmap`); returns what it printed.
pub(crate) fn request_perf_map(pid: u32) -> Result<String, AttachError> {
    execute(pid, "jcmd", &["Compiler.perfmap"])
}

/// Runs one attach command (`jcmd`, `properties`, ...) with up to three arguments.
fn execute(pid: u32, command: &str, args: &[&str]) -> Result<String, AttachError> {
    let ns_pid = crate::system::procfs::namespace_pid(pid).unwrap_or(pid);
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let socket = root.join(format!("tmp/.java_pid{ns_pid}"));
    if !socket.exists() {
        start_listener(pid, ns_pid, &root, &socket)?;
    }
    let mut stream = UnixStream::connect(&socket).map_err(io(format!(
        "connecting to the JVM's attach socket {}",
        socket.display()
    )))?;
    stream
        .set_read_timeout(Some(ANSWER_WAIT))
        .map_err(io("setting a timeout"))?;
    stream
        .write_all(&request(command, args))
        .map_err(io("sending the command"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(io("reading the answer"))?;
    parse_answer(&answer)
}

/// Protocol 1: the version, the command and exactly three arguments, each NUL-ended.
fn request(command: &str, args: &[&str]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for part in ["1", command]
        .into_iter()
        .chain((0..3).map(|i| args.get(i).copied().unwrap_or("")))
    {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    bytes
}

/// The answer's first line is a status, 0 for success; the command's output follows.
fn parse_answer(answer: &str) -> Result<String, AttachError> {
    let (status, output) = answer.split_once('\n').unwrap_or((answer, ""));
    match status.trim() {
        "0" if !output.contains("Unknown diagnostic command") => Ok(output.to_string()),
        _ => Err(AttachError::Failed(answer.trim().to_string())),
    }
}

/// Makes the JVM open its attach socket: the trigger file, then SIGQUIT.
fn start_listener(pid: u32, ns_pid: u32, root: &Path, socket: &Path) -> Result<(), AttachError> {
    check_ready(pid)?;
    let name = format!(".attach_pid{ns_pid}");
    let candidates = [
        PathBuf::from(format!("/proc/{pid}/cwd")).join(&name),
        root.join("tmp").join(&name),
    ];
    let trigger = candidates
        .iter()
        .find(|path| {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .is_ok()
        })
        .ok_or_else(|| AttachError::Io {
            what: format!("creating {name} in the JVM's working directory or /tmp"),
            source: std::io::Error::last_os_error(),
        })?;
    let result = signal_and_wait(pid, socket);
    let _ = fs::remove_file(trigger);
    result
}

fn signal_and_wait(pid: u32, socket: &Path) -> Result<(), AttachError> {
    // SAFETY: kill has no memory preconditions; the JVM handles SIGQUIT (check_ready).
    if unsafe { libc::kill(pid as i32, libc::SIGQUIT) } != 0 {
        return Err(io("sending SIGQUIT")(std::io::Error::last_os_error()));
    }
    let started = Instant::now();
    while started.elapsed() < LISTENER_WAIT {
        if socket.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(AttachError::NoListener(LISTENER_WAIT))
}

/// A SIGQUIT is safe only where the JVM's signal dispatcher handles it.
fn check_ready(pid: u32) -> Result<(), AttachError> {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    for flag in ["-Xrs", "-XX:+DisableAttachMechanism"] {
        if cmdline.split(|&b| b == 0).any(|arg| arg == flag.as_bytes()) {
            return Err(AttachError::Refused(pid, flag));
        }
    }
    let dispatcher = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|task| {
            fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == "Signal Dispatch")
        });
    match dispatcher && is_hotspot(pid) {
        true => Ok(()),
        false => Err(AttachError::NotReady(pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_five_nul_ended_parts() {
        assert_eq!(
            request("jcmd", &["Compiler.perfmap"]),
            b"1\0jcmd\0Compiler.perfmap\0\0\0"
        );
    }

    #[test]
    fn answers_start_with_a_status() {
        assert_eq!(parse_answer("0\n").unwrap(), "");
        assert_eq!(parse_answer("0\nfine\n").unwrap(), "fine\n");
        assert!(parse_answer("1\nno\n").is_err());
        assert!(parse_answer("0\nUnknown diagnostic command\n").is_err());
        assert!(parse_answer("").is_err());
    }

    #[test]
    fn a_process_without_a_jvm_is_never_signalled() {
        assert!(matches!(
            check_ready(std::process::id()),
            Err(AttachError::NotReady(_))
        ));
    }
}
