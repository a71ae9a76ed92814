//! String arguments (`trace --str`): the requests for them and the sites that read them.
//! A request names probes and one argument of theirs.
//! The sites of the probes named read that argument as a string at each hit.
//! The requests are kept, so that sites planned later read their strings too.

use tracer_common::MAX_STR_ARGS;

use super::{PlanError, ProbePlan};
use crate::probe::usdt::Glob;

/// An argument to show as a string (`trace --str`): of the probes named so (every one
/// when `provider` and `name` are `*`), at most `max_len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StringRequest {
    /// As given on the command line, for errors.
    pub text: String,
    pub provider: String,
    pub name: String,
    pub arg: u8,
    pub max_len: u16,
}

impl ProbePlan {
    /// Makes the sites of the probes `requests` name read those arguments as strings at
    /// each hit; a later request for the same argument of a probe replaces an earlier
    /// one. A request that names no probe, or an argument a probe lacks or that cannot
    /// hold a pointer, is an error.
    pub(crate) fn show_strings(&mut self, requests: &[StringRequest]) -> Result<(), PlanError> {
        // With no probe found yet (they may come in a library loaded later), the requests
        // wait for them.
        let strict = !self.probes.is_empty();
        self.apply_strings(requests, 0, strict)?;
        self.string_requests = requests.to_vec();
        Ok(())
    }

    /// Sets the string arguments `requests` ask for in the sites from `first_site`;
    /// `strict`: a request that matches no probe is an error.
    pub(super) fn apply_strings(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{UsdtArg, site_flags};

    use super::super::{SiteMode, tests::site};

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
