//! The probe sites of `attach`'s targets, and the latencies measured with them.

use std::collections::HashMap;

use anyhow::{Result, bail};

use crate::{
    cli::{AttachConfig, LatencyProbe},
    probe::plan::{ProbePlan, SiteInput},
    probe::runtimes::{self, LatencyDef, ProbeRef, functions::UsdtElsewhere},
    probe::usdt::{self, ProbePattern},
};

/// The probe sites of the targets: every USDT probe of their files (a known runtime's is
/// measured), the functions `--latency` names, and the GC functions of runtimes whose
/// builds have no USDT probes (pyenv's CPython, Node).
pub(super) struct FoundSites {
    pub sites: Vec<SiteInput>,
    /// The files searched, marked before the programs load: a library mapped from then on
    /// is one to search later.
    pub searched: usdt::Searched,
    pub requested: RequestedFunctions,
    pub usdt_elsewhere: UsdtElsewhere,
}

/// Finds the sites of [`FoundSites`] in process `single`, or in the set of `pids`.
pub(super) fn find_sites(
    config: &AttachConfig,
    single: Option<u32>,
    pids: &[u32],
) -> Result<FoundSites> {
    let spec = &config.targets;
    // Any failure to read the target's files while it vanishes means it exited.
    let scan = match single {
        Some(pid) => usdt::scan_process(pid, &ProbePattern::any()),
        None => usdt::scan_processes(pids, spec.exe.as_deref(), &ProbePattern::any()),
    }
    .map_err(crate::probe::usdt::UsdtError::of_target)?;
    // What was searched, marked now: a library mapped from here on (while the programs
    // load) is one to search later.
    let searched = usdt::Searched::of_resolved(&scan.sites, pids);
    for (object, error) in &scan.skipped {
        log::debug!("skipped {}: {error}", object.path.display());
    }
    // Every probe is wanted here only if it is a known runtime's: a malformed site is
    // left out with a warning, never attached.
    let mut sites: Vec<SiteInput> = Vec::new();
    for site in &scan.sites {
        match SiteInput::try_from(site) {
            Ok(input) => sites.push(input),
            Err(problem) => log::warn!("skipped a probe site: {problem}"),
        }
    }
    // Functions: those --latency names, and the GC functions of runtimes whose builds
    // have no USDT probes (pyenv's CPython, Node).
    let scope = match single {
        Some(pid) => usdt::Scope::Process(pid),
        None => usdt::Scope::Processes {
            pids,
            exe: spec.exe.as_deref(),
        },
    };
    let requested = resolve_requested_functions(config, scope)?;
    let mut usdt_elsewhere = UsdtElsewhere::default();
    let catalogue = match usdt::find(&runtimes::functions::specifiers(pids), scope) {
        Ok(found) => found.sites,
        Err(e) => {
            log::warn!("cannot look for the functions of runtimes without USDT probes: {e}");
            Vec::new()
        }
    };
    for site in catalogue
        .iter()
        .filter(|site| usdt_elsewhere.keep(site))
        .chain(&requested.sites)
    {
        match SiteInput::try_from(site) {
            Ok(input) => sites.push(input),
            Err(problem) => log::warn!("skipped a function probe: {problem}"),
        }
    }
    Ok(FoundSites {
        sites,
        searched,
        requested,
        usdt_elsewhere,
    })
}

/// The functions the --latency requests name, found in the targets: the sites, and the
/// symbol each function end names (by the request's index and end), which the latency
/// matches its sites by.
#[derive(Default)]
pub(super) struct RequestedFunctions {
    sites: Vec<usdt::ProbeSite>,
    pub names: HashMap<(usize, bool), ProbeRef>,
}

