//! From what the user typed (`usdt:PATH:PROVIDER:NAME`, with or without a PID) to the
//! probe sites to attach.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use tracer_usdt::Error as FileError;

use super::{
    Functions, Glob, MappedObject, ProbePattern, ProbeSite, UsdtError, UsdtSpecifier,
    dedup_by_file, executable, find_probes_in_file, glob_paths, mapped_objects, scan_process,
    scan_processes, sites_in,
};

/// Where to look for probes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// A running process: its executable and every library it maps.
    Process(u32),
    /// Several processes, as [`Scope::Process`] each, and the file `exe` (which may run
    /// in none of them yet).
    Processes {
        pids: &'a [u32],
        exe: Option<&'a Path>,
    },
    /// Files only, for any process that runs them (and, with a command, `exe` stands in
    /// for a specifier without a path).
    Files { exe: Option<&'a Path> },
    /// Every process running now, as [`Scope::Processes`] (`usdt:*` with no PID): those
    /// that cannot be read (exited meanwhile, kernel threads) are passed over.
    Everything,
}

/// Every site matching any of `specs`, valid or not, each once: what `list` shows.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The sites, in the order found (see [`ProbeSite::offsets`] for which are valid).
    pub sites: Vec<ProbeSite>,
    /// Objects of the process whose notes could not be read at all (undecodable notes,
    /// broken headers, files that vanished), with why.
    pub unreadable: Vec<(MappedObject, UsdtError)>,
}

/// What to attach: the valid sites matching `specs`, and the malformed ones a wildcard
/// matched, which are left out (the caller warns about each).
#[derive(Debug, Default)]
pub(crate) struct Resolved {
    /// Sites to attach, each once, all valid.
    pub sites: Vec<ProbeSite>,
    /// Why each left-out site was left out ([`FileError::InvalidSite`]).
    pub skipped: Vec<UsdtError>,
}

/// The sites matching any of `specs`, each site once, valid or not. Fails when a file
/// cannot be read; finding nothing is not an error here.
pub(crate) fn find(specs: &[UsdtSpecifier], scope: Scope<'_>) -> Result<Found, UsdtError> {
    let (functions, notes): (Vec<UsdtSpecifier>, Vec<UsdtSpecifier>) = specs
        .iter()
        .cloned()
        .partition(|spec| spec.kind.is_function());
    let mut found = match notes.is_empty() {
        true => Found::default(),
        false => find_notes(&notes, scope)?,
    };
    if !functions.is_empty() {
        find_functions(&functions, scope, &mut found)?;
    }
    dedup_by_file(&mut found.sites);
    Ok(found)
}

/// [`find`] for USDT specifiers.
fn find_notes(specs: &[UsdtSpecifier], scope: Scope<'_>) -> Result<Found, UsdtError> {
    let mut found = Found::default();
    match scope {
        Scope::Process(pid) => {
            let scan = scan_process(pid, &ProbePattern::any())?;
            found.unreadable = scan.skipped;
            for site in scan.sites {
                if specs.iter().any(|spec| matches(spec, &site)) {
                    found.sites.push(site);
                }
            }
        }
        Scope::Processes { pids, exe } => {
            let scan = scan_processes(pids, exe, &ProbePattern::any())?;
            found.unreadable = scan.skipped;
            for site in scan.sites {
                if specs.iter().any(|spec| matches(spec, &site)) {
                    found.sites.push(site);
                }
            }
            // A file named by path is searched too: a process that joins later (a fork
            // that executes it) may run it though none of those running now maps it.
            for spec in specs {
                if let Some(path) = spec.path.as_deref()
                    && path.contains('/')
                {
                    search_files(&mut found, spec, files_named(spec, path, None)?)?;
                }
            }
        }
        Scope::Everything => {
            let pids = crate::system::procfs::all_processes();
            let scan = scan_processes(&pids, None, &ProbePattern::any())?;
            found.unreadable = scan.skipped;
            for site in scan.sites {
                if specs.iter().any(|spec| matches(spec, &site)) {
                    found.sites.push(site);
                }
            }
            for spec in specs {
                if let Some(path) = spec.path.as_deref()
                    && path.contains('/')
                {
                    search_files(&mut found, spec, files_named(spec, path, None)?)?;
                }
            }
        }
        Scope::Files { exe } => {
            let mut files: Vec<(Vec<PathBuf>, &UsdtSpecifier)> = Vec::new();
            for spec in specs {
                let paths = match (spec.path.as_deref(), exe) {
                    (None | Some("*"), Some(exe)) => vec![exe.to_path_buf()],
                    (None | Some("*"), None) => return Err(needs_pid(spec)),
                    (Some(path), exe) => files_named(spec, path, exe)?,
                };
                files.push((paths, spec));
            }
            for (paths, spec) in files {
                search_files(&mut found, spec, paths)?;
            }
        }
    }
    Ok(found)
}

