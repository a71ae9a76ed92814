//! Turns discovered USDT sites and the measurements asked for into what the kernel gets:
//! one `UsdtSite` per attached site (its index is the uprobe's BPF cookie), probe ids for
//! hit counts and events, and latency ids for begin/end pairs. Pure: no kernel access.

use std::path::PathBuf;

use thiserror::Error;
use tracer_common::{
    MAX_LATENCIES, MAX_LATENCIES_PER_PROBE, MAX_PROBES, MAX_STR_ARGS, MAX_USDT_SITES, UsdtSite,
    site_flags,
};

use crate::{
    kernel::{PlanSizes, UsdtAttachment},
    probe::runtimes::LatencyDef,
    probe::usdt::{ProbeKind, SiteArg},
};

mod add;
mod site;
mod strings;

pub(crate) use strings::StringRequest;

#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum PlanError {
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

/// One probe site found in a binary, ready to attach.
#[derive(Debug, Clone)]
pub(crate) struct SiteInput {
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
pub(crate) struct ProbeInfo {
    pub path: PathBuf,
    pub kind: ProbeKind,
    pub provider: String,
    pub name: String,
    pub arg_count: usize,
    pub site_count: usize,
}

impl ProbeInfo {
    /// bpftrace's spelling of the probe.
    pub(crate) fn specifier(&self) -> String {
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
}

/// What to do at sites beyond the latencies they take part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SiteMode {
    /// Attach only sites that begin or end a latency (`attach`).
    LatenciesOnly,
    /// Attach every site and count its hits (`trace --count`).
    Count,
    /// Attach every site and send each hit with its arguments (`trace`).
    Events,
}

/// One site to attach, with what the eBPF program does when it fires.
#[derive(Debug, Clone)]
pub(crate) struct PlannedSite {
    pub attachment: UsdtAttachment,
    pub site: UsdtSite,
}

/// An argument of a probe that cannot be decoded at some of its sites: its events show
/// it as unavailable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct UnavailableArg {
    pub probe_id: u32,
    /// 0-based.
    pub index: usize,
    /// The argument's text and why it cannot be read.
    pub reason: String,
}

/// Everything to attach, indexed the way the kernel side indexes it.
#[derive(Debug, Default)]
pub(crate) struct ProbePlan {
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
    pub(crate) fn sizes(&self) -> PlanSizes {
        PlanSizes {
            sites: self.sites.len() as u32,
            probes: self.probes.len() as u32,
            latencies: self.latencies.len() as u32,
        }
    }

    /// Each probe's whole specifier, in probe id order.
    pub(crate) fn specifiers(&self) -> Vec<String> {
        self.probes.iter().map(ProbeInfo::specifier).collect()
    }

    /// Every site with its BPF cookie, as `Loader::attach_usdt_sites` takes them.
    pub(crate) fn usdt_sites(&self) -> Vec<(u32, &UsdtSite, &UsdtAttachment)> {
        self.usdt_sites_in(0..self.sites.len())
    }

    /// The sites of `cookies` (what [`ProbePlan::add`] returned), as
    /// [`ProbePlan::usdt_sites`] gives them.
    pub(crate) fn usdt_sites_in(
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
    pub(crate) fn take_stacks(&mut self) {
        self.stack_flags = site_flags::STACKS;
        self.apply_stacks(0);
    }

    /// [`ProbePlan::take_stacks`], user stacks as snapshots for DWARF unwinding (events
    /// only).
    pub(crate) fn take_stack_snapshots(&mut self) {
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
    pub(crate) fn room_to_grow(&self) -> PlanSizes {
        PlanSizes {
            sites: MAX_USDT_SITES,
            probes: MAX_PROBES,
            latencies: self.latencies.len() as u32,
        }
    }
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::UsdtArg;

    /// A site of probe `tracer:name` in `/app` at `offset`, with one register argument.
    pub(super) fn site(name: &str, offset: u64) -> SiteInput {
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
}
