//! Which processes a command traces: one PID, several, a whole service (`--children`,
//! `--exe`, `--comm`, `--cgroup`), or every process. Finds the processes that match now;
//! the kernel follows forks and executions from then on (see the eBPF `targets` module),
//! and [`TargetTracker`] adds processes that join a cgroup and says when every target
//! has exited.

pub(crate) mod launch;

use std::{
    collections::BTreeSet,
    fmt, io,
    num::NonZeroU32,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use tracer_common::target_flags;

pub(crate) use crate::kernel::{COMM_LEN, FileId, KernelTargets, Member};
use crate::{system::procfs, system::stop::StopReason};

/// The processes to trace, as the user selected them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TargetSpec {
    /// `--pid`, each as given.
    pub pids: Vec<NonZeroU32>,
    /// `--exe`: every process running this file.
    pub exe: Option<PathBuf>,
    /// `--comm`: every process of this name.
    pub comm: Option<String>,
    /// `--cgroup`: every process in this cgroup or below it.
    pub cgroup: Option<PathBuf>,
    /// `--children`: and every process they fork.
    pub children: bool,
}

impl TargetSpec {
    /// One process given by PID.
    #[cfg(test)]
    pub(crate) fn pid(pid: NonZeroU32) -> Self {
        Self {
            pids: vec![pid],
            ..Self::default()
        }
    }

    /// Nothing selected: every process.
    pub(crate) fn is_everything(&self) -> bool {
        self.pids.is_empty() && self.exe.is_none() && self.comm.is_none() && self.cgroup.is_none()
    }

    /// The only process traced, when it is one PID and no other process can join.
    pub(crate) fn single_pid(&self) -> Option<u32> {
        match self.pids.as_slice() {
            [pid] if !self.can_grow() => Some(pid.get()),
            _ => None,
        }
    }

    /// Whether processes that do not exist yet can become targets.
    pub(crate) fn can_grow(&self) -> bool {
        self.children || self.exe.is_some() || self.comm.is_some() || self.cgroup.is_some()
    }

    /// Whether the trace ends once every target has exited: processes given by PID (and
    /// their children) do not come back; new ones can start a file, take a name or join a
    /// cgroup at any time.
    pub(crate) fn ends_with_its_processes(&self) -> bool {
        !self.pids.is_empty() && self.exe.is_none() && self.comm.is_none() && self.cgroup.is_none()
    }

    /// The `--comm` name as the kernel stores it: at most 15 bytes, zero-padded.
    pub(crate) fn comm_bytes(&self) -> Option<[u8; COMM_LEN]> {
        self.comm.as_ref().map(|name| {
            let mut bytes = [0; COMM_LEN];
            let name = &name.as_bytes()[..name.len().min(COMM_LEN - 1)];
            bytes[..name.len()].copy_from_slice(name);
            bytes
        })
    }