/// The objects a function specifier's path names in `scope`: the processes' objects it
/// matches, and the files it names.
fn objects_for(
    spec: &UsdtSpecifier,
    scope: Scope<'_>,
    mapped: &mut std::collections::HashMap<u32, Vec<MappedObject>>,
) -> Result<Vec<MappedObject>, UsdtError> {
    let path = spec.path.as_deref();
    let mut in_processes = |pids: &[u32]| -> Vec<MappedObject> {
        pids.iter()
            .flat_map(|&pid| {
                mapped
                    .entry(pid)
                    .or_insert_with(|| process_objects(pid))
                    .clone()
            })
            .filter(|object| path_matches(path, &object.path))
            .collect()
    };
    let named_files = |exe: Option<&Path>| -> Result<Vec<MappedObject>, UsdtError> {
        let mut objects: Vec<MappedObject> = match path {
            Some(path) if path.contains('/') => files_named(spec, path, exe)?
                .iter()
                .map(|file| MappedObject::from_path(file))
                .collect(),
            _ => Vec::new(),
        };
        // A command's executable, named by its file name (`uprobe:app:f -- ./app`).
        if let Some(exe) = exe
            && path.is_some_and(|p| p != "*" && !p.contains('/') && path_matches(Some(p), exe))
        {
            objects.push(MappedObject::from_path(exe));
        }
        Ok(objects)
    };
    Ok(match scope {
        Scope::Process(pid) => {
            // The process must be there, as for USDT probes.
            executable(pid)?;
            in_processes(&[pid])
        }
        Scope::Processes { pids, exe } => {
            let mut objects = in_processes(pids);
            if let (Some(exe), Some("*") | None) = (exe, path) {
                objects.push(MappedObject::from_path(exe));
            }
            objects.extend(named_files(exe)?);
            objects
        }
        Scope::Everything => {
            let mut objects = in_processes(&crate::system::procfs::all_processes());
            objects.extend(named_files(None)?);
            objects
        }
        Scope::Files { exe } => match (path, exe) {
            (None | Some("*"), Some(exe)) => vec![MappedObject::from_path(exe)],
            (None | Some("*"), None) => return Err(needs_pid(spec)),
            (Some(path), exe) => files_named(spec, path, exe)?
                .iter()
                .map(|file| MappedObject::from_path(file))
                .collect(),
        },
    })
}

/// [`find`] for function specifiers: each object a specifier's path names is read once
/// for its symbols, however many specifiers and processes name it.
fn find_functions(
    specs: &[UsdtSpecifier],
    scope: Scope<'_>,
    found: &mut Found,
) -> Result<(), UsdtError> {
    let mut read: std::collections::HashMap<PathBuf, Option<std::rc::Rc<Functions>>> =
        std::collections::HashMap::new();
    let mut mapped = std::collections::HashMap::new();
    for spec in specs {
        let literal = spec
            .path
            .as_deref()
            .is_some_and(|p| Glob::new(p).is_literal());
        for object in objects_for(spec, scope, &mut mapped)? {
            let functions = if let Some(functions) = read.get(&object.host_path) {
                functions.clone()
            } else {
                let functions = match Functions::read(&object.host_path) {
                    Ok(functions) => Some(std::rc::Rc::new(functions)),
                    Err(error) if literal && object.path.to_string_lossy() != "*" => {
                        return Err(error);
                    }
                    Err(error) => {
                        log::debug!("{}: {error}", object.host_path.display());
                        None
                    }
                };
                read.insert(object.host_path.clone(), functions.clone());
                functions
            };
            if let Some(functions) = functions {
                found.sites.extend(functions.sites(&object, spec)?);
            }
        }
    }
    Ok(())
}

