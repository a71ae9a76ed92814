//! Turning collected data into what users read: bpftrace-style histograms and summaries,
//! folded stacks and flame graphs.

pub(crate) mod export;
pub(crate) mod flamegraph;
pub(crate) mod hist;
mod pprof;
pub(crate) mod prometheus;
pub(crate) mod rolling;
pub(crate) mod timeline;
pub(crate) mod views;

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Checks, before anything is traced, that the file `path` can be written (as
/// [`write_output`] will: not through a link, into a directory that takes a new file),
/// writing and removing a file beside it; what is at `path` stays until it is replaced.
pub(crate) fn prepare_output_file(path: &Path) -> io::Result<()> {
    let context = |err: io::Error| {
        io::Error::new(
            err.kind(),
            format!("cannot write {}: {err}", path.display()),
        )
    };
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && (meta.file_type().is_symlink() || !meta.is_file())
    {
        return Err(context(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a link or not a regular file",
        )));
    }
    let name = path
        .file_name()
        .ok_or_else(|| context(io::Error::new(io::ErrorKind::InvalidInput, "no file name")))?;
    let mut check_name = std::ffi::OsString::from(".");
    check_name.push(name);
    check_name.push(".check");
    let check = path.with_file_name(check_name);
    write_output(&check, |_| Ok(()))
        .and_then(|()| std::fs::remove_file(&check))
        .map_err(context)
}

/// Checks, before anything is traced, that output files can be written into `dir`:
/// creates it if needed (with its parents), and writes and removes a file in it. A trace
/// that would only fail at its end (a regular file or a device given as the directory, a
/// read-only or pseudo file system, a name too long) fails here instead, with the reason.
pub(crate) fn prepare_output_dir(dir: &Path) -> io::Result<()> {
    let context = |err: io::Error| {
        io::Error::new(
            err.kind(),
            format!("cannot write to output directory {}: {err}", dir.display()),
        )
    };
    // A link another user planted (in /tmp, say) would have root write where they chose.
    if let Ok(link) = std::fs::symlink_metadata(dir)
        && link.file_type().is_symlink()
    {
        use std::os::unix::fs::MetadataExt as _;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if link.uid() != euid && link.uid() != 0 {
            return Err(context(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "it is a symbolic link owned by another user (uid {}); give the \
                     directory it points to instead",
                    link.uid()
                ),
            )));
        }
    }
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(context(io::Error::new(
                io::ErrorKind::NotADirectory,
                "it exists and is not a directory",
            )));
        }
        Ok(_) => {}
        Err(_) => std::fs::create_dir_all(dir).map_err(context)?,
    }
    // The longest name tracer writes there, so a name that would be too long fails now.
    write_output(&dir.join("wallclock.speedscope.json.check"), |_| Ok(()))
        .and_then(|()| std::fs::remove_file(dir.join("wallclock.speedscope.json.check")))
        .map_err(context)
}

/// Writes an output file: `write` fills a new file next to `path`, which then replaces
/// `path` at once. A failure (a full disk, say) leaves no partial or empty file behind,
/// and whatever `path` was before stays as it was.
///
/// The tracer runs as root and users often write into shared directories such as /tmp:
/// the new file is created exclusively and never through a symlink (`O_EXCL`,
/// `O_NOFOLLOW`), with the user's umask, and the rename never follows what `path` is.
/// Anything but a regular file planted at `path` (a symlink, a FIFO) is refused with a
/// message naming it, and left as it is.
pub(crate) fn write_output(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let refuse = |what: &str| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is {what}; refusing to write through it", path.display()),
            ))
        };
        if meta.file_type().is_symlink() {
            return refuse("a symbolic link");
        }
        if !meta.is_file() {
            return refuse("not a regular file");
        }
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".{}-{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(temp_name);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)?;
    let remove_on_failure = TempFile(Some(temp.clone()));
    let mut out = BufWriter::new(file);
    write(&mut out)?;
    out.into_inner().map_err(io::IntoInnerError::into_error)?;
    std::fs::rename(&temp, path)?;
    std::mem::forget(remove_on_failure);
    Ok(())
}

/// The files of one flame graph view, once written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewFiles {
    pub folded: PathBuf,
    pub svg: PathBuf,
}

/// Writes one flame graph view into `dir`: `NAME.folded` and `NAME.svg`, both or neither
/// (the folded file is removed again when the SVG cannot be written), so a report never
/// names a file that is not there.
pub(crate) fn write_view(
    stacks: &crate::stack::naming::StackProfile,
    dir: &Path,
    name: &str,
    options: &flamegraph::SvgOptions<'_>,
) -> io::Result<ViewFiles> {
    write_folded_view(&flamegraph::FoldedStacks::from(stacks), dir, name, options)
}

