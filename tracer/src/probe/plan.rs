//! Turns discovered USDT sites and the measurements asked for into what the kernel gets:
//! one `UsdtSite` per attached site (its index is the uprobe's BPF cookie), probe ids for
//! hit counts and events, and latency ids for begin/end pairs. Pure: no kernel access.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use thiserror::Error;
use tracer_common::{
    MAX_LATENCIES, MAX_LATENCIES_PER_PROBE, MAX_PROBES, MAX_STR_ARGS, MAX_USDT_ARGS,
    MAX_USDT_SITES, TASK_IS_THREAD, UsdtSite, site_flags,
};

use crate::{
    kernel::{PlanSizes, UsdtAttachment},
    probe::runtimes::{ClassValue, LatencyDef, TaskProbeDef, TaskRole},
    probe::usdt::{Glob, ProbeKind, SiteArg},
};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("too many probe sites ({0}); at most {MAX_USDT_SITES} can be attached at once")]
    TooManySites(usize),
    #[error("too many distinct probes ({0}); at most {MAX_PROBES}")]
    TooManyProbes(usize),
    #[error("too many latencies ({0}); at most {MAX_LATENCIES}")]
    TooManyLatencies(usize),
    #[error("probe {0} takes part in more than {MAX_LATENCIES_PER_PROBE} latencies")]
    TooManyRoles(String),
    #[error("probe {probe}: {reason}")]
    BadArguments { probe: String, reason: String },
    #[error("--str {request}: no probe traced is named so (traced: {traced})")]
    StringOfNoProbe { request: String, traced: String },
    #[error("--str {request}: {probe} has {count} argument{}, no arg{index}", plural(*.count))]
    StringOfNoArgument {
        request: String,
        probe: String,
        count: usize,
        index: u8,
    },
    #[error("--str {request}: arg{index} of {probe} is {what}, not a pointer")]
    StringNotAPointer {
        request: String,
        probe: String,
        index: u8,
        what: String,
    },
    #[error("{probe}: more than {MAX_STR_ARGS} arguments asked for as strings")]
    TooManyStrings { probe: String },
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// An argument to show as a string (`trace --str`): of the probes named so (every one
/// when `provider` and `name` are `*`), at most `max_len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringRequest {
    /// As given on the command line, for errors.
    pub text: String,
    pub provider: String,
    pub name: String,
    pub arg: u8,
    pub max_len: u16,
}

/// One probe site found in a binary, ready to attach.
#[derive(Debug, Clone)]
pub struct SiteInput {
    /// The binary as the target sees it (for display: `usdt:PATH:provider:name`).
    pub path: PathBuf,
    /// The binary as this process opens it (through /proc/PID/root).
    pub attach_path: PathBuf,
    /// A note's site, or a function's entry or return.
    pub kind: ProbeKind,
    /// Empty for a function probe.
    pub provider: String,
    /// The probe's name, or the function's symbol (with `+N` past its entry).
    pub name: String,
    pub file_offset: u64,
    pub semaphore_offset: Option<u64>,
    /// Decoded argument specs, each ready or unavailable with why; or why the whole spec
    /// could not be decoded.
    pub args: Result<Vec<SiteArg>, String>,
}

/// A probe (provider:name in one binary); all its sites share its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeInfo {
    pub path: PathBuf,
    pub kind: ProbeKind,
    pub provider: String,
    pub name: String,
    pub arg_count: usize,
    pub site_count: usize,
}

impl ProbeInfo {
    /// bpftrace's spelling of the probe.
    pub fn specifier(&self) -> String {
        match self.kind {
            ProbeKind::Usdt => format!(
                "usdt:{}:{}:{}",
                self.path.display(),
                self.provider,
                self.name
            ),
            kind => format!("{kind}:{}:{}", self.path.display(), self.name),
        }
    }

    /// How the probe is named where no path is needed: `provider:name`, or the
    /// function probe's type and symbol.
    pub fn short_name(&self) -> String {
        match self.kind {
            ProbeKind::Usdt => format!("{}:{}", self.provider, self.name),
            kind => format!("{kind}:{}", self.name),
        }
    }
}

/// What to do at sites beyond the latencies they take part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteMode {
    /// Attach only sites that begin or end a latency (`attach`).
    LatenciesOnly,
    /// Attach every site and count its hits (`trace --count`).
    Count,
    /// Attach every site and send each hit with its arguments (`trace`).
    Events,
}

/// One site to attach, with what the eBPF program does when it fires.
#[derive(Debug, Clone)]
pub struct PlannedSite {
    pub attachment: UsdtAttachment,
    pub site: UsdtSite,
}

/// An argument of a probe that cannot be decoded at some of its sites: its events show
/// it as unavailable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnavailableArg {
    pub probe_id: u32,
    /// 0-based.
    pub index: usize,
    /// The argument's text and why it cannot be read.
    pub reason: String,
}