/// The sites to attach for `specs`. A site whose note fails validation is an error when a
/// specifier names its probe literally (no wildcard in provider and name), and is left
/// out, in [`Resolved::skipped`], when only wildcards match it. Fails when nothing valid
/// matches: with the malformed notes if that is why, with "no probes match" otherwise.
pub(crate) fn resolve(specs: &[UsdtSpecifier], scope: Scope<'_>) -> Result<Resolved, UsdtError> {
    let found = find(specs, scope)?;
    decide(specs, scope, found)
}

/// [`resolve`]'s policy, on what [`find`] found.
fn decide(specs: &[UsdtSpecifier], scope: Scope<'_>, found: Found) -> Result<Resolved, UsdtError> {
    let mut resolved = Resolved::default();
    let mut named_invalid = Vec::new();
    for site in found.sites {
        match site.offsets() {
            Ok(_) => resolved.sites.push(site),
            Err(problem) => {
                let named = specs
                    .iter()
                    .any(|spec| is_literal_probe(spec) && matches_in(spec, &site, scope));
                if named {
                    named_invalid.push(problem);
                } else {
                    resolved.skipped.push(problem);
                }
            }
        }
    }
    if !named_invalid.is_empty() {
        return Err(several(named_invalid));
    }
    // Objects whose notes cannot be read: an error when a specifier names the object (by
    // name or path, without wildcards), since the probes asked for may be among those notes; and,
    // when nothing else matches, the likely reason why.
    let named = |object: &MappedObject| {
        specs.iter().any(|spec| {
            spec.path
                .as_deref()
                .is_some_and(|p| Glob::new(p).is_literal())
                && path_matches(spec.path.as_deref(), &object.path)
        })
    };
    let searched = |object: &MappedObject| {
        specs
            .iter()
            .any(|spec| path_matches(spec.path.as_deref(), &object.path))
    };
    let (named_broken, other_broken): (Vec<_>, Vec<_>) = found
        .unreadable
        .into_iter()
        .filter(|(object, error)| is_malformed(error) && searched(object))
        .partition(|(object, _)| named(object));
    if !named_broken.is_empty() {
        return Err(several(named_broken.into_iter().map(|(_, e)| e).collect()));
    }
    if resolved.sites.is_empty() {
        if !resolved.skipped.is_empty() {
            return Err(several(resolved.skipped));
        }
        if !other_broken.is_empty() {
            return Err(several(other_broken.into_iter().map(|(_, e)| e).collect()));
        }
        return Err(nothing_matches(specs, scope));
    }
    Ok(resolved)
}

/// Why [`find`] found nothing: malformed notes in the objects searched, or "no probes
/// match".
pub(crate) fn why_none(specs: &[UsdtSpecifier], scope: Scope<'_>, found: Found) -> UsdtError {
    match decide(specs, scope, found) {
        Err(error) => error,
        Ok(_) => nothing_matches(specs, scope),
    }
}

/// The error for finding no probe: "no probes match", or, for a file asked for all its
/// probes (`tracer list FILE`), that it has none.
fn nothing_matches(specs: &[UsdtSpecifier], scope: Scope<'_>) -> UsdtError {
    if let ([spec], Scope::Files { .. }) = (specs, scope)
        && let Some(path) = spec.path.as_deref().filter(|p| Glob::new(p).is_literal())
        && spec.pattern.provider.as_str() == "*"
        && spec.pattern.name.as_str() == "*"
    {
        return UsdtError::NoUsdtProbes {
            path: path.to_string(),
        };
    }
    let wanted: Vec<String> = specs.iter().map(describe).collect();
    let place = match scope {
        Scope::Process(pid) => format!("process {pid}"),
        Scope::Processes { pids, exe } => {
            let mut places: Vec<String> = pids.iter().map(|p| format!("process {p}")).collect();
            places.extend(exe.map(|e| e.display().to_string()));
            match places.is_empty() {
                true => "the traced processes (none is running)".into(),
                false => places.join(", "),
            }
        }
        Scope::Files { .. } => "the given files".to_string(),
        Scope::Everything => "any running process".to_string(),
    };
    UsdtError::NoProbes {
        wanted: wanted.join(", "),
        place,
    }
}

