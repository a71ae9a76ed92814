//! Probe sites in objects mapped after the first attach (a library `dlopen`ed, a process
//! started later), found and attached while tracing, for `trace` and `attach` alike.
//!
//! The kernel records a traced process in `MAPPED_CODE` each time it maps memory
//! executable (a library its loader maps, room a JIT compiler maps for code) or starts a
//! program, and sends its tgid on a ring buffer, which wakes the tracer's loop
//! ([`held_notice`]). [`LateSites::look`] then attaches the new objects' probes: a
//! process that maps nothing new costs nothing, and the loop need not wake up to poll.
//! With `--hold-at-dlopen` the kernel also stops one process at its loader's
//! `_dl_debug_state` (SIGSTOP) and records it in `HELD`, so that the probes are attached
//! before any of the library's code runs, and the look continues it. A set has no such
//! uprobe: it would land in every process running that loader, on the whole machine.
//!
//! Where the kernel cannot tell of mappings (its tracepoints out of reach), the loader's
//! `_dl_debug_state` tells of one process's `dlopen`s and every [`SEARCH_PERIOD`] the
//! processes' maps are searched, for what was mapped otherwise.

use std::{
    collections::HashMap,
    ops::Range,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;
use tokio::io::unix::AsyncFd;

use crate::{
    kernel::{Loader, RecordRing},
    probe::plan::{ProbePlan, SiteInput, SiteMode},
    probe::runtimes::TaskProbeDef,
    probe::usdt,
    system::procfs::{self, ProcessError},
};

/// How often `HELD` and `MAPPED_CODE` are looked at where the kernel's notices cannot be
/// waited on: two map lookups per period.
pub(crate) const LOOK_PERIOD: Duration = Duration::from_millis(10);
/// How often the members that joined a set are looked at, and, where the kernel cannot
/// tell of mappings, the processes' maps are searched for objects mapped since. Waiting
/// on the kernel's notices, `HELD` and `MAPPED_CODE` are also looked at this often without
/// one, for a notice lost to a full ring.
pub(crate) const SEARCH_PERIOD: Duration = Duration::from_millis(100);
/// How long a look waits for a process the kernel held to have stopped (its SIGSTOP
/// takes effect on its way back to user space, a moment after the notice).
const STOP_WAIT: Duration = Duration::from_millis(20);

/// Waits until the kernel tells of a process newly held or seen mapping code, and empties the
/// ring of notices; never returns without the ring.
pub(crate) async fn held_notice(notices: &mut Option<AsyncFd<RecordRing>>) {
    let Some(ring) = notices.as_mut() else {
        return std::future::pending().await;
    };
    match ring.readable_mut().await {
        Ok(mut guard) => {
            // Cleared before the drain: a notice sent during it wakes the loop again.
            guard.clear_ready();
            guard.get_inner_mut().drain(|_| {});
        }
        Err(e) => {
            log::warn!("cannot wait for the kernel's notices of mapped code ({e}): polling");
            *notices = None;
        }
    }
}

/// How often a loop waiting on `notices` (see [`held_notice`]) looks without one.
pub(crate) fn look_period(notices: Option<&AsyncFd<RecordRing>>) -> Duration {
    match notices {
        Some(_) => SEARCH_PERIOD,
        None => LOOK_PERIOD,
    }
}

/// Whether `spec` searches the objects of processes (no path, or `*`) rather than files.
pub(crate) fn searches_processes(spec: &usdt::UsdtSpecifier) -> bool {
    spec.path.as_deref().is_none_or(|path| path == "*")
}

/// Whose maps are looked at for objects mapped later.
pub(crate) enum Members {
    One(u32),
    /// The kernel's set of targets.
    Set,
    /// Every process.
    Every,
}

/// What one look attached: the new sites, and the new unavailable arguments, as ranges
/// of the plan's lists.
#[derive(Debug, Default)]
pub(crate) struct Added {
    pub sites: Range<usize>,
    pub unavailable_args: Range<usize>,
    /// The processes whose mappings have changed: held at a `dlopen` and continued, or
    /// found mapping objects not searched before.
    pub remapped: Vec<u32>,
}

impl Added {
    pub(crate) fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }
}