/// What one probe is, as [`ProbeInfo`] tells it: its sites share its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProbeKey {
    path: PathBuf,
    kind: ProbeKind,
    provider: String,
    name: String,
}

impl ProbeKey {
    fn of_probe(probe: &ProbeInfo) -> Self {
        Self {
            path: probe.path.clone(),
            kind: probe.kind,
            provider: probe.provider.clone(),
            name: probe.name.clone(),
        }
    }

    fn of_site(input: &SiteInput) -> Self {
        Self {
            path: input.path.clone(),
            kind: input.kind,
            provider: input.provider.clone(),
            name: input.name.clone(),
        }
    }
}

/// The parts a site takes in the latencies and tasks measured.
struct SiteRoles<'a> {
    /// Ids of the latencies it begins.
    begins: Vec<u32>,
    /// Ids of the latencies it ends.
    ends: Vec<u32>,
    /// The latency open on its thread that it classifies, and with what.
    classifies: Option<(usize, ClassValue)>,
    task: Option<&'a TaskProbeDef>,
}

impl<'a> SiteRoles<'a> {
    fn of(input: &SiteInput, latencies: &[LatencyDef], tasks: &'a [TaskProbeDef]) -> Self {
        let roles = |pick: fn(&LatencyDef) -> &crate::probe::runtimes::ProbeRef| -> Vec<u32> {
            latencies
                .iter()
                .enumerate()
                .filter(|(_, l)| pick(l).is(input.kind, &input.provider, &input.name))
                .map(|(i, _)| i as u32)
                .collect()
        };
        // A probe that classifies a latency open on its thread (V8's collector).
        let classifies = latencies.iter().enumerate().find_map(|(i, l)| {
            let probes = l.class.as_ref().map(|c| c.probes.as_slice()).unwrap_or(&[]);
            probes
                .iter()
                .find(|(probe, _)| probe.is(input.kind, &input.provider, &input.name))
                .map(|(_, value)| (i, *value))
        });
        let task = (input.kind == ProbeKind::Usdt)
            .then(|| {
                tasks
                    .iter()
                    .find(|t| t.provider == input.provider && t.name == input.name)
            })
            .flatten();
        Self {
            begins: roles(|l| &l.begin),
            ends: roles(|l| &l.end),
            classifies,
            task,
        }
    }

    /// It takes no part: `attach` leaves it out.
    fn is_none(&self) -> bool {
        self.begins.is_empty()
            && self.ends.is_empty()
            && self.classifies.is_none()
            && self.task.is_none()
    }
}

/// Everything to attach, indexed the way the kernel side indexes it.
#[derive(Debug, Default)]
pub struct ProbePlan {
    /// Indexed by probe id.
    pub probes: Vec<ProbeInfo>,
    /// Indexed by latency id.
    pub latencies: Vec<LatencyDef>,
    /// Indexed by BPF cookie.
    pub sites: Vec<PlannedSite>,
    /// Arguments of attached sites that events cannot show, once per probe, argument
    /// and reason.
    pub unavailable_args: Vec<UnavailableArg>,
    /// What every site takes, those planned later too: stacks ([`site_flags`] bits) and
    /// string arguments (`trace --stack`, `--str`).
    stack_flags: u8,
    string_requests: Vec<StringRequest>,
}

impl ProbePlan {
    /// How many sites, probes and latencies the kernel's arrays must hold.
    pub fn sizes(&self) -> PlanSizes {
        PlanSizes {
            sites: self.sites.len() as u32,
            probes: self.probes.len() as u32,
            latencies: self.latencies.len() as u32,
        }
    }

    /// Every site with its BPF cookie, as `Loader::attach_usdt_sites` takes them.
    pub fn usdt_sites(&self) -> Vec<(u32, &UsdtSite, &UsdtAttachment)> {
        self.usdt_sites_in(0..self.sites.len())
    }

    /// The sites of `cookies` (what [`ProbePlan::add`] returned), as
    /// [`ProbePlan::usdt_sites`] gives them.
    pub fn usdt_sites_in(
        &self,
        cookies: std::ops::Range<usize>,
    ) -> Vec<(u32, &UsdtSite, &UsdtAttachment)> {
        self.sites[cookies.clone()]
            .iter()
            .zip(cookies)
            .map(|(planned, cookie)| (cookie as u32, &planned.site, &planned.attachment))
            .collect()
    }

    /// Every site takes the user and kernel stacks of its hits (`trace --stack`): into
    /// its events, or counted by stack.
    pub fn take_stacks(&mut self) {
        self.stack_flags = site_flags::STACKS;
        self.apply_stacks(0);
    }

    /// [`ProbePlan::take_stacks`], user stacks as snapshots for DWARF unwinding (events
    /// only).
    pub fn take_stack_snapshots(&mut self) {
        self.stack_flags = site_flags::STACKS | site_flags::STACK_SNAPSHOT;
        self.apply_stacks(0);
    }

    fn apply_stacks(&mut self, first_site: usize) {
        for planned in &mut self.sites[first_site..] {
            planned.site.flags |= self.stack_flags;
        }
    }