/// One error for several: the first, with a count of the others.
fn several(mut errors: Vec<UsdtError>) -> UsdtError {
    let more = errors.len() - 1;
    let first = errors.swap_remove(0);
    if more == 0 {
        first
    } else {
        UsdtError::Several {
            first: Box::new(first),
            more,
        }
    }
}

/// Whether a file's notes are broken (as opposed to the file being unreadable).
fn is_malformed(error: &UsdtError) -> bool {
    matches!(
        error,
        UsdtError::File(FileError::MalformedNote { .. } | FileError::BadElf { .. })
    )
}

/// Whether `spec` names one probe: no wildcard in provider or name.
fn is_literal_probe(spec: &UsdtSpecifier) -> bool {
    spec.pattern.provider.is_literal() && spec.pattern.name.is_literal()
}

/// Whether `spec` selects `site`: in a process by name and path, in files by name and
/// the specifier's own file.
fn matches_in(spec: &UsdtSpecifier, site: &ProbeSite, scope: Scope<'_>) -> bool {
    if spec.kind != site.kind || !spec.pattern.matches(&site.note.provider, &site.note.name) {
        return false;
    }
    match (scope, spec.path.as_deref()) {
        (Scope::Process(_) | Scope::Processes { .. } | Scope::Everything, _) => matches(spec, site),
        (Scope::Files { exe }, None | Some("*")) => exe == Some(site.binary.path.as_path()),
        (Scope::Files { exe }, Some(path)) => {
            let command = exe.filter(|exe| *exe == site.binary.path);
            Glob::new(&absolute_pattern(path)).matches(&site.binary.path.to_string_lossy())
                || command.is_some_and(|exe| path_matches(Some(path), exe))
        }
    }
}

/// The files searched already (by device and inode, however a process names them): a
/// file is searched for probes, and its sites attached, once.
#[derive(Debug, Default)]
pub(crate) struct Searched(HashSet<(u64, u64)>);

impl Searched {
    /// Marks `path`; false when it was marked already or cannot be read (then it is
    /// passed over: a library that vanished has nothing to attach).
    fn mark(&mut self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match std::fs::metadata(path) {
            Ok(meta) => self.0.insert((meta.dev(), meta.ino())),
            Err(_) => false,
        }
    }

    /// How many files are marked.
    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    /// Marks every file of `sites` and, for each of `pids`, every object it maps now:
    /// what [`resolve`] searched.
    pub(crate) fn of_resolved(sites: &[ProbeSite], pids: &[u32]) -> Self {
        let mut searched = Searched::default();
        for site in sites {
            searched.mark(&site.binary.host_path);
        }
        for &pid in pids {
            for object in process_objects(pid) {
                searched.mark(&object.host_path);
            }
        }
        searched
    }
}

/// Process `pid`'s executable and mapped objects; none when it cannot be read (exited).
fn process_objects(pid: u32) -> Vec<MappedObject> {
    executable(pid)
        .into_iter()
        .chain(mapped_objects(pid).unwrap_or_default())
        .collect()
}

/// The valid sites `specs` select (by name and path, as in a process) in the files
/// process `pid` maps that were not searched yet (a library it `dlopen`ed, a new
/// process's executable), and why sites of those files were left out. A file that cannot
/// be read is passed over: such a file may be searched again when another process maps
/// it, so it is not marked.
pub(crate) fn find_new(
    specs: &[UsdtSpecifier],
    pid: u32,
    searched: &mut Searched,
) -> (Vec<ProbeSite>, Vec<UsdtError>) {
    let (mut sites, mut skipped) = (Vec::new(), Vec::new());
    for object in process_objects(pid) {
        if !searched.mark(&object.host_path) {
            continue;
        }
        let mut functions = None;
        for spec in specs.iter().filter(|spec| spec.kind.is_function()) {
            if !path_matches(spec.path.as_deref(), &object.path) {
                continue;
            }
            let Some(read) =
                functions.get_or_insert_with(|| Functions::read(&object.host_path).ok())
            else {
                break;
            };
            match read.sites(&object, spec) {
                Ok(found) => sites.extend(found),
                Err(problem) => skipped.push(problem),
            }
        }
        if specs.iter().all(|spec| spec.kind.is_function()) {
            continue;
        }
        let Ok(found) = sites_in(&object, &ProbePattern::any()) else {
            continue;
        };
        for site in found {
            if !specs.iter().any(|spec| matches(spec, &site)) {
                continue;
            }
            match site.offsets() {
                Ok(_) => sites.push(site),
                Err(problem) => skipped.push(problem),
            }
        }
    }
    (sites, skipped)
}

