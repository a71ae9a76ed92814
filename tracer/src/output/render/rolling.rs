//! The files of rolling windows (`--profile-every`): each window's wall-clock view as
//! pprof (`wallclock-START.pb.gz`, its samples labelled `process` and `pid`) and folded
//! stacks (`wallclock-START.folded`), START the window's start in UTC
//! (`20261205T083000Z`). The oldest windows beyond `--keep` are removed.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::{
    export::{ExportInfo, write_pprof},
    flamegraph::{FoldedStacks, write_folded},
};
use crate::profile::wallclock::WallClockProfile;

/// The names of a window's files start so.
const PREFIX: &str = "wallclock-";
const SUFFIXES: [&str; 2] = [".pb.gz", ".folded"];

/// Writes the files of the window `info` describes (its start and length) into `dir`,
/// then removes the oldest windows' files beyond the newest `keep`. Returns the files
/// written.
pub(crate) fn write_window(
    profile: &WallClockProfile,
    dir: &Path,
    info: &ExportInfo<'_>,
    keep: usize,
) -> io::Result<Vec<PathBuf>> {
    let stem = format!("{PREFIX}{}", window_stamp(info.start_unix_ns));
    let pprof = dir.join(format!("{stem}{}", SUFFIXES[0]));
    let folded = dir.join(format!("{stem}{}", SUFFIXES[1]));
    let info = ExportInfo {
        process_labels: true,
        ..info.clone()
    };
    write_pprof(&profile.wall, &info, &pprof)?;
    write_folded(&FoldedStacks::from(&profile.wall), &folded)?;
    remove_oldest(dir, keep)?;
    Ok(vec![pprof, folded])
}

/// `20261205T083000Z`: sortable, and without characters a file name may not hold.
fn window_stamp(unix_ns: u64) -> String {
    let seconds = (unix_ns / 1_000_000_000) as i64;
    match jiff::Timestamp::from_second(seconds) {
        Ok(time) => time.strftime("%Y%m%dT%H%M%SZ").to_string(),
        Err(_) => format!("{seconds}"),
    }
}

/// Removes the files of every window but the newest `keep` (names sort by start).
fn remove_oldest(dir: &Path, keep: usize) -> io::Result<()> {
    let mut stamps: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stamp = name.strip_prefix(PREFIX)?;
            SUFFIXES
                .iter()
                .find_map(|suffix| stamp.strip_suffix(suffix))
                .map(str::to_string)
        })
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let old = stamps.len().saturating_sub(keep);
    for stamp in &stamps[..old] {
        for suffix in SUFFIXES {
            match std::fs::remove_file(dir.join(format!("{PREFIX}{stamp}{suffix}"))) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_named_by_its_start_in_utc() {
        assert_eq!(window_stamp(1_796_459_400_123_456_789), "20261205T083000Z");
    }

    #[test]
    fn only_the_newest_windows_are_kept() {
        let dir = std::env::temp_dir().join(format!("tracer-rolling-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for stamp in ["20261205T083000Z", "20261205T083100Z", "20261205T083200Z"] {
            for suffix in SUFFIXES {
                std::fs::write(dir.join(format!("{PREFIX}{stamp}{suffix}")), "x").unwrap();
            }
        }
        std::fs::write(dir.join("wallclock.folded"), "the whole run's").unwrap();
        remove_oldest(&dir, 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "wallclock-20261205T083100Z.folded",
                "wallclock-20261205T083100Z.pb.gz",
                "wallclock-20261205T083200Z.folded",
                "wallclock-20261205T083200Z.pb.gz",
                "wallclock.folded",
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
