//! USDT probe discovery: the sites that match a pattern in a file, a process (its
//! executable and every object it maps) or a set of processes, and functions as probe
//! sites (`uprobe:`). The notes themselves are read by the `tracer_usdt` crate; this
//! module adds the processes, whose files it finds through /proc.

mod functions;
mod process;
mod resolve;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use tracer_usdt::Error as FileError;

use crate::system::procfs::ProcessError;

pub(crate) use functions::{FunctionSymbol, Functions, is_go_program};
pub(crate) use process::{MappedObject, executable, mapped_objects};
pub(crate) use resolve::{
    Resolved, Scope, Searched, escape_glob, find, find_new, resolve, why_none,
};
#[cfg(test)]
pub(crate) use tracer_usdt::SiteProblem;
pub(crate) use tracer_usdt::{
    ArgSpec, Glob, ProbeKind, ProbePattern, SiteArg, SiteOffsets, UsdtNote, UsdtSpecifier,
    describe, dl_debug_state_offset, glob_paths, has_probe_type, interpreter, parse_arg_specs,
    parse_specifier, read_notes, resolve_globals,
};

/// Everything that can go wrong while discovering or decoding USDT probes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsdtError {
    /// A file's notes, or a probe's text, are wrong (see [`tracer_usdt::Error`]).
    #[error(transparent)]
    File(#[from] tracer_usdt::Error),
    /// Several files are wrong; the first, and how many more.
    #[error("{first} (and {more} more malformed notes)")]
    Several {
        /// The first problem found.
        first: Box<UsdtError>,
        /// How many others there are.
        more: usize,
    },
    /// The process is not there (never existed, exited, a zombie), or /proc hides it.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A path with wildcards matched no ELF file.
    #[error("no ELF file matches the path {path} of {spec}")]
    NoFiles {
        /// The path pattern as given.
        path: String,
        /// The whole specifier, as `usdt:PATH:PROVIDER:NAME`.
        spec: String,
    },
    /// No probe matched what the user asked for.
    #[error("no probes match {wanted} in {place}")]
    NoProbes { wanted: String, place: String },
    /// A file asked for all its probes has none at all.
    #[error(
        "no USDT probes in {path}: its build has no SystemTap SDT notes (readelf -n shows \
         them). Its threads can still be profiled (tracer profile, tracer attach) and \
         inspected (tracer stacks)"
    )]
    NoUsdtProbes { path: String },
}

impl UsdtError {
    fn io(path: &Path, source: io::Error) -> Self {
        tracer_usdt::Error::io(path, source).into()
    }

    /// This error for a process known to have existed (tracer watches it): a process not
    /// there any more has exited.
    pub(crate) fn of_target(self) -> Self {
        match self {
            UsdtError::Process(e) => UsdtError::Process(e.of_target()),
            other => other,
        }
    }
}

/// One place a probe can be attached: the binary it lives in, its note and its decoded
/// arguments.
#[derive(Clone, Debug)]
pub(crate) struct ProbeSite {
    /// The file holding the note; in path mode `path` and `host_path` are both the path
    /// the user gave.
    pub binary: MappedObject,
    /// The note, with the uprobe and semaphore offsets.
    pub note: UsdtNote,
    /// The decoded arguments, each ready or unavailable with why; the whole spec fails
    /// only with more arguments than an event holds. Kept so `list` still shows a site
    /// whose spec we cannot read, and `trace` shows what it can of it.
    pub args: Result<Vec<SiteArg>, String>,
    /// A note's site, or a function's entry or return (then `note` is made up: no
    /// provider, the function's name, no semaphore).
    pub kind: ProbeKind,
    /// For a function probe, the function it is in (none for an address no symbol
    /// names).
    pub function: Option<FunctionSymbol>,
}

impl ProbeSite {
    /// The file offsets to attach at, or the error naming the note and what is wrong with
    /// it. Nothing may be attached at a site for which this fails.
    pub(crate) fn offsets(&self) -> Result<SiteOffsets, UsdtError> {
        self.note.location.clone().map_err(|problem| {
            UsdtError::from(FileError::InvalidSite {
                path: self.binary.path.clone(),
                note_offset: self.note.note_offset,
                provider: self.note.provider.clone(),
                name: self.note.name.clone(),
                problem: Box::new(problem),
            })
        })
    }