/// The files a specifier's path names outside a process: the file itself, or each ELF
/// file its wildcards match in the filesystem (other files, sources or scripts next to
/// the binaries, are passed over), made absolute. With a command, its executable too
/// when the path matches it (by file name for a path without a slash, as in a process).
fn files_named(
    spec: &UsdtSpecifier,
    path: &str,
    exe: Option<&Path>,
) -> Result<Vec<PathBuf>, UsdtError> {
    if Glob::new(path).is_literal() {
        let file = in_search_path(path).unwrap_or_else(|| PathBuf::from(path));
        return Ok(vec![absolute(&file)?]);
    }
    let mut files: Vec<PathBuf> = Vec::new();
    let command = exe.filter(|exe| path_matches(Some(path), exe));
    for file in command
        .map(Path::to_path_buf)
        .into_iter()
        .chain(glob_paths(path).into_iter().filter(|p| is_elf_file(p)))
    {
        let file = absolute(&file)?;
        if !files.contains(&file) {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(UsdtError::NoFiles {
            path: path.to_owned(),
            spec: describe(spec),
        });
    }
    Ok(files)
}

/// Adds the sites of `spec`'s probes in `files`. A file that only a wildcard matched and
/// whose notes are broken is set aside in [`Found::unreadable`] (what `decide` reports if
/// nothing else matches), so that it does not hide the others' probes.
fn search_files(
    found: &mut Found,
    spec: &UsdtSpecifier,
    files: Vec<PathBuf>,
) -> Result<(), UsdtError> {
    let wildcard = spec
        .path
        .as_deref()
        .is_some_and(|p| !Glob::new(p).is_literal());
    for file in files {
        match find_probes_in_file(&file, &spec.pattern) {
            Ok(sites) => found.sites.extend(sites),
            Err(error) if wildcard && is_malformed(&error) => found
                .unreadable
                .push((MappedObject::from_path(&file), error)),
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Whether `path` is a regular file starting with the ELF magic number.
fn is_elf_file(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut file| file.read_exact(&mut magic))
            .is_ok()
        && magic == *b"\x7fELF"
}

fn needs_pid(spec: &UsdtSpecifier) -> UsdtError {
    let what = match spec.path {
        None => "a probe without a path",
        Some(_) => "the path *",
    };
    UsdtError::from(FileError::BadSpecifier {
        spec: describe(spec),
        reason: format!(
            "{what} means every object of a process: give --pid, or a command after --"
        ),
    })
}

fn describe(spec: &UsdtSpecifier) -> String {
    spec.describe()
}

/// Makes a user-given path absolute (as bpftrace prints it) and checks it exists.
/// A bare command name (no `/`) that is no file here, as bpftrace finds it: the first
/// executable ELF file of that name in `$PATH` (a wrapper script, as pyenv's shims, is
/// passed over: it has no probes).
fn in_search_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') || Path::new(name).exists() {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|file| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                && is_elf_file(file)
        })
}

fn absolute(path: &Path) -> Result<PathBuf, UsdtError> {
    std::fs::canonicalize(path).map_err(|source| {
        UsdtError::from(FileError::Io {
            path: path.to_path_buf(),
            source,
        })
    })
}

/// Whether a site found in a process is what `spec` asks for.
fn matches(spec: &UsdtSpecifier, site: &ProbeSite) -> bool {
    if spec.kind != site.kind || !spec.pattern.matches(&site.note.provider, &site.note.name) {
        return false;
    }
    path_matches(spec.path.as_deref(), &site.binary.path)
}