/// [`write_view`] of stacks already folded (weighted as the caller chose).
pub fn write_folded_view(
    folded: &flamegraph::FoldedStacks,
    dir: &Path,
    name: &str,
    options: &flamegraph::SvgOptions<'_>,
) -> io::Result<ViewFiles> {
    let files = ViewFiles {
        folded: dir.join(format!("{name}.folded")),
        svg: dir.join(format!("{name}.svg")),
    };
    let context = |path: &Path| {
        let path = path.to_path_buf();
        move |err: io::Error| {
            io::Error::new(err.kind(), format!("writing {}: {err}", path.display()))
        }
    };
    // Both at once, from the same folded text (built once, by whichever asks first).
    let (folded_written, svg_written) = std::thread::scope(|scope| {
        let folded_written = scope.spawn(|| flamegraph::write_folded(folded, &files.folded));
        let svg_written = flamegraph::write_flamegraph_svg(folded, &files.svg, options);
        let folded_written = folded_written
            .join()
            .expect("writing folded stacks panicked");
        (folded_written, svg_written)
    });
    // Only a file this call wrote is removed again: where a write failed, what is there
    // (a symbolic link planted there, say) is not ours.
    match (folded_written, svg_written) {
        (Ok(()), Ok(())) => Ok(files),
        (Err(err), svg) => {
            if svg.is_ok() {
                let _ = std::fs::remove_file(&files.svg);
            }
            Err(context(&files.folded)(err))
        }
        (Ok(()), Err(err)) => {
            let _ = std::fs::remove_file(&files.folded);
            Err(context(&files.svg)(err))
        }
    }
}

/// Removes a temporary output file unless it was renamed into place.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-render-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_regular_files() {
        let dir = scratch_dir("create");
        let path = dir.join("out.txt");
        write_output(&path, |out| out.write_all(b"long content")).unwrap();
        write_output(&path, |out| out.write_all(b"short")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short");
        // No execute bits and nothing beyond what the umask allows of 0666.
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0);
        assert_eq!(entries(&dir), ["out.txt"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_no_file_and_the_old_one_intact() {
        let dir = scratch_dir("fail");
        let path = dir.join("out.svg");
        let err = write_output(&path, |out| {
            out.write_all(b"half")?;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
        std::fs::write(&path, "old").unwrap();
        assert!(write_output(&path, |_| Err(io::Error::other("no"))).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(entries(&dir), ["out.svg"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    #[ignore = "needs root to give a link another owner: run as root with --include-ignored (cargo xtask test does)"]
    fn refuses_an_output_directory_linked_by_another_user() {
        let dir = scratch_dir("planted");
        let target = dir.join("target");
        std::fs::create_dir_all(&target).unwrap();
        let link = dir.join("out");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // Ours (or root's): followed.
        prepare_output_dir(&link).unwrap();
        // Another user's: refused, and nothing is written where it points.
        let other = 4242;
        std::os::unix::fs::lchown(&link, Some(other), None).unwrap();
        let err = prepare_output_dir(&link).unwrap_err();
        assert!(
            err.to_string().contains("owned by another user (uid 4242)"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_symlinks() {
        let dir = scratch_dir("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let link = dir.join("out.svg");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = write_output(&link, |out| out.write_all(b"svg")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(entries(&dir), ["out.svg", "victim"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refuses_fifos_without_blocking() {
        let dir = scratch_dir("fifo");
        let fifo = dir.join("out.svg");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(write_output(&fifo, |out| out.write_all(b"svg")).is_err());
        assert_eq!(entries(&dir), ["out.svg"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn output_dirs_that_cannot_be_written_are_refused_up_front() {
        let dir = scratch_dir("dirs");
        let file = dir.join("a-file");
        std::fs::write(&file, "x").unwrap();
        for bad in [
            file.clone(),
            file.join("below"),
            PathBuf::from("/dev/null"),
            PathBuf::from("/proc/x"),
            PathBuf::from("/sys/kernel"),
            dir.join("n".repeat(300)),
        ] {
            let err = prepare_output_dir(&bad).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "cannot write to output directory {}",
                    bad.display()
                )),
                "{err}"
            );
        }
        let fresh = dir.join("new/nested");
        prepare_output_dir(&fresh).unwrap();
        assert!(entries(&fresh).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