/// The specifiers still looked for, and how their sites are planned.
pub(crate) struct LateSites {
    specs: Vec<usdt::UsdtSpecifier>,
    searched: usdt::Searched,
    mode: SiteMode,
    /// Task probes the plan gives roles to (`attach`'s runtimes), as at the start.
    tasks: Vec<TaskProbeDef>,
    pid: Option<u32>,
    members: Members,
    /// When the members were last searched (see [`SEARCH_PERIOD`]).
    searched_at: Option<Instant>,
    /// Passes over the catalogue's function sites in files with the runtime's USDT
    /// probes (`attach`).
    usdt_elsewhere: Option<crate::probe::runtimes::functions::UsdtElsewhere>,
    /// `--hold-at-dlopen`: the kernel stops the process at each `dlopen` while this runs.
    hold: bool,
    /// The kernel tells of the processes that map code or start programs (see
    /// [`LateSites::watch`]): their maps are not read otherwise.
    sees_mappings: bool,
    /// With `sees_mappings`, the members of a set looked at (or searched at the start),
    /// with their start times (0: not known): a process that joins is looked at once.
    known_members: HashMap<u32, u64>,
    /// The kernel's notices of processes to look at, until the loop takes them.
    notices: Option<RecordRing>,
}

impl LateSites {
    /// `searched`: the objects already searched (their sites are planned).
    pub(crate) fn new(
        specs: Vec<usdt::UsdtSpecifier>,
        searched: usdt::Searched,
        mode: SiteMode,
        tasks: Vec<TaskProbeDef>,
        pid: Option<u32>,
        members: Members,
    ) -> Self {
        LateSites {
            specs,
            searched,
            mode,
            tasks,
            pid,
            members,
            searched_at: None,
            usdt_elsewhere: None,
            hold: false,
            sees_mappings: false,
            known_members: HashMap::new(),
            notices: None,
        }
    }

    /// Keeps the kernel stopping the process at each `dlopen` (see [`hold_at_dlopen`]).
    pub(crate) fn holding(mut self, hold: bool) -> Self {
        self.hold = hold;
        self
    }

    /// Leaves out the function sites of runtimes whose files have USDT probes.
    pub(crate) fn keeping(
        mut self,
        usdt_elsewhere: crate::probe::runtimes::functions::UsdtElsewhere,
    ) -> Self {
        self.usdt_elsewhere = Some(usdt_elsewhere);
        self
    }

    /// Sets up how the objects mapped later are found: the kernel's events of traced
    /// processes mapping code, when it can tell them; for one process, a uprobe at its
    /// loader's `_dl_debug_state` (the loaders of `exes`, see [`hold_at_dlopen`]) when it
    /// is to be held there or no event tells. `members`: the processes searched at the
    /// start.
    pub(crate) fn watch<Maps>(
        &mut self,
        loader: &mut Loader<Maps>,
        exes: Vec<(PathBuf, PathBuf)>,
        members: &[u32],
    ) -> Result<()> {
        match loader.watch_code_mappings() {
            Ok(()) => {
                self.sees_mappings = true;
                self.known_members = members.iter().map(|&pid| (pid, 0)).collect();
            }
            Err(e) => log::warn!(
                "cannot watch for code mapped later ({e}): the processes' maps are searched \
                 every {} ms instead",
                SEARCH_PERIOD.as_millis()
            ),
        }
        if self.hold || !self.sees_mappings {
            hold_at_dlopen(loader, exes, self.pid, self.hold)?;
        }
        match loader.take_held_notices() {
            Ok(ring) => self.notices = Some(ring),
            Err(e) => log::warn!(
                "cannot wait for the kernel's notices of mapped code ({e}): looking every {} ms",
                LOOK_PERIOD.as_millis()
            ),
        }
        Ok(())
    }

    /// The kernel's notices of processes to look at, for the loop to wait on with
    /// [`held_notice`] (once; call it in the loop's runtime).
    pub(crate) fn take_notices(&mut self) -> Option<AsyncFd<RecordRing>> {
        let ring = self.notices.take()?;
        match ring.into_async() {
            Ok(ring) => Some(ring),
            Err(e) => {
                log::warn!(
                    "cannot wait for the kernel's notices of mapped code ({e}): looking \
                     every {} ms",
                    LOOK_PERIOD.as_millis()
                );
                None
            }
        }
    }