    /// What the kernel's arrays must hold when sites may be added while tracing: as many
    /// sites and probes as can ever be attached.
    pub fn room_to_grow(&self) -> PlanSizes {
        PlanSizes {
            sites: MAX_USDT_SITES,
            probes: MAX_PROBES,
            latencies: self.latencies.len() as u32,
        }
    }

    /// Where each site's uprobe goes, in the order of [`ProbePlan::usdt_sites`].
    pub fn attachments(&self) -> Vec<UsdtAttachment> {
        self.sites.iter().map(|p| p.attachment.clone()).collect()
    }

    /// Plans `sites` for process `pid` (or every process when `None`); `mode` says which
    /// sites beyond the latencies' are attached and whether hits become events.
    pub fn build(
        sites: &[SiteInput],
        latencies: &[LatencyDef],
        tasks: &[TaskProbeDef],
        mode: SiteMode,
        pid: Option<u32>,
    ) -> Result<Self, PlanError> {
        if latencies.len() > MAX_LATENCIES as usize {
            return Err(PlanError::TooManyLatencies(latencies.len()));
        }
        let mut plan = ProbePlan {
            latencies: latencies.to_vec(),
            ..Default::default()
        };
        plan.add(sites, tasks, mode, pid)?;
        Ok(plan)
    }

    /// Plans more sites (found after the first attach: a library mapped later, a new
    /// process's files) after those planned already, with the same latencies. Their
    /// cookies follow the existing ones; on error the plan is left as it was.
    pub fn add(
        &mut self,
        sites: &[SiteInput],
        tasks: &[TaskProbeDef],
        mode: SiteMode,
        pid: Option<u32>,
    ) -> Result<std::ops::Range<usize>, PlanError> {
        let (first_site, first_probe, first_unavailable) = (
            self.sites.len(),
            self.probes.len(),
            self.unavailable_args.len(),
        );
        let result = self.add_sites(sites, tasks, mode, pid).and_then(|()| {
            // What the first sites take, these do too; a string asked for of probes
            // none of these is may match later ones still.
            self.apply_stacks(first_site);
            let requests = std::mem::take(&mut self.string_requests);
            let strings = self.apply_strings(&requests, first_site, false);
            self.string_requests = requests;
            strings
        });
        if result.is_err() {
            self.sites.truncate(first_site);
            self.probes.truncate(first_probe);
            self.unavailable_args.truncate(first_unavailable);
            for probe in &mut self.probes {
                probe.site_count = 0;
            }
            for planned in &self.sites {
                self.probes[planned.site.probe_id as usize].site_count += 1;
            }
        }
        result.map(|()| first_site..self.sites.len())
    }

