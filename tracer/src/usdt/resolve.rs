//! From what the user typed (`usdt:PATH:PROVIDER:NAME`, with or without a PID) to the
//! probe sites to attach.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use super::{
    Glob, ProbePattern, ProbeSite, UsdtError, UsdtSpecifier, find_probes_in_file, scan_process,
};

/// Where to look for probes.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// A running process: its executable and every library it maps.
    Process(u32),
    /// Files only, for any process that runs them (and, with a command, `exe` stands in
    /// for a specifier without a path).
    Files { exe: Option<&'a Path> },
}

/// The sites matching any of `specs`, each site once. Fails when nothing matches.
pub fn resolve(specs: &[UsdtSpecifier], scope: Scope<'_>) -> Result<Vec<ProbeSite>, UsdtError> {
    let mut sites = Vec::new();
    match scope {
        Scope::Process(pid) => {
            let scan = scan_process(pid, &ProbePattern::any())?;
            for site in scan.sites {
                if specs.iter().any(|spec| matches(spec, &site)) {
                    sites.push(site);
                }
            }
        }
        Scope::Files { exe } => {
            let mut files: Vec<(PathBuf, &UsdtSpecifier)> = Vec::new();
            for spec in specs {
                let path = match (spec.path.as_deref(), exe) {
                    (None | Some("*"), Some(exe)) => exe.to_path_buf(),
                    (None | Some("*"), None) => return Err(needs_pid(spec, "a path")),
                    (Some(path), _) if Glob::new(path).is_literal() => absolute(Path::new(path))?,
                    (Some(_), _) => return Err(needs_pid(spec, "a path with wildcards")),
                };
                files.push((path, spec));
            }
            for (path, spec) in files {
                sites.extend(find_probes_in_file(&path, &spec.pattern)?);
            }
        }
    }
    let mut seen = HashSet::new();
    sites.retain(|s| seen.insert((s.binary.host_path.clone(), s.note.file_offset)));
    if sites.is_empty() {
        let wanted: Vec<String> = specs.iter().map(describe).collect();
        let place = match scope {
            Scope::Process(pid) => format!("process {pid}"),
            Scope::Files { .. } => "the given files".to_string(),
        };
        return Err(UsdtError::NoProbes {
            wanted: wanted.join(", "),
            place,
        });
    }
    Ok(sites)
}

fn needs_pid(spec: &UsdtSpecifier, what: &str) -> UsdtError {
    UsdtError::BadSpecifier {
        spec: describe(spec),
        reason: format!(
            "{what} can only be searched in a process: give --pid, or a command after --"
        ),
    }
}

fn describe(spec: &UsdtSpecifier) -> String {
    format!(
        "usdt:{}:{}",
        spec.path.as_deref().unwrap_or(""),
        spec.pattern
    )
}

/// Makes a user-given path absolute (as bpftrace prints it) and checks it exists.
fn absolute(path: &Path) -> Result<PathBuf, UsdtError> {
    std::fs::canonicalize(path).map_err(|source| UsdtError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Whether a site found in a process is what `spec` asks for.
fn matches(spec: &UsdtSpecifier, site: &ProbeSite) -> bool {
    if !spec.pattern.matches(&site.note.provider, &site.note.name) {
        return false;
    }
    path_matches(spec.path.as_deref(), &site.binary.path)
}

/// A specifier's path matches a mapped object by full path, or by file name when it has
/// no slash (`libjvm.so`), with wildcards either way.
fn path_matches(wanted: Option<&str>, path: &Path) -> bool {
    let Some(wanted) = wanted else { return true };
    let glob = Glob::new(wanted);
    if wanted.contains('/') {
        let canonical = std::fs::canonicalize(wanted).ok();
        glob.matches(&path.to_string_lossy()) || canonical.as_deref() == Some(path)
    } else {
        path.file_name()
            .is_some_and(|name| glob.matches(&name.to_string_lossy()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn wildcard_paths_need_a_process() {
        let spec =
            super::super::parse_specifier("usdt:/usr/lib/*/libjvm.so:hotspot:gc__begin").unwrap();
        let err = resolve(&[spec], Scope::Files { exe: None }).unwrap_err();
        assert!(err.to_string().contains("--pid"), "{err}");
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
        let sites = resolve(&[spec], Scope::Files { exe: None }).unwrap();
        assert!(sites.iter().any(|s| s.note.name == "gc__start"));
    }
}