/// A specifier's path matches a mapped object by full path, or by file name when it has
/// no slash (`libjvm.so`), with wildcards either way. A full path matches as given (the
/// object's path in the process's own mount namespace) or made absolute as
/// [`absolute_pattern`] does (`./lib/lib*`, `/lib/libc*` with /lib a link).
fn path_matches(wanted: Option<&str>, path: &Path) -> bool {
    let Some(wanted) = wanted else { return true };
    let path_text = path.to_string_lossy();
    if wanted.contains('/') {
        Glob::new(wanted).matches(&path_text)
            || Glob::new(&absolute_pattern(wanted)).matches(&path_text)
    } else {
        path.file_name()
            .is_some_and(|name| Glob::new(wanted).matches(&name.to_string_lossy()))
    }
}

/// A path pattern made absolute as the kernel names mapped files: its leading components
/// without wildcards resolved through the filesystem (the current directory, `.`, `..`,
/// symbolic links), or lexically when they do not exist here; the rest kept as it is.
/// Resolved components are escaped, so a `[` or `*` in a real directory name matches only
/// itself.
fn absolute_pattern(wanted: &str) -> String {
    if let Some(file) = in_search_path(wanted).and_then(|f| std::fs::canonicalize(f).ok()) {
        return escape_glob(&file.to_string_lossy());
    }
    let components: Vec<&str> = wanted.split('/').collect();
    let fixed = components
        .iter()
        .take_while(|c| Glob::new(c).is_literal())
        .count();
    let (prefix, rest) = components.split_at(fixed);
    let prefix = match prefix.join("/") {
        p if p.is_empty() && wanted.starts_with('/') => "/".to_string(),
        p if p.is_empty() => ".".to_string(),
        p => p,
    };
    let resolved = std::fs::canonicalize(&prefix).unwrap_or_else(|_| lexically_absolute(&prefix));
    let mut pattern = escape_glob(&resolved.to_string_lossy());
    for component in rest {
        if !pattern.ends_with('/') {
            pattern.push('/');
        }
        pattern.push_str(component);
    }
    pattern
}