    fn add_sites(
        &mut self,
        sites: &[SiteInput],
        tasks: &[TaskProbeDef],
        mode: SiteMode,
        pid: Option<u32>,
    ) -> Result<(), PlanError> {
        let latencies = &self.latencies.clone();
        // Counted before any work per site, so that a file of 100,000 notes fails at once.
        let attached = match mode {
            SiteMode::LatenciesOnly => sites
                .iter()
                .filter(|input| !SiteRoles::of(input, latencies, tasks).is_none())
                .count(),
            SiteMode::Count | SiteMode::Events => sites.len(),
        };
        let planned = self.sites.len() + attached;
        if planned > MAX_USDT_SITES as usize {
            return Err(PlanError::TooManySites(planned));
        }
        let plan = self;
        // Each probe's id and each unavailable argument by value: a search of the lists
        // for every site made many sites take quadratic time.
        let mut probe_ids: HashMap<ProbeKey, u32> = plan
            .probes
            .iter()
            .enumerate()
            .map(|(id, probe)| (ProbeKey::of_probe(probe), id as u32))
            .collect();
        let mut unavailable_seen: HashSet<UnavailableArg> =
            plan.unavailable_args.iter().cloned().collect();
        for input in sites {
            let roles = SiteRoles::of(input, latencies, tasks);
            if mode == SiteMode::LatenciesOnly && roles.is_none() {
                continue;
            }
            let SiteRoles {
                begins,
                ends,
                classifies,
                task,
            } = roles;
            let emit_events = mode == SiteMode::Events;
            let probe_label = || match input.kind {
                ProbeKind::Usdt => {
                    format!("{}:{}:{}", input.path.display(), input.provider, input.name)
                }
                kind => format!("{kind}:{}:{}", input.path.display(), input.name),
            };
            if begins.len() > MAX_LATENCIES_PER_PROBE || ends.len() > MAX_LATENCIES_PER_PROBE {
                return Err(PlanError::TooManyRoles(probe_label()));
            }
            // Arguments matter only for events and task ids; a latency probe with an odd
            // spec still works.
            let args: &[SiteArg] = match (&input.args, emit_events) {
                (Ok(args), _) => args,
                (Err(reason), _) if emit_events || task.is_some_and(|t| t.task_arg.is_some()) => {
                    return Err(PlanError::BadArguments {
                        probe: probe_label(),
                        reason: reason.clone(),
                    });
                }
                (Err(_), _) => &[],
            };
            let task_flag = match task.map(|t| t.role) {
                Some(TaskRole::Run) => site_flags::TASK_RUN,
                Some(TaskRole::Pause) => site_flags::TASK_PAUSE,
                Some(TaskRole::Finish) => site_flags::TASK_FINISH,
                Some(TaskRole::Name { .. }) => site_flags::TASK_NAME,
                None => 0,
            };
            let task_name_arg = match task.map(|t| t.role) {
                Some(TaskRole::Name { name_arg }) => name_arg,
                _ => 0,
            };
            let task_arg = match task.and_then(|t| t.task_arg) {
                Some(index) => match args.get(index as usize) {
                    Some(Ok(_)) => index,
                    Some(Err(why)) => {
                        return Err(PlanError::BadArguments {
                            probe: probe_label(),
                            reason: format!("the task argument is unavailable: {why}"),
                        });
                    }
                    None => {
                        let reason = "the task probe has no task argument".into();
                        return Err(PlanError::BadArguments {
                            probe: probe_label(),
                            reason,
                        });
                    }
                },
                None => TASK_IS_THREAD,
            };
            let event_flag = if emit_events {
                site_flags::EMIT_EVENT
            } else {
                0
            };
            let return_flag = match input.kind {
                ProbeKind::Uretprobe => site_flags::RETURN_PROBE,
                _ => 0,
            };
            let mut latency_frames = 0u8;
            for (i, &id) in begins.iter().enumerate() {
                if latencies[id as usize].frame_keyed {
                    latency_frames |= 1 << i;
                }
            }
            for (i, &id) in ends.iter().enumerate() {
                if latencies[id as usize].frame_keyed {
                    latency_frames |= 16 << i;
                }
            }
            // The argument that classifies what this site begins, or the open latency it
            // classifies; 1 + the index, 0 for none.
            let begin_class = begins.iter().find_map(|&id| {
                latencies[id as usize]
                    .class
                    .as_ref()
                    .and_then(|c| c.begin_arg)
            });
            // A class of the probe's own is a constant in the last argument slot, past
            // those events show.
            let mut class_constant = None;
            let (class_arg, class_latency) = match (classifies, begin_class) {
                (Some((latency, value)), _) => {
                    let innermost = match latencies[latency].frame_keyed {
                        true => tracer_common::CLASSIFIES_INNERMOST,
                        false => 0,
                    };
                    let arg = match value {
                        ClassValue::Arg(arg) => arg,
                        ClassValue::Const(class) => {
                            class_constant = Some(class);
                            MAX_USDT_ARGS as u8 - 1
                        }
                    };
                    (arg + 1, (latency as u8 + 1) | innermost)
                }
                (None, Some(arg)) => (arg + 1, 0),
                (None, None) => (0, 0),
            };
            // Begins of frame-keyed latencies another probe classifies note their frame.
            let mut latency_innermost = 0u8;
            for (i, &id) in begins.iter().enumerate() {
                let latency = &latencies[id as usize];
                if latency.frame_keyed
                    && latency.class.as_ref().is_some_and(|c| !c.probes.is_empty())
                {
                    latency_innermost |= 1 << i;
                }
            }
            if class_constant.is_none()
                && class_arg > 0
                && !matches!(args.get(class_arg as usize - 1), Some(Ok(_)))
            {
                return Err(PlanError::BadArguments {
                    probe: probe_label(),
                    reason: format!(
                        "arg{} classifies a latency, and the probe does not have it",
                        class_arg - 1
                    ),
                });
            }
            let probe_id = plan.probe_id(&mut probe_ids, input, args.len());
            let mut site = UsdtSite {
                probe_id,
                arg_count: args.len().min(MAX_USDT_ARGS) as u8,
                flags: event_flag | task_flag | return_flag,
                task_arg,
                task_name_arg,
                latency_begin_count: begins.len() as u8,
                latency_end_count: ends.len() as u8,
                latency_frames,
                class_arg,
                class_latency,
                latency_innermost,
                ..Default::default()
            };
            for (i, arg) in args.iter().take(MAX_USDT_ARGS).enumerate() {
                match arg {
                    Ok(arg) => site.args[i] = *arg,
                    Err(why) => {
                        // Kind 0 reads as 0; the bit tells user space it means nothing.
                        site.unavailable |= 1 << i;
                        let unavailable = UnavailableArg {
                            probe_id,
                            index: i,
                            reason: why.clone(),
                        };
                        if emit_events && unavailable_seen.insert(unavailable.clone()) {
                            plan.unavailable_args.push(unavailable);
                        }
                    }
                }
            }
            if let Some(class) = class_constant {
                site.args[MAX_USDT_ARGS - 1] = tracer_common::UsdtArg {
                    kind: tracer_common::arg_kind::CONST,
                    val_off: class as _,
                    size: 4,
                    ..Default::default()
                };
            }
            site.latency_begins[..begins.len()].copy_from_slice(&begins);
            site.latency_ends[..ends.len()].copy_from_slice(&ends);
            plan.sites.push(PlannedSite {
                attachment: UsdtAttachment {
                    path: input.attach_path.clone(),
                    offset: input.file_offset,
                    semaphore_offset: input.semaphore_offset,
                    pid,
                    ret: input.kind == ProbeKind::Uretprobe,
                },
                site,
            });
        }
        if plan.probes.len() > MAX_PROBES as usize {
            return Err(PlanError::TooManyProbes(plan.probes.len()));
        }
        Ok(())
    }

