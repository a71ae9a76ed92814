//! Finding the ELF objects a running process has mapped, through `/proc/PID`.

use std::io;
use std::path::{Path, PathBuf};

use super::UsdtError;
use crate::system::procfs::ProcessError;
pub(crate) use crate::system::procfs::{MapsEntry, parse_maps};

/// A file a process has mapped, under the two names it has.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MappedObject {
    /// The path as the process sees it (in its own mount namespace), for display and for
    /// matching against user-given paths.
    pub path: PathBuf,
    /// A path to the same file that works from the tracer's mount namespace:
    /// `/proc/PID/root/<path>`, so processes in containers work. Read notes and attach
    /// uprobes through this one.
    pub host_path: PathBuf,
}

impl MappedObject {
    /// A file named directly by the user (path mode): both names are the same.
    pub(crate) fn from_path(path: &Path) -> Self {
        MappedObject {
            path: path.to_path_buf(),
            host_path: path.to_path_buf(),
        }
    }

    /// A file at `path` inside process `pid`'s root directory.
    pub(crate) fn in_process(pid: u32, path: &Path) -> Self {
        let relative = path.strip_prefix("/").unwrap_or(path);
        MappedObject {
            path: path.to_path_buf(),
            host_path: proc_path(pid, "root").join(relative),
        }
    }
}

/// The files a process has mapped executable, each once, in address order: its
/// executable and shared libraries. Pseudo-mappings (`[vdso]`), anonymous memory (JIT
/// code) and deleted files are left out, as they have no file to read notes from.
pub(crate) fn mapped_objects(pid: u32) -> Result<Vec<MappedObject>, UsdtError> {
    let maps_path = proc_path(pid, "maps");
    let text = std::fs::read_to_string(&maps_path).map_err(|e| proc_error(pid, &maps_path, e))?;
    Ok(executable_files(&parse_maps(&text))
        .into_iter()
        .map(|path| MappedObject::in_process(pid, Path::new(path)))
        .collect())
}

/// The distinct file paths of executable, file-backed, still-existing mappings.
fn executable_files(entries: &[MapsEntry]) -> Vec<&str> {
    let mut paths: Vec<&str> = Vec::new();
    for entry in entries {
        let Some(path) = entry.path.as_deref() else {
            continue;
        };
        if entry.is_executable()
            && !entry.deleted
            && path.starts_with('/')
            && !paths.contains(&path)
        {
            paths.push(path);
        }
    }
    paths
}

/// The process's main executable, from `/proc/PID/exe`. If the file was deleted or
/// replaced since the process started, `host_path` is `/proc/PID/exe` itself, which
/// still leads to the running contents.
pub(crate) fn executable(pid: u32) -> Result<MappedObject, UsdtError> {
    let exe = proc_path(pid, "exe");
    let target = std::fs::read_link(&exe).map_err(|e| proc_error(pid, &exe, e))?;
    let text = target.to_string_lossy();
    if let Some(original) = text.strip_suffix(" (deleted)") {
        return Ok(MappedObject {
            path: PathBuf::from(original),
            host_path: exe,
        });
    }
    Ok(MappedObject::in_process(pid, &target))
}

fn proc_path(pid: u32, entry: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{entry}"))
}