    /// Whether the site's addresses passed [`validate`].
    pub(crate) fn is_valid(&self) -> bool {
        self.note.location.is_ok()
    }
}

/// The probe sites in one ELF file that match `pattern`, in note order, valid or not (see
/// [`ProbeSite::offsets`]).
pub(crate) fn find_probes_in_file(
    path: &Path,
    pattern: &ProbePattern,
) -> Result<Vec<ProbeSite>, UsdtError> {
    let binary = MappedObject::from_path(path);
    sites_in(&binary, pattern)
}

/// What [`scan_process`] found: the sites, and the mapped objects it had to skip.
#[derive(Debug, Default)]
pub(crate) struct ProcessScan {
    /// Matching sites, executable first, then libraries in address order; valid or not
    /// (see [`ProbeSite::offsets`]).
    pub sites: Vec<ProbeSite>,
    /// Shared libraries that could not be read (vanished, not ELF, broken notes). A
    /// process maps many objects we do not care about, so one bad library must not hide
    /// the probes of the others; the caller decides whether to warn.
    pub skipped: Vec<(MappedObject, UsdtError)>,
}

/// The probe sites matching `pattern` in a process's executable and in every object it
/// has mapped executable, each file read once. Fails only if the process is gone or its
/// executable cannot be read; unreadable libraries are listed in `skipped`.
pub(crate) fn scan_process(pid: u32, pattern: &ProbePattern) -> Result<ProcessScan, UsdtError> {
    let exe = executable(pid)?;
    let objects = mapped_objects(pid)?;
    let mut scan = ProcessScan {
        sites: sites_in(&exe, pattern)?,
        skipped: Vec::new(),
    };
    let mut seen: HashSet<PathBuf> = HashSet::from([exe.path.clone()]);
    for object in objects {
        if !seen.insert(object.path.clone()) {
            continue;
        }
        match sites_in(&object, pattern) {
            Ok(sites) => scan.sites.extend(sites),
            Err(e) => scan.skipped.push((object, e)),
        }
    }
    Ok(scan)
}