    /// Makes the sites of the probes `requests` name read those arguments as strings at
    /// each hit; a later request for the same argument of a probe replaces an earlier
    /// one. A request that names no probe, or an argument a probe lacks or that cannot
    /// hold a pointer, is an error.
    pub fn show_strings(&mut self, requests: &[StringRequest]) -> Result<(), PlanError> {
        // With no probe found yet (they may come in a library loaded later), the requests
        // wait for them.
        let strict = !self.probes.is_empty();
        self.apply_strings(requests, 0, strict)?;
        self.string_requests = requests.to_vec();
        Ok(())
    }

    /// Sets the string arguments `requests` ask for in the sites from `first_site`;
    /// `strict`: a request that matches no probe is an error.
    fn apply_strings(
        &mut self,
        requests: &[StringRequest],
        first_site: usize,
        strict: bool,
    ) -> Result<(), PlanError> {
        // Each probe's (argument, length, index of the request that asked).
        let mut per_probe: Vec<Vec<(u8, u16, usize)>> = vec![Vec::new(); self.probes.len()];
        for (which, request) in requests.iter().enumerate() {
            let (provider, name) = (Glob::new(&request.provider), Glob::new(&request.name));
            let matched: Vec<usize> = (0..self.probes.len())
                .filter(|&id| {
                    let probe = &self.probes[id];
                    provider.matches(&probe.provider) && name.matches(&probe.name)
                })
                .collect();
            if matched.is_empty() && strict {
                let traced: Vec<String> = self
                    .probes
                    .iter()
                    .map(|p| format!("{}:{}", p.provider, p.name))
                    .collect();
                return Err(PlanError::StringOfNoProbe {
                    request: request.text.clone(),
                    traced: traced.join(", "),
                });
            }
            for id in matched {
                let probe = &self.probes[id];
                if request.arg as usize >= probe.arg_count {
                    let error = PlanError::StringOfNoArgument {
                        request: request.text.clone(),
                        probe: probe.specifier(),
                        count: probe.arg_count,
                        index: request.arg,
                    };
                    // A probe found later that a wildcard request does not fit keeps its
                    // sites, without that string.
                    if strict {
                        return Err(error);
                    }
                    log::warn!("{error}: not shown");
                    continue;
                }
                let strings = &mut per_probe[id];
                match strings.iter_mut().find(|(arg, _, _)| *arg == request.arg) {
                    Some(existing) => *existing = (request.arg, request.max_len, which),
                    None => strings.push((request.arg, request.max_len, which)),
                }
                if strings.len() > MAX_STR_ARGS {
                    return Err(PlanError::TooManyStrings {
                        probe: probe.specifier(),
                    });
                }
            }
        }
        for planned in &mut self.sites[first_site..] {
            let site = &mut planned.site;
            let strings = &per_probe[site.probe_id as usize];
            let mut shown = 0;
            for &(arg, max_len, which) in strings {
                let spec = &site.args[arg as usize];
                // An undecodable argument reads as 0, so as unavailable: no error.
                let decoded = site.unavailable & (1 << arg) == 0;
                if decoded && (spec.size != 8 || spec.float != 0) {
                    let kind = if spec.float != 0 { "float" } else { "integer" };
                    let error = PlanError::StringNotAPointer {
                        request: requests[which].text.clone(),
                        probe: self.probes[site.probe_id as usize].specifier(),
                        index: arg,
                        what: format!("a {}-byte {kind}", spec.size),
                    };
                    if strict {
                        return Err(error);
                    }
                    log::warn!("{error}: not shown");
                    continue;
                }
                site.str_args[shown] = arg;
                site.str_max[shown] = max_len;
                shown += 1;
            }
            site.str_count = shown as u8;
        }
        Ok(())
    }

    /// The id of the probe `input` is a site of (new if `ids`, every probe's id by
    /// value, has none), its site counted.
    fn probe_id(
        &mut self,
        ids: &mut HashMap<ProbeKey, u32>,
        input: &SiteInput,
        arg_count: usize,
    ) -> u32 {
        let next_id = self.probes.len() as u32;
        let id = *ids.entry(ProbeKey::of_site(input)).or_insert(next_id);
        if id == next_id {
            self.probes.push(ProbeInfo {
                path: input.path.clone(),
                kind: input.kind,
                provider: input.provider.clone(),
                name: input.name.clone(),
                arg_count,
                site_count: 0,
            });
        }
        self.probes[id as usize].site_count += 1;
        id
    }

