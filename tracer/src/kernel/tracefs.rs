//! The kernel's tracing filesystem, where a tracepoint's id is read for `perf_event_open`.
//! A fresh machine may have it unmounted: it is mounted at its usual place, as perf and
//! bpftrace expect it.

use std::{
    io,
    path::{Path, PathBuf},
};

/// Where tracefs is mounted, newest convention first.
const MOUNT_POINTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The id of tracepoint `category:name`.
pub(super) fn tracepoint_id(category: &str, name: &str) -> io::Result<u64> {
    let path = events_dir()?.join(category).join(name).join("id");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    parse_id(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a tracepoint id: {text:?}", path.display()),
        )
    })
}

fn parse_id(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The `events` directory of a mounted tracefs, mounting one if there is none.
fn events_dir() -> io::Result<PathBuf> {
    if let Some(dir) = MOUNT_POINTS
        .iter()
        .map(|mount| Path::new(mount).join("events"))
        .find(|events| events.is_dir())
    {
        return Ok(dir);
    }
    // SAFETY: every argument is a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("no tracefs, and mounting one at /sys/kernel/tracing failed: {e}"),
        ));
    }
    Ok(Path::new(MOUNT_POINTS[0]).join("events"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_file_holds_a_number_and_a_newline() {
        assert_eq!(parse_id("174\n"), Some(174));
        assert_eq!(parse_id(""), None);
        assert_eq!(parse_id("sys_exit_mmap"), None);
    }
}