    /// Whether the kernel tells of the processes that map code (see [`LateSites::watch`]).
    pub(crate) fn sees_mappings(&self) -> bool {
        self.sees_mappings
    }

    /// Looks at the processes the kernel recorded (continuing those it held once their
    /// new objects' probes are attached) and, every [`SEARCH_PERIOD`], at the members
    /// that joined (or, without the kernel's events, at every member); returns what was
    /// added to `plan` (and attached). `told`: a notice came, or the loop cannot wait on
    /// them; else the kernel's records are read only every [`SEARCH_PERIOD`]. A failure
    /// is a warning: tracing what is attached goes on.
    pub(crate) fn look(&mut self, loader: &mut Loader, plan: &mut ProbePlan, told: bool) -> Added {
        let first_site = plan.sites.len();
        let first_unavailable = plan.unavailable_args.len();
        let mut remapped = Vec::new();
        let search = self
            .searched_at
            .is_none_or(|at| at.elapsed() >= SEARCH_PERIOD);
        let held = if told || search {
            loader.held()
        } else {
            Vec::new()
        };
        for (pid, what) in held {
            let stopped = what == tracer_common::held::STOPPED;
            // Continued before its SIGSTOP took effect, it would stay stopped.
            if stopped && !wait_until_stopped(pid, Instant::now() + STOP_WAIT) {
                continue;
            }
            if !stopped {
                // Before the look: what it maps meanwhile is recorded anew, not lost.
                loader.release_held(pid, what);
            }
            self.look_at(pid, loader, plan);
            if stopped {
                loader.release_held(pid, what);
                continue_process(pid);
            }
            if !remapped.contains(&pid) {
                remapped.push(pid);
            }
        }
        if !search {
            return Added {
                sites: first_site..plan.sites.len(),
                unavailable_args: first_unavailable..plan.unavailable_args.len(),
                remapped,
            };
        }
        self.searched_at = Some(Instant::now());
        if self.hold {
            keep_holding(loader);
        }
        if self.sees_mappings {
            for pid in self.joined(loader) {
                if self.look_at(pid, loader, plan) && !remapped.contains(&pid) {
                    remapped.push(pid);
                }
            }
        } else {
            let pids = match self.members {
                Members::One(pid) => vec![pid],
                Members::Set => loader
                    .targets_map()
                    .map(|t| t.running_pids())
                    .unwrap_or_default(),
                Members::Every => procfs::all_processes(),
            };
            for pid in pids {
                if self.look_at(pid, loader, plan) && !remapped.contains(&pid) {
                    remapped.push(pid);
                }
            }
        }
        Added {
            sites: first_site..plan.sites.len(),
            unavailable_args: first_unavailable..plan.unavailable_args.len(),
            remapped,
        }
    }

    /// The members of a set not looked at yet that run a program of their own: a process
    /// forked from a member maps what that member maps (searched already) until it starts
    /// a program, which the kernel tells of.
    fn joined(&mut self, loader: &Loader) -> Vec<u32> {
        let Members::Set = self.members else {
            return Vec::new();
        };
        let Ok(targets) = loader.targets_map() else {
            return Vec::new();
        };
        let members = targets.entries();
        self.known_members
            .retain(|pid, _| members.iter().any(|(member, _)| member == pid));
        let mut joined = Vec::new();
        for (pid, target) in members {
            let start = target.start_ticks;
            match self.known_members.insert(pid, start) {
                Some(known) if known == 0 || known == start => {}
                _ if target.forked_from != 0 => {}
                _ => joined.push(pid),
            }
        }
        joined
    }

    /// Attaches the probes of the objects `pid` maps that were not searched yet; true
    /// when there were such objects.
    fn look_at(&mut self, pid: u32, loader: &mut Loader, plan: &mut ProbePlan) -> bool {
        let searched_before = self.searched.count();
        let (mut sites, skipped) = usdt::find_new(&self.specs, pid, &mut self.searched);
        let mapped_new = self.searched.count() > searched_before;
        for skipped in &skipped {
            log::warn!("skipped a probe site: {skipped}");
        }
        if let Some(keep) = self.usdt_elsewhere.as_mut() {
            sites.retain(|site| keep.keep(site));
        }
        if !sites.is_empty()
            && let Err(e) = self.attach(&sites, loader, plan)
        {
            log::warn!("cannot attach the probes found later in process {pid}: {e:#}");
        }
        mapped_new
    }