    /// Ids of the probes named `provider:name`, in any binary.
    pub fn probe_ids(&self, probe: &crate::probe::runtimes::ProbeRef) -> Vec<u32> {
        (0..self.probes.len() as u32)
            .filter(|&i| {
                let p = &self.probes[i as usize];
                probe.is(p.kind, &p.provider, &p.name)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::UsdtArg;

    fn site(name: &str, offset: u64) -> SiteInput {
        SiteInput {
            path: "/app".into(),
            attach_path: "/proc/1/root/app".into(),
            kind: ProbeKind::Usdt,
            provider: "tracer".into(),
            name: name.into(),
            file_offset: offset,
            semaphore_offset: Some(0x40),
            args: Ok(vec![Ok(UsdtArg {
                kind: tracer_common::arg_kind::REG,
                size: 8,
                ..Default::default()
            })]),
        }
    }

    /// Sites added later take the cookies and probe ids after the first ones, a probe
    /// seen again keeps its id; a failing addition leaves the plan as it was.
    #[test]
    fn sites_added_later_follow_the_first_ones() {
        let mut plan =
            ProbePlan::build(&[site("a", 0x10)], &[], &[], SiteMode::Count, None).unwrap();
        let mut lib = site("b", 0x20);
        lib.path = "/lib.so".into();
        let added = plan
            .add(&[lib, site("a", 0x30)], &[], SiteMode::Count, None)
            .unwrap();
        assert_eq!(added, 1..3);
        let cookies: Vec<u32> = plan.usdt_sites_in(added).iter().map(|s| s.0).collect();
        assert_eq!(cookies, [1, 2]);
        assert_eq!(plan.sites[1].site.probe_id, 1, "a new probe: the next id");
        assert_eq!(plan.sites[2].site.probe_id, 0, "the same probe: its id");
        assert_eq!(plan.probes[0].site_count, 2);
        let mut broken = site("c", 0x40);
        broken.args = Err("bad spec".into());
        assert!(
            plan.add(&[site("d", 0x50), broken], &[], SiteMode::Events, None)
                .is_err()
        );
        assert_eq!((plan.sites.len(), plan.probes.len()), (3, 2));
        assert_eq!(plan.probes[0].site_count, 2);
    }

    fn latency(name: &str, begin: &str, end: &str) -> LatencyDef {
        LatencyDef::between(
            name.into(),
            crate::probe::runtimes::ProbeRef::usdt("tracer", begin),
            crate::probe::runtimes::ProbeRef::usdt("tracer", end),
        )
    }

    #[test]
    fn assigns_latency_roles_per_site() {
        let sites = [
            site("gc__begin", 1),
            site("gc__stop_the_world", 2),
            site("gc__end", 3),
            site("gc__end", 4),
            site("other", 5),
        ];
        let lats = [
            latency("pause", "gc__begin", "gc__end"),
            latency("stw", "gc__begin", "gc__stop_the_world"),
        ];
        let plan = ProbePlan::build(&sites, &lats, &[], SiteMode::LatenciesOnly, Some(7)).unwrap();
        assert_eq!(plan.sites.len(), 4, "the unrelated probe is not attached");
        let begin = &plan.sites[0].site;
        assert_eq!(
            (begin.latency_begin_count, &begin.latency_begins[..2]),
            (2, &[0, 1][..])
        );
        assert_eq!(plan.sites[1].site.latency_ends[..1], [1]);
        assert_eq!(
            plan.sites[2].site.probe_id, plan.sites[3].site.probe_id,
            "two sites, one probe"
        );
        assert_eq!(
            plan.probes[plan.sites[2].site.probe_id as usize].site_count,
            2
        );
        assert_eq!(plan.sites[0].site.flags, 0);
        assert_eq!(plan.sites[0].attachment.pid, Some(7));
        assert_eq!(plan.sites[0].attachment.semaphore_offset, Some(0x40));
    }

    #[test]
    fn task_probes_get_their_role_and_task_argument() {
        let sites = [
            site("rt__run__task", 1),
            site("rt__pause__task", 2),
            site("unrelated", 3),
        ];
        let tasks: Vec<_> = crate::probe::runtimes::by_provider("tracer")
            .unwrap()
            .task_probe_defs()
            .collect();
        let plan = ProbePlan::build(&sites, &[], &tasks, SiteMode::LatenciesOnly, None).unwrap();
        assert_eq!(plan.sites.len(), 2);
        assert_eq!(plan.sites[0].site.flags, site_flags::TASK_RUN);
        assert_eq!(plan.sites[1].site.flags, site_flags::TASK_PAUSE);
        assert_eq!(plan.sites[0].site.task_arg, 0);
        let thread_tasks = [TaskProbeDef {
            provider: "tracer".into(),
            name: "rt__run__task".into(),
            role: TaskRole::Run,
            task_arg: None,
        }];
        let plan = ProbePlan::build(
            &sites[..1],
            &[],
            &thread_tasks,
            SiteMode::LatenciesOnly,
            None,
        )
        .unwrap();
        assert_eq!(plan.sites[0].site.task_arg, TASK_IS_THREAD);
    }

    #[test]
    fn events_attach_every_site_with_args() {
        let sites = [site("a", 1), site("b", 2)];
        let plan = ProbePlan::build(&sites, &[], &[], SiteMode::Events, None).unwrap();
        assert_eq!(plan.sites.len(), 2);
        assert!(
            plan.sites
                .iter()
                .all(|s| s.site.flags & site_flags::EMIT_EVENT != 0 && s.site.arg_count == 1)
        );
        assert_eq!(plan.probes[1].specifier(), "usdt:/app:tracer:b");
    }

    #[test]
    fn bad_args_fail_only_when_events_need_them() {
        let mut bad = site("gc__begin", 1);
        bad.args = Err("bad spec".into());
        let lats = [latency("pause", "gc__begin", "gc__end")];
        assert!(
            ProbePlan::build(
                std::slice::from_ref(&bad),
                &lats,
                &[],
                SiteMode::LatenciesOnly,
                None
            )
            .is_ok()
        );
        let err = ProbePlan::build(&[bad.clone()], &[], &[], SiteMode::Events, None).unwrap_err();
        assert!(matches!(err, PlanError::BadArguments { .. }));
        let counted = ProbePlan::build(&[bad], &[], &[], SiteMode::Count, None).unwrap();
        assert_eq!(counted.sites.len(), 1, "counting needs no arguments");
        assert_eq!(counted.sites[0].site.flags, 0);
    }

    #[test]
    fn an_unavailable_argument_is_marked_and_reported_once_per_probe() {
        let mut a = site("a", 1);
        let reg = |size| {
            Ok(UsdtArg {
                kind: tracer_common::arg_kind::REG,
                reg_off: 112,
                size,
                ..Default::default()
            })
        };
        a.args = Ok(vec![reg(4), Err("\"4f@%xmm0\": no".into()), reg(8)]);
        let mut a2 = a.clone();
        a2.file_offset = 2;
        let plan = ProbePlan::build(&[a.clone(), a2], &[], &[], SiteMode::Events, None).unwrap();
        assert_eq!(plan.sites.len(), 2, "the probe is attached at every site");
        for planned in &plan.sites {
            assert_eq!(planned.site.arg_count, 3);
            assert_eq!(planned.site.unavailable, 0b010);
            assert_eq!(planned.site.args[1], UsdtArg::default(), "reads as 0");
            assert_eq!(planned.site.args[2].size, 8);
        }
        assert_eq!(
            plan.unavailable_args,
            vec![UnavailableArg {
                probe_id: 0,
                index: 1,
                reason: "\"4f@%xmm0\": no".into()
            }]
        );
        // A task probe whose task argument is unavailable cannot say which task runs.
        let tasks = [TaskProbeDef {
            provider: "tracer".into(),
            name: "a".into(),
            role: TaskRole::Run,
            task_arg: Some(1),
        }];
        let err = ProbePlan::build(&[a], &[], &tasks, SiteMode::LatenciesOnly, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "probe /app:tracer:a: the task argument is unavailable: \"4f@%xmm0\": no"
        );
    }
    fn request(text: &str, provider: &str, name: &str, arg: u8, max_len: u16) -> StringRequest {
        StringRequest {
            text: text.into(),
            provider: provider.into(),
            name: name.into(),
            arg,
            max_len,
        }
    }

    /// Sites planned later (a library loaded while tracing) take the stacks and strings
    /// the first ones take; strings asked for before any probe was found wait for one.
    #[test]
    fn sites_added_later_take_the_stacks_and_strings_asked_for() {
        let mut plan = ProbePlan::build(&[site("a", 1)], &[], &[], SiteMode::Events, None).unwrap();
        plan.take_stacks();
        plan.show_strings(&[request("late:arg0", "*", "late", 0, 32)])
            .unwrap_err();
        plan.show_strings(&[request("arg0", "*", "*", 0, 32)])
            .unwrap();
        let added = plan
            .add(&[site("late", 2)], &[], SiteMode::Events, None)
            .unwrap();
        let late = &plan.sites[added.start].site;
        assert_ne!(late.flags & site_flags::STACKS, 0);
        assert_eq!(
            (late.str_count, late.str_args[0], late.str_max[0]),
            (1, 0, 32)
        );

        // Nothing found yet: the request is kept, not refused.
        let mut empty = ProbePlan::build(&[], &[], &[], SiteMode::Events, None).unwrap();
        empty.take_stack_snapshots();
        empty
            .show_strings(&[request("late:arg0", "*", "late", 0, 16)])
            .unwrap();
        let added = empty
            .add(
                &[site("late", 2), site("other", 3)],
                &[],
                SiteMode::Events,
                None,
            )
            .unwrap();
        let [late, other] = [added.start, added.start + 1].map(|i| &empty.sites[i].site);
        assert_eq!(
            late.flags & (site_flags::STACKS | site_flags::STACK_SNAPSHOT),
            site_flags::STACKS | site_flags::STACK_SNAPSHOT
        );
        assert_eq!((late.str_count, late.str_max[0]), (1, 16));
        assert_eq!(other.str_count, 0, "not named by the request");

        // A later probe a wildcard request does not fit (no arg1, or a 4-byte arg0) is
        // planned all the same, without the string.
        let mut narrow = site("narrow", 5);
        narrow.args = Ok(vec![Ok(UsdtArg {
            kind: tracer_common::arg_kind::REG,
            size: 4,
            ..Default::default()
        })]);
        let wild = |request: StringRequest| {
            let mut plan = ProbePlan::build(&[], &[], &[], SiteMode::Events, None).unwrap();
            plan.show_strings(&[request]).unwrap();
            plan
        };
        let mut no_arg1 = wild(request("arg1", "*", "*", 1, 16));
        let added = no_arg1
            .add(
                &[site("one_arg", 4), narrow.clone()],
                &[],
                SiteMode::Events,
                None,
            )
            .unwrap();
        assert_eq!(added.len(), 2);
        assert!(no_arg1.sites.iter().all(|s| s.site.str_count == 0));
        let mut wild = wild(request("arg0", "*", "*", 0, 16));
        let added = wild
            .add(&[narrow, site("wide", 6)], &[], SiteMode::Events, None)
            .unwrap();
        let counts: Vec<u8> = added.map(|i| wild.sites[i].site.str_count).collect();
        assert_eq!(counts, [0, 1], "the 4-byte one without, the pointer with");
    }

    /// `--str` marks the sites of the probes it names, a later request for the same
    /// argument replacing an earlier one; what names nothing, or an argument a probe
    /// lacks or that cannot hold a pointer, is refused with the probe named.
    #[test]
    fn strings_are_planned_for_the_probes_named_and_checked() {
        let mut two = site("query__start", 3);
        let reg = |size| {
            Ok(UsdtArg {
                kind: tracer_common::arg_kind::REG,
                size,
                ..Default::default()
            })
        };
        two.args = Ok(vec![reg(8), reg(4)]);
        let sites = [site("a", 1), site("a", 2), two];
        let plan = |requests: &[StringRequest]| {
            let mut plan = ProbePlan::build(&sites, &[], &[], SiteMode::Events, None).unwrap();
            plan.show_strings(requests).map(|()| plan)
        };
        let planned = plan(&[
            request("arg0", "*", "*", 0, 64),
            request("query__*:arg0:9", "tracer", "query__*", 0, 9),
        ])
        .unwrap();
        let strings = |i: usize| {
            let s = &planned.sites[i].site;
            (s.str_count, s.str_args[0], s.str_max[0])
        };
        assert_eq!([strings(0), strings(1)], [(1, 0, 64), (1, 0, 64)]);
        assert_eq!(strings(2), (1, 0, 9), "the later request wins");
        let none = plan(&[]).unwrap();
        assert!(none.sites.iter().all(|s| s.site.str_count == 0));

        let err = |requests: &[StringRequest]| plan(requests).unwrap_err().to_string();
        assert_eq!(
            err(&[request("nosuch:arg0", "*", "nosuch", 0, 64)]),
            "--str nosuch:arg0: no probe traced is named so (traced: tracer:a, tracer:query__start)"
        );
        assert_eq!(
            err(&[request("arg1", "*", "*", 1, 64)]),
            "--str arg1: usdt:/app:tracer:a has 1 argument, no arg1"
        );
        assert_eq!(
            err(&[request("query__start:arg1", "*", "query__start", 1, 64)]),
            "--str query__start:arg1: arg1 of usdt:/app:tracer:query__start is a 4-byte integer, not a pointer"
        );
        let repeats: Vec<_> = (0..5).map(|_| request("a:arg0", "*", "a", 0, 64)).collect();
        let planned = plan(&repeats).unwrap();
        assert_eq!(
            planned.sites[0].site.str_count, 1,
            "one argument, one string"
        );
        let mut five = site("five", 4);
        five.args = Ok(vec![reg(8); 5]);
        let mut plan = ProbePlan::build(&[five], &[], &[], SiteMode::Events, None).unwrap();
        let all: Vec<_> = (0..5)
            .map(|i| request("five", "*", "five", i, 64))
            .collect();
        assert_eq!(
            plan.show_strings(&all).unwrap_err().to_string(),
            "usdt:/app:tracer:five: more than 4 arguments asked for as strings"
        );
        assert!(plan.show_strings(&all[..4]).is_ok());
    }
}
