//! Turning collected data into what users read: bpftrace-style histograms and summaries,
//! folded stacks and flame graphs.

pub mod flamegraph;
pub mod hist;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// `name`, which comes from the target (a probe, process or thread name, a path), as text
/// output shows it: control characters escaped (`\x1b`, `\x0a` for a newline, `\u{9b}`), so a name can
/// neither drive the terminal (move the cursor, clear the screen, change colours) nor
/// forge a line of output. JSON output escapes them its own way.
pub fn escape_text(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            c if !c.is_control() => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Creates (or truncates) an output file for writing, with the user's umask.
///
/// The tracer runs as root and users often write into shared directories such as /tmp,
/// so the path's last component must not be a symlink planted by someone else
/// (`O_NOFOLLOW`), and a FIFO planted there must not block us forever (`O_NONBLOCK`,
/// then only regular files and character devices such as /dev/null are accepted).
pub fn create_output_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| {
            if err.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a symbolic link; refusing to write through it",
                        path.display()
                    ),
                )
            } else {
                err
            }
        })?;
    let file_type = file.metadata()?.file_type();
    if !(file_type.is_file() || file_type.is_char_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape_text("gc-demo"), Cow::Borrowed("gc-demo")));
        assert!(matches!(escape_text("pâté [k] 🦀"), Cow::Borrowed(_)));
        assert_eq!(escape_text("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(
            escape_text("line\nforged\r\t\x00\x7f"),
            "line\\x0aforged\\x0d\\x09\\x00\\x7f"
        );
        // C1 controls: U+009B is a one-character CSI on some terminals.
        assert_eq!(escape_text("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape_text("back\\slash"), "back\\slash");
    }
    use std::os::unix::fs::PermissionsExt;

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-render-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn creates_and_truncates_regular_files() {
        let dir = scratch_dir("create");
        let path = dir.join("out.txt");
        create_output_file(&path)
            .unwrap()
            .write_all(b"long content")
            .unwrap();
        create_output_file(&path)
            .unwrap()
            .write_all(b"short")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short");
        // No execute bits and nothing beyond what the umask allows of 0666.
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refuses_symlinks() {
        let dir = scratch_dir("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = dir.join("out.svg");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = create_output_file(&link).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refuses_fifos_without_blocking() {
        let dir = scratch_dir("fifo");
        let fifo = dir.join("out.svg");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(create_output_file(&fifo).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
