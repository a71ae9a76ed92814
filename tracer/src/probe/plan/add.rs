//! Building a plan and adding sites to it: the checks on how many, and each probe's id.
//! Sites added later take the cookies and probe ids after those planned already.
//! An addition that fails leaves the plan as it was.
//! What the kernel does at each site is worked out in `site`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use tracer_common::{MAX_LATENCIES, MAX_PROBES, MAX_USDT_SITES};

use super::site::{SiteRoles, SiteShape, attachment};
use super::{PlanError, PlannedSite, ProbeInfo, ProbePlan, SiteInput, SiteMode, UnavailableArg};
use crate::{
    probe::runtimes::{LatencyDef, TaskProbeDef},
    probe::usdt::ProbeKind,
};

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

impl ProbePlan {
    /// Plans `sites` for process `pid` (or every process when `None`); `mode` says which
    /// sites beyond the latencies' are attached and whether hits become events.
    pub(crate) fn build(
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
    pub(crate) fn add(
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
        self.check_room(sites, latencies, tasks, mode)?;
        // Each probe's id and each unavailable argument by value: a search of the lists
        // for every site made many sites take quadratic time.
        let mut probe_ids: HashMap<ProbeKey, u32> = self
            .probes
            .iter()
            .enumerate()
            .map(|(id, probe)| (ProbeKey::of_probe(probe), id as u32))
            .collect();
        let mut unavailable_seen: HashSet<UnavailableArg> =
            self.unavailable_args.iter().cloned().collect();
        let emit_events = mode == SiteMode::Events;
        for input in sites {
            let roles = SiteRoles::of(input, latencies, tasks);
            if mode == SiteMode::LatenciesOnly && roles.is_none() {
                continue;
            }
            let shape = SiteShape::of(input, roles, latencies, emit_events)?;
            let probe_id = self.probe_id(&mut probe_ids, input, shape.args.len());
            let (site, unavailable_args) = shape.into_site(probe_id);
            for unavailable in unavailable_args {
                if emit_events && unavailable_seen.insert(unavailable.clone()) {
                    self.unavailable_args.push(unavailable);
                }
            }
            self.sites.push(PlannedSite {
                attachment: attachment(input, pid),
                site,
            });
        }
        if self.probes.len() > MAX_PROBES as usize {
            return Err(PlanError::TooManyProbes(self.probes.len()));
        }
        Ok(())
    }

    /// Fails when the sites of `sites` that `mode` attaches would not fit beside those
    /// planned already.
    fn check_room(
        &self,
        sites: &[SiteInput],
        latencies: &[LatencyDef],
        tasks: &[TaskProbeDef],
        mode: SiteMode,
    ) -> Result<(), PlanError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::site;

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
}