    /// For file names: `42`, `42-43`, `postgres`, `cgroup-name`.
    pub(crate) fn short_name(&self) -> String {
        if let Some(comm) = &self.comm {
            return sanitize(comm);
        }
        if let Some(exe) = &self.exe {
            return sanitize(&exe.file_name().unwrap_or_default().to_string_lossy());
        }
        if let Some(cgroup) = &self.cgroup {
            return sanitize(&cgroup.file_name().unwrap_or_default().to_string_lossy());
        }
        let pids: Vec<String> = self
            .pids
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        pids.join("-")
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_everything() {
            return f.write_str("every process");
        }
        let mut parts = Vec::new();
        match self.pids.as_slice() {
            [] => {}
            [pid] => parts.push(format!("process {pid}")),
            pids => parts.push(format!(
                "processes {}",
                pids.iter()
                    .map(std::string::ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        if let Some(exe) = &self.exe {
            parts.push(format!("every process running {}", exe.display()));
        }
        if let Some(comm) = &self.comm {
            parts.push(format!("every process named {comm:?}"));
        }
        if let Some(cgroup) = &self.cgroup {
            parts.push(format!("every process in cgroup {}", cgroup.display()));
        }
        f.write_str(&parts.join(", "))?;
        if self.children {
            f.write_str(" and the processes they fork")?;
        }
        Ok(())
    }
}

impl TargetSpec {
    /// The processes that match now, and what the kernel must follow. Fails when a
    /// given PID does not exist, the `--exe` file or the `--cgroup` directory cannot be
    /// read, or a set that can never grow is empty.
    pub(crate) fn find(&self) -> Result<KernelTargets> {
        let mut members: BTreeSet<Member> = BTreeSet::new();
        let follow = |by_match: bool| {
            let mut flags = 0;
            if self.children || by_match {
                flags |= target_flags::FOLLOW_FORKS;
            }
            if by_match {
                flags |= target_flags::BY_MATCH;
            }
            flags
        };
        for pid in &self.pids {
            let pid = pid.get();
            if let Some(error) = procfs::ProcessError::check(pid) {
                return Err(error.into());
            }
            members.insert(Member {
                pid,
                flags: follow(false),
            });
        }
        let exe = match &self.exe {
            Some(path) => Some(
                FileId::of(path)
                    .with_context(|| format!("--exe {}: cannot read the file", path.display()))?,
            ),
            None => None,
        };
        let comm = self.comm.as_ref().map(|c| truncated(c));
        if exe.is_some() || comm.is_some() {
            for pid in procfs::all_processes() {
                let by_exe = exe.is_some_and(|id| {
                    FileId::of(Path::new(&format!("/proc/{pid}/exe"))).is_ok_and(|f| f == id)
                });
                let by_comm = comm.as_ref().is_some_and(|name| {
                    procfs::read_name(Path::new(&format!("/proc/{pid}/comm")))
                        .is_ok_and(|n| &n == name)
                });
                if by_exe || by_comm {
                    members.insert(Member {
                        pid,
                        flags: follow(true),
                    });
                }
            }
        }
        if let Some(cgroup) = &self.cgroup {
            for pid in cgroup_processes(cgroup)? {
                // A process in the cgroup forks into the cgroup.
                members.insert(Member {
                    pid,
                    flags: follow(false) | target_flags::FOLLOW_FORKS,
                });
            }
        }
        // Processes that follow forks take their descendants running now along: those are
        // forks too, only earlier ones.
        let parents = procfs::parent_pids();
        let followed: Vec<Member> = members
            .iter()
            .filter(|m| m.flags & target_flags::FOLLOW_FORKS != 0)
            .copied()
            .collect();
        for ancestor in followed {
            for pid in descendants(ancestor.pid, &parents) {
                members.insert(Member {
                    pid,
                    flags: ancestor.flags,
                });
            }
        }
        // The same process found twice keeps the widest flags.
        let mut merged: Vec<Member> = Vec::new();
        for member in members {
            match merged.last_mut() {
                Some(last) if last.pid == member.pid => last.flags |= member.flags,
                _ => merged.push(member),
            }
        }
        if merged.is_empty() && !self.can_grow() {
            bail!("no process matches {self}");
        }
        Ok(KernelTargets {
            single: self.single_pid(),
            // Processes that join (by file, name or cgroup) follow their forks, whether or
            // not one runs now.
            follow_forks: self.can_grow(),
            members: merged,
            exe,
            comm: self.comm_bytes(),
        })
    }
}

/// The descendants of `pid` among `(pid, parent)` pairs.
fn descendants(pid: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        for &(child, _) in parents.iter().filter(|(c, p)| *p == parent && *c != parent) {
            if !found.contains(&child) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

/// `name` as /proc/PID/comm shows it: at most 15 bytes.
fn truncated(name: &str) -> String {
    let mut end = name.len().min(COMM_LEN - 1);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// The processes in cgroup directory `path` and every cgroup below it (cgroup v1 or
/// v2: both list them in `cgroup.procs`).
pub(crate) fn cgroup_processes(path: &Path) -> Result<Vec<u32>> {
    let procs = path.join("cgroup.procs");
    if !procs.is_file() {
        bail!(
            "--cgroup {}: not a cgroup directory (no cgroup.procs); give a directory under \
             /sys/fs/cgroup, e.g. /sys/fs/cgroup/system.slice/NAME.service",
            path.display()
        );
    }
    let mut pids = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let text = std::fs::read_to_string(dir.join("cgroup.procs"))
            .with_context(|| format!("cannot read {}/cgroup.procs", dir.display()))?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// While a trace runs: adds the processes that joined the `--cgroup` since (the kernel
/// only sees forks), and ends the trace when every target has exited, for a set that
/// cannot get new members.
pub(crate) struct TargetTracker {
    spec: TargetSpec,
    targets: crate::kernel::TargetsMap,
    /// How many looks found each exited target: it leaves the set after
    /// [`LOOKS_BEFORE_LEAVING`], once the sampler has surely seen it go.
    exited_looks: std::collections::HashMap<u32, u32>,
    /// The targets that left the set, with the names they had: the last
    /// [`TargetTracker::keeping_exited`] of them.
    departed: std::collections::VecDeque<(u32, String)>,
    keep_departed: usize,
    /// How many left before those, by name.
    folded: std::collections::BTreeMap<String, u64>,
}

/// How many of the tracker's looks find a target exited before it leaves the set: so the
/// work of a look follows the processes that run, not every one that ever ran.
const LOOKS_BEFORE_LEAVING: u32 = 3;

/// How often the tracker looks.
const TRACK_PERIOD: Duration = Duration::from_millis(200);

impl TargetTracker {
    /// The tracker a set of processes needs (`None` for one process alone, or every
    /// process), with the processes of `spec` that started between [`TargetSpec::find`]
    /// and the kernel following forks and executions (from [`Loader::load`]) added.
    ///
    /// [`Loader::load`]: crate::kernel::Loader::load
    pub(crate) fn for_set<Maps>(
        spec: &TargetSpec,
        loader: &crate::kernel::Loader<Maps>,
    ) -> anyhow::Result<Option<Self>> {
        if spec.is_everything() || spec.single_pid().is_some() {
            return Ok(None);
        }
        let mut targets = loader.targets_map()?;
        let known = targets.pids();
        if let Ok(now) = spec.find() {
            let new: Vec<Member> = now
                .members
                .into_iter()
                .filter(|m| !known.contains(&m.pid))
                .collect();
            targets.add_members(&new)?;
        }
        Ok(Some(Self {
            spec: spec.clone(),
            targets,
            exited_looks: std::collections::HashMap::new(),
            departed: std::collections::VecDeque::new(),
            keep_departed: usize::MAX,
            folded: std::collections::BTreeMap::new(),
        }))
    }

    /// Names only the last `keep` processes that left the set; older ones are counted
    /// by name ([`TargetTracker::folded`]).
    pub(crate) fn keeping_exited(mut self, keep: usize) -> Self {
        self.keep_departed = keep;
        self
    }

    /// How many processes left the set before the last ones kept, by name.
    pub(crate) fn folded(&self) -> &std::collections::BTreeMap<String, u64> {
        &self.folded
    }

    /// Every process traced so far (some may have exited), with the name it had when
    /// it joined.
    pub(crate) fn named(&self) -> Vec<(u32, String)> {
        let mut named = self.targets.named();
        named.extend(self.departed.iter().cloned());
        named.sort();
        named.dedup();
        named
    }

    /// Takes out of the set the targets exited for [`LOOKS_BEFORE_LEAVING`] looks, and
    /// those no longer in the `--cgroup` (moved out of it): neither is traced any more.
    fn remove_departed(&mut self, in_cgroup: Option<&[u32]>) {
        let exited = self.targets.exited();
        let mut leaving = Vec::new();
        let mut still_exited = std::collections::HashMap::new();
        for (pid, name) in exited {
            let looks = self.exited_looks.get(&pid).copied().unwrap_or(0) + 1;
            if looks >= LOOKS_BEFORE_LEAVING {
                leaving.push((pid, name));
            } else {
                still_exited.insert(pid, looks);
            }
        }
        self.exited_looks = still_exited;
        if let (Some(members), Some(cgroup)) = (in_cgroup, &self.spec.cgroup) {
            let outside: Vec<(u32, String)> = self
                .targets
                .named()
                .into_iter()
                .filter(|(pid, _)| members.binary_search(pid).is_err())
                .filter(|(pid, _)| !self.exited_looks.contains_key(pid))
                .filter(|(pid, _)| !leaving.iter().any(|(p, _)| p == pid))
                .collect();
            // Read again after the set: a process forked into the cgroup since the first
            // reading is in the set, and in this one.
            if !outside.is_empty()
                && let Ok(members) = cgroup_processes(cgroup)
            {
                leaving.extend(
                    outside
                        .into_iter()
                        .filter(|(pid, _)| members.binary_search(pid).is_err()),
                );
            }
        }
        let pids: Vec<u32> = leaving.iter().map(|(pid, _)| *pid).collect();
        self.targets.remove(&pids);
        self.departed.extend(leaving);
        while self.departed.len() > self.keep_departed
            && let Some((_, name)) = self.departed.pop_front()
        {
            *self.folded.entry(name).or_default() += 1;
        }
    }

    /// Runs until every target has exited (when the set [ends with its
    /// processes](TargetSpec::ends_with_its_processes)), else forever.
    pub(crate) async fn run(&mut self) -> io::Result<StopReason> {
        let mut ticker = tokio::time::interval(TRACK_PERIOD);
        loop {
            ticker.tick().await;
            let in_cgroup = match &self.spec.cgroup {
                Some(cgroup) => cgroup_processes(cgroup).ok(),
                None => None,
            };
            if let Some(pids) = &in_cgroup {
                let known = self.targets.pids();
                let new: Vec<u32> = pids
                    .iter()
                    .copied()
                    .filter(|p| known.binary_search(p).is_err())
                    .collect();
                self.targets.add(&new, target_flags::FOLLOW_FORKS);
            }
            self.remove_departed(in_cgroup.as_deref());
            if self.spec.ends_with_its_processes() && !self.targets.any_alive() {
                return Ok(StopReason::TargetExited);
            }
        }
    }
}

/// Runs `tracker` ([`TargetTracker::run`]); without one, never finishes.
pub(crate) async fn track(tracker: Option<&mut TargetTracker>) -> io::Result<StopReason> {
    match tracker {
        Some(tracker) => tracker.run().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn one_pid_alone_is_compared_not_looked_up() {
        assert_eq!(TargetSpec::pid(pid(7)).single_pid(), Some(7));
        let children = TargetSpec {
            children: true,
            ..TargetSpec::pid(pid(7))
        };
        assert_eq!(children.single_pid(), None);
        let two = TargetSpec {
            pids: vec![pid(7), pid(8)],
            ..TargetSpec::default()
        };
        assert_eq!(two.single_pid(), None);
        assert!(two.ends_with_its_processes());
        assert!(!two.can_grow());
    }

    #[test]
    fn says_what_it_selects() {
        let spec = TargetSpec {
            pids: vec![pid(7), pid(8)],
            children: true,
            ..TargetSpec::default()
        };
        assert_eq!(
            spec.to_string(),
            "processes 7, 8 and the processes they fork"
        );
        let exe = TargetSpec {
            exe: Some("/usr/bin/python3.11".into()),
            ..TargetSpec::default()
        };
        assert_eq!(exe.to_string(), "every process running /usr/bin/python3.11");
        assert_eq!(exe.short_name(), "python3.11");
        assert!(!exe.ends_with_its_processes());
        assert_eq!(TargetSpec::default().to_string(), "every process");
    }

    #[test]
    fn a_comm_is_cut_to_what_the_kernel_keeps() {
        let spec = TargetSpec {
            comm: Some("a-very-long-process-name".into()),
            ..TargetSpec::default()
        };
        let bytes = spec.comm_bytes().unwrap();
        assert_eq!(&bytes[..15], b"a-very-long-pro");
        assert_eq!(bytes[15], 0);
        assert_eq!(truncated("a-very-long-process-name"), "a-very-long-pro");
    }

    #[test]
    fn finds_this_process_by_its_executable_and_its_name() {
        let exe = std::env::current_exe().unwrap();
        let me = std::process::id();
        let by_exe = TargetSpec {
            exe: Some(exe),
            ..TargetSpec::default()
        }
        .find()
        .unwrap();
        let member = by_exe.members.iter().find(|m| m.pid == me).unwrap();
        assert_eq!(
            member.flags,
            target_flags::FOLLOW_FORKS | target_flags::BY_MATCH
        );
        assert!(by_exe.exe.is_some() && by_exe.follow_forks);
        let name = procfs::read_name(Path::new("/proc/self/comm")).unwrap();
        let by_comm = TargetSpec {
            comm: Some(name),
            ..TargetSpec::default()
        }
        .find()
        .unwrap();
        assert!(by_comm.members.iter().any(|m| m.pid == me));
    }

    #[test]
    fn a_missing_pid_or_cgroup_is_an_error() {
        let err = TargetSpec::pid(pid(4_194_304)).find().unwrap_err();
        assert!(format!("{err:#}").contains("4194304"), "{err:#}");
        let err = TargetSpec {
            cgroup: Some("/tmp".into()),
            ..TargetSpec::default()
        }
        .find()
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("not a cgroup directory"),
            "{err:#}"
        );
    }

    #[test]
    fn descendants_are_found_through_their_parents() {
        let parents = [(2, 1), (3, 2), (4, 2), (5, 9), (6, 3)];
        let mut found = descendants(2, &parents);
        found.sort_unstable();
        assert_eq!(found, [3, 4, 6]);
    }

    #[test]
    fn with_children_the_processes_forked_before_are_taken_too() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let spec = TargetSpec {
            children: true,
            ..TargetSpec::pid(pid(std::process::id()))
        };
        let found = spec.find().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.members.iter().any(|m| m.pid == child.id()));
        assert!(found.follow_forks && found.single.is_none());
    }
}