/// `path` joined to the current directory, `.` and `..` taken out without the filesystem.
fn lexically_absolute(path: &str) -> PathBuf {
    use std::path::Component;
    let joined = std::env::current_dir().unwrap_or_default().join(path);
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `text` as a glob that matches exactly it.
pub(crate) fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '*' | '?' | '[' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{SiteOffsets, SiteProblem, UsdtNote, parse_specifier};
    use super::*;

    const LIB: &str = "/usr/lib/libdemo.so";

    /// A site of probe `p:NAME` in LIB, valid or with `problem`.
    fn site(name: &str, problem: Option<SiteProblem>) -> ProbeSite {
        let note = UsdtNote {
            provider: "p".into(),
            name: name.into(),
            pc: 0x1000,
            semaphore: None,
            arg_spec: String::new(),
            note_offset: 0x2a0,
            location: problem.map_or(
                Ok(SiteOffsets {
                    probe: 0x1000,
                    semaphore: None,
                    nop5: false,
                }),
                Err,
            ),
        };
        ProbeSite {
            binary: MappedObject::from_path(Path::new(LIB)),
            note,
            args: Ok(Vec::new()),
            kind: super::super::ProbeKind::Usdt,
            function: None,
        }
    }

    fn pc_zero() -> Option<SiteProblem> {
        Some(SiteProblem::ProbeOutsideSegments { pc: 0 })
    }

    fn decide_in_process(specs: &[&str], sites: Vec<ProbeSite>) -> Result<Resolved, UsdtError> {
        let specs: Vec<UsdtSpecifier> = specs.iter().map(|s| parse_specifier(s).unwrap()).collect();
        let found = Found {
            sites,
            unreadable: Vec::new(),
        };
        decide(&specs, Scope::Process(1), found)
    }

    #[test]
    fn a_probe_named_literally_with_a_malformed_site_is_an_error() {
        let sites = || vec![site("good", None), site("bad", pc_zero())];
        for spec in ["usdt:*:p:bad", "usdt:libdemo.so:p:bad", "usdt:*:p:*"] {
            let both = [spec, "usdt:*:p:bad"];
            let err = decide_in_process(&both, sites()).unwrap_err();
            assert_eq!(
                err.to_string(),
                "malformed note in /usr/lib/libdemo.so at offset 0x2a0 (p:bad): probe address \
                 0x0 is in no loadable segment",
                "{spec}"
            );
        }
    }

    #[test]
    fn a_wildcard_skips_malformed_sites_and_keeps_the_rest() {
        for spec in ["usdt:*:p:*", "usdt:*:*:bad", "usdt:libdemo*:p:ba?"] {
            let resolved = decide_in_process(
                &[spec, "usdt:*:p:good"],
                vec![site("good", None), site("bad", pc_zero())],
            )
            .unwrap();
            let names: Vec<&str> = resolved
                .sites
                .iter()
                .map(|s| s.note.name.as_str())
                .collect();
            assert_eq!(names, ["good"], "{spec}");
            assert_eq!(resolved.skipped.len(), 1);
            assert!(matches!(
                &resolved.skipped[0],
                UsdtError::File(FileError::InvalidSite { name, .. }) if name == "bad"
            ));
        }
    }

    #[test]
    fn only_malformed_sites_matching_is_reported_as_malformed() {
        let err = decide_in_process(
            &["usdt:*:p:*"],
            vec![site("bad", pc_zero()), site("worse", pc_zero())],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("malformed note in /usr/lib/libdemo.so at offset 0x2a0 (p:bad)"),
            "{err}"
        );
        assert!(err.ends_with("(and 1 more malformed notes)"), "{err}");
        let err = decide_in_process(&["usdt:*:p:*"], vec![]).unwrap_err();
        assert!(matches!(err, UsdtError::NoProbes { .. }), "{err}");
    }

    #[test]
    fn libraries_with_undecodable_notes_are_reported_not_ignored() {
        let broken = || {
            let object = MappedObject::from_path(Path::new(LIB));
            let error = UsdtError::from(FileError::MalformedNote {
                path: LIB.into(),
                offset: 0x2bc,
                reason: "probe name is not NUL-terminated".into(),
            });
            vec![(object, error)]
        };
        let decide_with = |spec: &str, sites: Vec<ProbeSite>| {
            let found = Found {
                sites,
                unreadable: broken(),
            };
            decide(&[parse_specifier(spec).unwrap()], Scope::Process(1), found)
        };
        let expected = "malformed note in /usr/lib/libdemo.so at offset 0x2bc: probe name is \
                        not NUL-terminated";
        // Named: an error even though another object has the probe.
        let err = decide_with("usdt:libdemo.so:p:good", vec![site("good", None)]).unwrap_err();
        assert_eq!(err.to_string(), expected);
        // Not named, nothing else found: why nothing was found.
        let err = decide_with("usdt:*:p:good", vec![]).unwrap_err();
        assert_eq!(err.to_string(), expected);
        // Not named, the probe found elsewhere: fine.
        assert_eq!(
            decide_with("usdt:*:p:good", vec![site("good", None)])
                .unwrap()
                .sites
                .len(),
            1
        );
        // Another library named: fine (no probes match there, which is its own error).
        let err = decide_with("usdt:libother.so:p:good", vec![]).unwrap_err();
        assert!(matches!(err, UsdtError::NoProbes { .. }), "{err}");
    }

    #[test]
    fn paths_match_by_name_or_full_path() {
        let lib = Path::new("/usr/lib/jvm/java-17/lib/server/libjvm.so");
        assert!(path_matches(None, lib));
        assert!(path_matches(Some("*"), lib));
        assert!(path_matches(Some("libjvm.so"), lib));
        assert!(path_matches(Some("libjvm*"), lib));
        assert!(path_matches(Some("/usr/lib/jvm/*/libjvm.so"), lib));
        assert!(!path_matches(Some("libc.so.6"), lib));
        assert!(!path_matches(Some("/opt/libjvm.so"), lib));
    }

    #[test]
    fn relative_and_linked_paths_match_what_the_process_maps() {
        let cwd = std::env::current_dir().unwrap();
        let dir = std::env::temp_dir().join(format!("tracer-resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real/lib")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        let lib = dir.join("real/lib/libgx.so");
        let wanted = |p: &str| path_matches(Some(&p.replace("DIR", dir.to_str().unwrap())), &lib);
        assert!(wanted("DIR/link/lib/lib*"), "a link before the wildcard");
        assert!(wanted("DIR/real/./lib/../lib/libgx.so"));
        assert!(wanted("DIR/*/lib/libgx.so"));
        assert!(!wanted("DIR/link/lib/libc*"));
        // Relative to the current directory (through `..` up to the root).
        let up: PathBuf = cwd.components().skip(1).map(|_| "..").collect();
        let from_cwd = up.join(lib.strip_prefix("/").unwrap());
        assert!(
            path_matches(Some(from_cwd.to_str().unwrap()), &lib),
            "{from_cwd:?}"
        );
        let glob = from_cwd.with_file_name("lib*.so");
        assert!(path_matches(Some(glob.to_str().unwrap()), &lib), "{glob:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bare_command_name_is_looked_up_in_the_search_path() {
        // `sh` is in every PATH here, and no file of that name in the crate's directory.
        let sh = in_search_path("sh").expect("sh in PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(in_search_path("./sh"), None);
        assert_eq!(
            in_search_path("Cargo.toml"),
            None,
            "a file here is taken as it is"
        );
        assert_eq!(in_search_path("no-such-command-anywhere"), None);
        let canonical = std::fs::canonicalize(&sh).unwrap();
        assert_eq!(
            absolute_pattern("sh"),
            escape_glob(&canonical.to_string_lossy())
        );
    }

    #[test]
    fn absolute_patterns() {
        assert_eq!(absolute_pattern("/no/such/dir/lib*"), "/no/such/dir/lib*");
        assert_eq!(absolute_pattern("/no/such/../dir/./x"), "/no/dir/x");
        assert_eq!(absolute_pattern("/*/x"), "/*/x");
        let cwd = std::fs::canonicalize(".").unwrap();
        assert_eq!(absolute_pattern("./a*"), format!("{}/a*", cwd.display()));
        assert_eq!(absolute_pattern("a*/b"), format!("{}/a*/b", cwd.display()));
        assert_eq!(escape_glob("/x[1]/a*?"), "/x[[]1]/a[*][?]");
        assert!(Glob::new(&escape_glob("/x[1]/a*")).matches("/x[1]/a*"));
        assert!(!Glob::new(&escape_glob("/x[1]/a*")).matches("/x1/ab"));
    }

    #[test]
    fn wildcard_paths_that_match_no_file_say_so() {
        for spec in [
            "usdt:/no/such/dir/*/libjvm.so:hotspot:gc__begin",
            "usdt:./no-such-file*:p:n",
        ] {
            let spec = parse_specifier(spec).unwrap();
            let err = resolve(std::slice::from_ref(&spec), Scope::Files { exe: None }).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "no ELF file matches the path {} of {}",
                    spec.path.as_deref().unwrap(),
                    describe(&spec)
                )
            );
        }
        // Files that are not ELF are passed over.
        let spec = parse_specifier("usdt:/etc/host*:p:n").unwrap();
        let err = resolve(&[spec], Scope::Files { exe: None }).unwrap_err();
        assert!(matches!(err, UsdtError::NoFiles { .. }), "{err}");
    }

    #[test]
    fn every_object_needs_a_process() {
        for spec in ["usdt:*", "usdt:*:p:n", "usdt::p:n"] {
            let spec = parse_specifier(spec).unwrap();
            let err = resolve(&[spec], Scope::Files { exe: None }).unwrap_err();
            assert!(
                err.to_string()
                    .contains("give --pid, or a command after --"),
                "{err}"
            );
        }
    }

    #[test]
    fn nothing_matching_is_an_error() {
        let python = Path::new("/usr/bin/python3.11");
        if !python.exists() {
            eprintln!("skipped: {} is not installed", python.display());
            return;
        }
        let spec =
            super::super::parse_specifier("usdt:/usr/bin/python3.11:python:no_such_probe").unwrap();
        let err = resolve(&[spec], Scope::Files { exe: None }).unwrap_err();
        assert!(err.to_string().contains("no probes match"), "{err}");
        let spec = super::super::parse_specifier("usdt:/usr/bin/python3.11:python:gc__*").unwrap();
        let resolved = resolve(&[spec], Scope::Files { exe: None }).unwrap();
        assert!(resolved.sites.iter().any(|s| s.note.name == "gc__start"));
        assert!(resolved.skipped.is_empty());
    }
}