    /// Continues every process still held, once the kernel holds no more (recording
    /// stopped), waiting up to a second in all for them to have stopped.
    pub(crate) fn release_all(&mut self, loader: &mut Loader) {
        let deadline = Instant::now() + Duration::from_secs(1);
        for (pid, what) in loader.held() {
            if what != tracer_common::held::STOPPED {
                loader.release_held(pid, what);
                continue;
            }
            wait_until_stopped(pid, deadline);
            loader.release_held(pid, what);
            continue_process(pid);
        }
    }

    fn attach(
        &mut self,
        sites: &[usdt::ProbeSite],
        loader: &mut Loader,
        plan: &mut ProbePlan,
    ) -> Result<()> {
        let inputs = sites
            .iter()
            .map(SiteInput::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let added = plan.add(&inputs, &self.tasks, self.mode, self.pid)?;
        loader.attach_more_usdt_sites(&plan.usdt_sites_in(added.clone()))?;
        log::info!("attached {} more sites", added.len());
        Ok(())
    }
}

/// Sends SIGCONT to a process the kernel stopped for us.
fn continue_process(pid: u32) {
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

/// How far ahead the kernel is told to keep stopping processes at `dlopen`: a tracer
/// that dies stops none after this.
const HOLD_AHEAD_S: u64 = 2;

/// Whether process `pid` has stopped (or is gone) by `deadline`, looked at every 50 µs.
fn wait_until_stopped(pid: u32, deadline: Instant) -> bool {
    loop {
        if procfs::is_stopped(pid) || ProcessError::check(pid).is_some() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Tells the kernel to go on stopping the process at `dlopen` for [`HOLD_AHEAD_S`].
fn keep_holding<Maps>(loader: &mut Loader<Maps>) {
    let now_s = crate::system::stop::monotonic_ns() / 1_000_000_000;
    if let Err(e) = loader.hold_until((now_s + HOLD_AHEAD_S) as u32) {
        log::warn!("cannot keep holding the process at dlopen: {e:#}");
    }
}

/// Has the kernel tell when process `single` has mapped a library (`dlopen`), for its
/// probes to be attached at once, and with `hold` stop it until they are, so that none of
/// its code runs before: the loaders of `exes`, each an executable and the root its
/// loader's path is under. A set of processes gets no such uprobe: it would land in every
/// process on the machine that runs the same loader.
fn hold_at_dlopen<Maps>(
    loader: &mut Loader<Maps>,
    exes: Vec<(PathBuf, PathBuf)>,
    single: Option<u32>,
    hold: bool,
) -> Result<()> {
    if single.is_none() {
        return Ok(());
    }
    if hold {
        keep_holding(loader);
    }
    let mut loaders: Vec<PathBuf> = Vec::new();
    for (exe, root) in exes {
        let Some(interp) = usdt::interpreter(&exe) else {
            continue;
        };
        let path = root.join(interp.strip_prefix("/").unwrap_or(&interp));
        if let Ok(path) = std::fs::canonicalize(&path)
            && !loaders.contains(&path)
        {
            loaders.push(path);
        }
    }
    for path in loaders {
        match usdt::dl_debug_state_offset(&path) {
            Some(offset) => loader.hold_at_dlopen(&path, offset, single)?,
            None => log::warn!(
                "{}: no _dl_debug_state: a library loaded later is found within {} ms, \
                 and its first hits may be missed",
                path.display(),
                SEARCH_PERIOD.as_millis()
            ),
        }
    }
    Ok(())
}

/// The executables of `pids` (and `exe`, the `--exe` file), each with the root its loader's
/// path is under, for [`hold_at_dlopen`].
pub(crate) fn executables_of(
    pids: &[u32],
    exe: Option<&std::path::Path>,
) -> Vec<(PathBuf, PathBuf)> {
    pids.iter()
        .map(|pid| {
            (
                PathBuf::from(format!("/proc/{pid}/exe")),
                PathBuf::from(format!("/proc/{pid}/root")),
            )
        })
        .chain(exe.map(|e| (e.to_path_buf(), PathBuf::from("/"))))
        .collect()
}