/// Finds the functions of --latency requests. A function end names one function: a
/// pattern matching several is refused; one matching none now is looked for in what is
/// loaded later when it names a symbol literally, and refused otherwise.
fn resolve_requested_functions(
    config: &AttachConfig,
    scope: usdt::Scope<'_>,
) -> Result<RequestedFunctions> {
    let mut requested = RequestedFunctions::default();
    for (index, request) in config.latencies.iter().enumerate() {
        for (is_end, probe) in [(false, &request.begin), (true, &request.end)] {
            let LatencyProbe::Function(spec) = probe else {
                continue;
            };
            let found = usdt::find(std::slice::from_ref(spec), scope)?;
            let mut names: Vec<&str> = found.sites.iter().map(|s| s.note.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let name = match names.as_slice() {
                [one] => one.to_string(),
                [] if spec.pattern.name.is_literal() => {
                    crate::status!(
                        "No function {} in {} yet: looking for it in what is loaded later.",
                        spec.describe(),
                        config.targets
                    );
                    spec.pattern.name.to_string()
                }
                [] => bail!("--latency: {} matches no function", spec.describe()),
                several => bail!(
                    "--latency: {} matches {} functions ({}): a latency needs one",
                    spec.describe(),
                    several.len(),
                    several
                        .iter()
                        .take(5)
                        .map(|n| crate::stack::symbolize::demangle(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            requested
                .names
                .insert((index, is_end), ProbeRef::function(spec.kind, &name));
            requested.sites.extend(found.sites);
        }
    }
    Ok(requested)
}

/// The probe a --latency end names: a USDT probe, or the function found for it.
fn requested_probe(
    requested: &HashMap<(usize, bool), ProbeRef>,
    index: usize,
    is_end: bool,
    probe: &LatencyProbe,
) -> ProbeRef {
    match probe {
        LatencyProbe::Usdt { provider, name } => ProbeRef::usdt(provider, name),
        LatencyProbe::Function(spec) => requested
            .get(&(index, is_end))
            .cloned()
            .unwrap_or_else(|| ProbeRef::function(spec.kind, spec.pattern.name.as_str())),
    }
}

/// The latencies to measure: every known runtime's (from USDT probes, or from functions
/// where its build has none), plus those asked for with --latency (whose probes may only
/// come in a library loaded later).
pub(super) fn latencies_for(
    sites: &[SiteInput],
    config: &AttachConfig,
    requested: &HashMap<(usize, bool), ProbeRef>,
) -> Vec<LatencyDef> {
    let mut defs: Vec<LatencyDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(crate::probe::runtimes::Runtime::latency_defs)
        .chain(runtimes::functions::latency_defs())
        .collect();
    for (index, request) in config.latencies.iter().enumerate() {
        let begin = requested_probe(requested, index, false, &request.begin);
        let end = requested_probe(requested, index, true, &request.end);
        for (probe, asked) in [(&begin, &request.begin), (&end, &request.end)] {
            if matches!(asked, LatencyProbe::Usdt { .. })
                && !sites.iter().any(|s| probe.is(s.kind, &s.provider, &s.name))
            {
                crate::status!(
                    "No probe {probe} in {} yet: looking for it in what is loaded later.",
                    config.targets
                );
            }
        }
        let short = |probe: &ProbeRef| match probe.kind {
            usdt::ProbeKind::Usdt => probe.name.clone(),
            kind => format!("{}_{kind}", crate::stack::symbolize::demangle(&probe.name)),
        };
        // A function's entry to its return is the function's own time, named after it.
        let name = match begin.kind == usdt::ProbeKind::Uprobe
            && end.kind == usdt::ProbeKind::Uretprobe
            && begin.name == end.name
        {
            true => crate::stack::symbolize::demangle(&begin.name),
            false => format!("{}_to_{}", short(&begin), short(&end)),
        };
        defs.push(LatencyDef::between(name, begin, end));
    }
    defs
}

/// What is looked for in objects mapped later: every known runtime's probes (or its
/// functions, where its build has no USDT probes), and the probes and functions asked for
/// with --latency.
pub(super) fn later_specs(
    config: &AttachConfig,
    requested: &HashMap<(usize, bool), ProbeRef>,
) -> Vec<usdt::UsdtSpecifier> {
    let mut providers: Vec<&str> = runtimes::RUNTIMES.iter().map(|r| r.provider).collect();
    let mut specs = runtimes::functions::specifiers(&[]);
    for (index, request) in config.latencies.iter().enumerate() {
        for (is_end, probe) in [(false, &request.begin), (true, &request.end)] {
            match probe {
                LatencyProbe::Usdt { provider, .. } => providers.push(provider),
                LatencyProbe::Function(spec) => {
                    // The function found, by its symbol, in whatever file the spec names.
                    let mut spec = spec.clone();
                    if let Some(found) = requested.get(&(index, is_end)) {
                        spec.pattern = ProbePattern::new("", &usdt::escape_glob(&found.name));
                    }
                    specs.push(spec);
                }
            }
        }
    }
    providers.sort_unstable();
    providers.dedup();
    providers
        .into_iter()
        .filter_map(|provider| usdt::parse_specifier(&format!("usdt:*:{provider}:*")).ok())
        .chain(specs)
        .collect()
}

/// The runtimes whose probes are attached, each once, those measured through their
/// functions saying so.
pub(super) fn runtime_names(plan: &ProbePlan) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for probe in &plan.probes {
        let name = match runtimes::by_provider(&probe.provider) {
            Some(runtime) if probe.kind == usdt::ProbeKind::Usdt => runtime.name.to_string(),
            _ => match runtimes::functions::runtime_of(probe.kind, &probe.path, &probe.name) {
                Some(runtime) => format!(
                    "{} (GC from function probes: no USDT in this build)",
                    runtime.name
                ),
                None => continue,
            },
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Only a valid site becomes something to attach: the offsets come from
/// [`usdt::validate`], and a malformed note is its error.
impl TryFrom<&usdt::ProbeSite> for SiteInput {
    type Error = usdt::UsdtError;

    fn try_from(site: &usdt::ProbeSite) -> Result<Self, usdt::UsdtError> {
        let offsets = site.offsets()?;
        Ok(SiteInput {
            path: site.binary.path.clone(),
            attach_path: site.binary.host_path.clone(),
            kind: site.kind,
            provider: site.note.provider.clone(),
            name: site.note.name.clone(),
            file_offset: offsets.probe,
            semaphore_offset: offsets.semaphore,
            args: site.args.clone(),
        })
    }
}