/// [`scan_process`] over several processes (and the file `exe`, which may run in none of
/// them yet), each file's sites once however many processes map it. Processes that
/// exited meanwhile are passed over; fails only when none of them could be read and
/// there is no `exe`.
pub(crate) fn scan_processes(
    pids: &[u32],
    exe: Option<&Path>,
    pattern: &ProbePattern,
) -> Result<ProcessScan, UsdtError> {
    let mut scan = ProcessScan::default();
    let mut first_error = None;
    let mut scanned = 0;
    for &pid in pids {
        match scan_process(pid, pattern) {
            Ok(one) => {
                scanned += 1;
                scan.sites.extend(one.sites);
                scan.skipped.extend(one.skipped);
            }
            Err(e) => {
                log::debug!("cannot scan process {pid}: {e}");
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(exe) = exe {
        scan.sites
            .extend(sites_in(&MappedObject::from_path(exe), pattern)?);
        scanned += 1;
    }
    if scanned == 0
        && let Some(error) = first_error
    {
        return Err(error);
    }
    dedup_by_file(&mut scan.sites);
    Ok(scan)
}

/// Keeps each site once: the same file seen through two processes (under
/// /proc/PID/root of each) is one file, so one uprobe per address.
pub(crate) fn dedup_by_file(sites: &mut Vec<ProbeSite>) {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen = HashSet::new();
    sites.retain(|site| {
        let id = std::fs::metadata(&site.binary.host_path).map_or_else(
            |_| (0, 0, site.binary.host_path.clone()),
            |m| (m.dev(), m.ino(), PathBuf::new()),
        );
        // An entry and a return probe on one function are two sites.
        seen.insert((id, site.note.pc, site.kind))
    });
}

/// [`scan_process`] without the list of skipped libraries, for callers that only want
/// the sites.
#[cfg(test)]
pub(crate) fn find_probes_in_process(
    pid: u32,
    pattern: &ProbePattern,
) -> Result<Vec<ProbeSite>, UsdtError> {
    scan_process(pid, pattern).map(|scan| scan.sites)
}

pub(crate) fn sites_in(
    binary: &MappedObject,
    pattern: &ProbePattern,
) -> Result<Vec<ProbeSite>, UsdtError> {
    // Some binaries carry the same note twice (libjvm.so's hotspot:gc__begin); one uprobe
    // per address, or every hit would count twice.
    let mut seen = HashSet::new();
    let notes: Vec<(UsdtNote, Result<Vec<ArgSpec>, String>)> = read_notes(&binary.host_path)?
        .into_iter()
        .filter(|note| pattern.matches(&note.provider, &note.name))
        .filter(|note| seen.insert(note.pc))
        .map(|note| {
            let specs = parse_arg_specs(&note.arg_spec).map_err(|e| e.to_string());
            (note, specs)
        })
        .collect();
    let addresses = global_addresses(binary, notes.iter().filter_map(|(_, s)| s.as_ref().ok()));
    Ok(notes
        .into_iter()
        .map(|(note, specs)| {
            let args = specs.map(|specs| {
                resolve_globals(specs, note.attach_pc(), |symbol| {
                    addresses
                        .get(symbol)
                        .cloned()
                        .unwrap_or_else(|| Err(format!("no symbol {symbol}")))
                })
            });
            ProbeSite {
                binary: binary.clone(),
                note,
                args,
                kind: ProbeKind::Usdt,
                function: None,
            }
        })
        .collect())
}

/// The addresses of the symbols that the `%rip`-relative arguments of `specs` name, read
/// from the object only when there are some. An object whose symbols cannot be read
/// leaves those arguments unavailable, not its probes.
fn global_addresses<'a>(
    binary: &MappedObject,
    specs: impl Iterator<Item = &'a Vec<ArgSpec>>,
) -> HashMap<String, Result<u64, String>> {
    let wanted: HashSet<&str> = specs
        .flatten()
        .filter_map(|arg| match arg {
            ArgSpec::Global { symbol, .. } => Some(symbol.as_str()),
            _ => None,
        })
        .collect();
    if wanted.is_empty() {
        return HashMap::new();
    }
    tracer_usdt::symbol_addresses(&binary.host_path, &wanted).unwrap_or_else(|e| {
        let why = format!("cannot read the symbols: {e}");
        wanted
            .iter()
            .map(|&name| (name.to_owned(), Err(why.clone())))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_errors_on_proc_say_what_is_missing() {
        let denied = |path: &str| {
            UsdtError::from(FileError::Io {
                path: path.into(),
                source: io::Error::from(io::ErrorKind::PermissionDenied),
            })
        };
        assert!(
            denied("/proc/1/exe")
                .to_string()
                .contains("root or with CAP_SYS_PTRACE")
        );
        assert_eq!(denied("/tmp/x").to_string(), "cannot read /tmp/x");
    }

    const PYTHON: &str = "/usr/bin/python3.11";

    #[test]
    fn finds_python_gc_probes_in_file() {
        if !Path::new(PYTHON).exists() {
            eprintln!("{PYTHON} not installed; skipping");
            return;
        }
        let pattern: ProbePattern = "python:gc__*".parse().unwrap();
        let sites = find_probes_in_file(Path::new(PYTHON), &pattern).unwrap();
        let names: Vec<&str> = sites.iter().map(|s| s.note.name.as_str()).collect();
        assert!(names.contains(&"gc__start"), "{names:?}");
        assert!(names.contains(&"gc__done"), "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("gc__")));
        let start = sites.iter().find(|s| s.note.name == "gc__start").unwrap();
        // gc__start(int generation): one signed 32-bit argument.
        let args = start.args.as_ref().unwrap();
        assert_eq!(args.len(), 1);
        let arg = args[0].as_ref().unwrap();
        assert_eq!((arg.size, arg.signed), (4, 1));
    }

    #[test]
    fn scans_own_process() {
        // Our own test binary has no probes, but the scan must read the executable and
        // every mapped library (libc at least) without failing.
        let pattern: ProbePattern = "*:*".parse().unwrap();
        let scan = scan_process(std::process::id(), &pattern).unwrap();
        let skipped: Vec<String> = scan
            .skipped
            .iter()
            .map(|(object, error)| format!("{}: {error}", object.host_path.display()))
            .collect();
        assert!(skipped.is_empty(), "{skipped:?}");
    }

    #[test]
    fn missing_process_is_reported() {
        let pattern: ProbePattern = "*:*".parse().unwrap();
        // PIDs are capped well below this (pid_max is at most 2^22).
        let err = find_probes_in_process(u32::MAX - 1, &pattern).unwrap_err();
        assert!(
            matches!(err, UsdtError::Process(ProcessError::NoSuch(_))),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("no such process: {}", u32::MAX - 1)
        );
        assert_eq!(
            err.of_target().to_string(),
            format!("process {} exited", u32::MAX - 1)
        );
    }

    /// 100,000 notes in one file, each a probe of its own: all are read and matched, and
    /// planning them fails at the site limit, counted before any work per site. Each step
    /// is linear in the notes by construction: one pass over the notes, a hash set of
    /// addresses, a hash map of probe ids (a search of the probes for every site took 77 s
    /// for 100,000 sites, 1.4 s for 10,000).
    #[test]
    fn a_hundred_thousand_notes_stop_at_the_site_limit() {
        use crate::probe::plan::{PlanError, ProbePlan, SiteInput, SiteMode};
        use tracer_common::{MAX_PROBES, MAX_USDT_SITES};
        use tracer_usdt::test_elf::{NOTE_OWNER, NT_STAPSDT, TEXT_OFF, VADDR};

        const NOTES: u64 = 100_000;
        let base = tracer_usdt::test_elf::base_after_text(NOTES);
        let mut notes = Vec::new();
        for i in 0..NOTES {
            let strings = format!("many\0probe{i}\0-4@%edi\0");
            let desc = tracer_usdt::test_elf::descriptor(
                [VADDR + TEXT_OFF + i, base, 0],
                true,
                true,
                &[strings.as_bytes()],
            );
            notes.extend(tracer_usdt::test_elf::note(NOTE_OWNER, NT_STAPSDT, &desc));
        }
        let dir = std::env::temp_dir().join(format!("tracer-usdt-{}-many", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("many-notes");
        std::fs::write(
            &path,
            tracer_usdt::test_elf::elf_with_text(true, NOTES, &notes),
        )
        .unwrap();
        let found = find_probes_in_file(&path, &"many:*".parse().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        let sites = found.unwrap();
        assert_eq!(sites.len(), NOTES as usize);
        let inputs: Vec<SiteInput> = sites
            .iter()
            .map(|site| SiteInput::try_from(site).unwrap())
            .collect();
        assert_eq!(inputs[NOTES as usize - 1].name, "probe99999");
        assert_eq!(inputs[NOTES as usize - 1].file_offset, TEXT_OFF + NOTES - 1);

        let plan =
            |count: usize| ProbePlan::build(&inputs[..count], &[], &[], SiteMode::Events, None);
        assert_eq!(
            plan(NOTES as usize).unwrap_err(),
            PlanError::TooManySites(NOTES as usize)
        );
        assert_eq!(
            plan(MAX_USDT_SITES as usize + 1).unwrap_err(),
            PlanError::TooManySites(MAX_USDT_SITES as usize + 1)
        );
        // As many sites as may be attached, each its own probe: too many probes.
        assert_eq!(
            plan(MAX_USDT_SITES as usize).unwrap_err(),
            PlanError::TooManyProbes(MAX_USDT_SITES as usize)
        );
        let planned = plan(MAX_PROBES as usize).unwrap();
        assert_eq!(planned.sites.len(), MAX_PROBES as usize);
        assert_eq!(planned.probes.len(), MAX_PROBES as usize);
        assert!(planned.probes.iter().all(|probe| probe.site_count == 1));
    }
}
