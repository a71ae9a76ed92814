//! Waiting for released uprobes to be gone from the targets: the keeper has the kernel's
//! workers remove them (see [`super::pins`]), which takes a grace period or so after the
//! release returns.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::{FileExt as _, MetadataExt as _},
    path::PathBuf,
    time::{Duration, Instant},
};

/// x86's `int3`, the instruction a uprobe puts at its site.
const BREAKPOINT: u8 = 0xcc;

/// A site to watch: its address in the process and the byte the file has there.
struct Site {
    address: u64,
    original: u8,
}

/// Waits until every site of `sites` (process, file, file offset) holds the file's byte
/// again, or `timeout` has passed; processes gone, and sites not mapped, are not waited
/// for.
pub(super) fn wait(sites: &[(u32, PathBuf, u64)], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut by_process: HashMap<u32, Vec<(&PathBuf, u64)>> = HashMap::new();
    for (pid, path, offset) in sites {
        by_process.entry(*pid).or_default().push((path, *offset));
    }
    for (pid, sites) in by_process {
        let Ok(mem) = File::open(format!("/proc/{pid}/mem")) else {
            continue;
        };
        let watched = addresses(pid, &sites);
        while Instant::now() < deadline
            && watched.iter().any(|site| {
                let mut byte = [0];
                mem.read_exact_at(&mut byte, site.address).is_ok()
                    && byte[0] == BREAKPOINT
                    && site.original != BREAKPOINT
            })
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Where `sites` (file, file offset) are in process `pid`: every executable mapping of
/// the file that holds the offset, with the file's byte there.
fn addresses(pid: u32, sites: &[(&PathBuf, u64)]) -> Vec<Site> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let maps = crate::system::procfs::parse_maps(&maps);
    let mut files: HashMap<&PathBuf, Option<(File, u64)>> = HashMap::new();
    let mut watched = Vec::new();
    for &(path, offset) in sites {
        let file = files.entry(path).or_insert_with(|| {
            let file = File::open(path).ok()?;
            let inode = file.metadata().ok()?.ino();
            Some((file, inode))
        });
        let Some((file, inode)) = file else {
            continue;
        };
        let mut original = [0];
        if file.read_exact_at(&mut original, offset).is_err() {
            continue;
        }
        for map in maps
            .iter()
            .filter(|m| m.is_executable() && m.inode == *inode)
        {
            if map.offset <= offset && offset < map.offset + (map.end - map.start) {
                watched.push(Site {
                    address: map.start + offset - map.offset,
                    original: original[0],
                });
            }
        }
    }
    watched
}