/// Tells "the process is gone" (or a zombie, or hidden by /proc's hidepid option) apart
/// from other failures (permissions, a kernel thread without an executable, out of file
/// descriptors): see [`ProcessError::check`].
fn proc_error(pid: u32, path: &Path, error: io::Error) -> UsdtError {
    let about_the_process = matches!(error.raw_os_error(), Some(libc::ESRCH))
        || matches!(
            error.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
        );
    match ProcessError::check(pid) {
        Some(gone) if about_the_process => UsdtError::Process(gone),
        _ => UsdtError::io(path, error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-0041f000 r--p 00000000 08:01 1234                               /usr/bin/python3.11
0041f000-006d2000 r-xp 0001f000 08:01 1234                               /usr/bin/python3.11
006d2000-00945000 r--p 002d2000 08:01 1234                               /usr/bin/python3.11
00945000-00a86000 rw-p 00544000 08:01 1234                               /usr/bin/python3.11
01b3e000-01c2f000 rw-p 00000000 00:00 0                                  [heap]
7f1c5c000000-7f1c5c021000 rw-p 00000000 00:00 0 
7f1c60a28000-7f1c60bbd000 r-xp 00028000 08:01 5678                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c60c00000-7f1c60c01000 r-xp 00000000 08:01 91                         /tmp/old lib.so (deleted)
7f1c60c10000-7f1c60c11000 r-xp 00000000 08:01 92                         /opt/my libs/libprobe.so
7f1c60c20000-7f1c60c21000 r-xp 00001000 08:01 5678                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c60c30000-7f1c60c31000 rwxp 00000000 00:00 0                          
7f1c60c40000-7f1c60c41000 r-xs 00000000 00:05 77                         /memfd:jit (deleted)
7ffd8a1f1000-7ffd8a1f3000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
not a maps line
";

    #[test]
    fn parses_maps_lines() {
        let entries = parse_maps(MAPS);
        assert_eq!(entries.len(), 14, "the garbage line is skipped");
        assert_eq!(
            entries[1],
            MapsEntry {
                start: 0x41f000,
                end: 0x6d2000,
                perms: "r-xp".into(),
                offset: 0x1f000,
                dev: "08:01".into(),
                inode: 1234,
                path: Some("/usr/bin/python3.11".into()),
                deleted: false,
            }
        );
        assert!(entries[1].is_executable());
        assert!(!entries[0].is_executable());
        assert_eq!(entries[4].path.as_deref(), Some("[heap]"));
        assert_eq!(entries[5].path, None, "anonymous mapping");
        assert_eq!(entries[7].path.as_deref(), Some("/tmp/old lib.so"));
        assert!(entries[7].deleted);
        assert_eq!(entries[8].path.as_deref(), Some("/opt/my libs/libprobe.so"));
        assert_eq!(entries[13].end, 0xffffffffff601000);
    }

    #[test]
    fn keeps_executable_files_once() {
        let entries = parse_maps(MAPS);
        assert_eq!(
            executable_files(&entries),
            vec![
                "/usr/bin/python3.11",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/opt/my libs/libprobe.so",
            ]
        );
    }

    #[test]
    fn maps_malformed_lines_are_skipped() {
        for line in [
            "",
            "00400000 r-xp 0 08:01 1 /x",
            "zz-00400000 r-xp 0 08:01 1 /x",
            "00400000-00500000 r-x 0 08:01 1 /x",
            "00400000-00500000 r-xp 0 08:01",
            "00400000-00500000 r-xp 0 08:01 abc /x",
        ] {
            assert_eq!(parse_maps(line), vec![], "{line:?}");
        }
    }

    #[test]
    fn host_paths_go_through_proc_root() {
        let o = MappedObject::in_process(42, Path::new("/usr/lib/libjvm.so"));
        assert_eq!(o.path, Path::new("/usr/lib/libjvm.so"));
        assert_eq!(o.host_path, Path::new("/proc/42/root/usr/lib/libjvm.so"));
        let o = MappedObject::from_path(Path::new("./a.out"));
        assert_eq!(o.host_path, Path::new("./a.out"));
    }

    #[test]
    fn own_process() {
        let pid = std::process::id();
        let exe = executable(pid).unwrap();
        assert_eq!(exe.path, std::env::current_exe().unwrap());
        assert!(exe.host_path.starts_with(format!("/proc/{pid}/")));
        let objects = mapped_objects(pid).unwrap();
        assert!(objects.iter().any(|o| o.path == exe.path), "{objects:?}");
        assert!(
            objects.iter().any(|o| o
                .path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc"))),
            "{objects:?}"
        );
        for o in &objects {
            assert!(o.host_path.exists(), "{}", o.host_path.display());
        }
    }

    #[test]
    fn missing_process() {
        let pid = u32::MAX - 1;
        let gone = |r: Result<_, UsdtError>| matches!(r, Err(UsdtError::Process(ProcessError::NoSuch(p))) if p == pid);
        assert!(gone(executable(pid).map(|_| ())));
        assert!(gone(mapped_objects(pid).map(|_| ())));
    }
}
