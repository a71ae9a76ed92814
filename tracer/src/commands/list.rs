//! `tracer list [--pid PID] [-v] [TARGET]`: the USDT probes of a file or a process, one per
//! line as bpftrace spells them; `-v` adds every site. Sites whose notes are malformed
//! (see `usdt::validate`) are listed too, marked, with `-v` saying what is wrong. A
//! function specifier (`uprobe:FILE:*gc*`) lists the functions it matches.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Result;

use crate::{
    cli::ListConfig,
    probe::usdt::{self, ProbeSite, Scope, UsdtSpecifier},
    system::text::escape_text,
};

pub(crate) fn run(config: ListConfig) -> Result<()> {
    let spec = target_specifier(config.target.as_deref(), config.pid.is_some())?;
    let scope = match config.pid {
        Some(pid) => Scope::Process(pid.get()),
        None => Scope::Files { exe: None },
    };
    let specs = std::slice::from_ref(&spec);
    let found = usdt::find(specs, scope)?;
    if found.sites.is_empty() {
        return Err(usdt::why_none(specs, scope, found).into());
    }
    crate::system::console::print(render(&found.sites, config.verbose))?;
    Ok(())
}

/// What the user named: a bpftrace specifier (`usdt:...`, `*:FILE:*`), a file, or (with a
/// PID) a probe pattern.
fn target_specifier(target: Option<&str>, have_pid: bool) -> Result<UsdtSpecifier> {
    let Some(target) = target else {
        if have_pid {
            return Ok(usdt::parse_specifier("usdt:*:*:*")?);
        }
        anyhow::bail!(
            "nothing to list: give a file (tracer list /usr/bin/python3.11) or --pid PID"
        );
    };
    if usdt::has_probe_type(target) {
        return Ok(usdt::parse_specifier(target)?);
    }
    if target.contains('/') || (!have_pid && !target.contains(':')) {
        return Ok(usdt::parse_specifier(&format!("usdt:{target}:*:*"))?);
    }
    // A probe pattern within the process: `python:gc__*` or `gc__*`.
    let pattern = if target.contains(':') {
        target.to_string()
    } else {
        format!("*:{target}")
    };
    Ok(usdt::parse_specifier(&format!("usdt:*:{pattern}"))?)
}

/// One line per probe, sorted by file then provider and name; with `verbose`, each site.
fn render(sites: &[ProbeSite], verbose: bool) -> String {
    let mut probes: BTreeMap<(PathBuf, String, String, usdt::ProbeKind), Vec<&ProbeSite>> =
        BTreeMap::new();
    for site in sites {
        let key = (
            site.binary.path.clone(),
            site.note.provider.clone(),
            site.note.name.clone(),
            site.kind,
        );
        probes.entry(key).or_default().push(site);
    }
    let mut out = String::new();
    for ((path, provider, name, kind), sites) in probes {
        if kind.is_function() {
            out.push_str(&escape_text(&format!("{kind}:{}:{name}", path.display())));
            out.push('\n');
            if verbose {
                for site in sites {
                    out.push_str(&escape_text(&function_details(site)));
                    out.push('\n');
                }
            }
            continue;
        }
        let probe = format!("usdt:{}:{provider}:{name}", path.display());
        out.push_str(&escape_text(&probe));
        let malformed = sites.iter().filter(|s| !s.is_valid()).count();
        if malformed > 0 {
            out.push_str(&format!(
                " ({malformed} of {} sites malformed{})",
                sites.len(),
                if verbose { "" } else { "; -v says why" }
            ));
        }
        out.push('\n');
        if !verbose {
            continue;
        }
        for site in sites {
            let note = &site.note;
            let args = match &site.args {
                Ok(args) if args.is_empty() => "no arguments".to_string(),
                Ok(args) => args
                    .iter()
                    .map(|arg| match arg {
                        Ok(arg) => usdt::describe(arg),
                        Err(why) => format!("unavailable ({why})"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(reason) => format!("undecodable: {reason}"),
            };
            match &note.location {
                Ok(offsets) => {
                    let semaphore = match (note.semaphore, offsets.semaphore) {
                        (Some(addr), Some(off)) => {
                            format!("semaphore {addr:#x} (file offset {off:#x})")
                        }
                        _ => "no semaphore".into(),
                    };
                    let nop5 = if offsets.nop5 {
                        ", attached at its 5-byte nop (an optimized uprobe)"
                    } else {
                        ""
                    };
                    out.push_str(&format!(
                        "  site pc {:#x} (file offset {:#x}{nop5}), {semaphore}\n",
                        note.pc, offsets.probe
                    ));
                }
                Err(problem) => out.push_str(&format!(
                    "  malformed site pc {:#x}{} (note at file offset {:#x}): {problem}\n",
                    note.pc,
                    note.semaphore
                        .map(|addr| format!(", semaphore {addr:#x}"))
                        .unwrap_or_default(),
                    note.note_offset
                )),
            }
            out.push_str(&format!(
                "    args \"{}\": {}\n",
                escape_text(&note.arg_spec),
                escape_text(&args)
            ));
        }
    }
    out
}

/// `-v` for a function: its address, size, file offset and demangled name.
fn function_details(site: &ProbeSite) -> String {
    let offset = site.note.file_offset().unwrap_or_default();
    match &site.function {
        Some(function) => format!(
            "  function {} at {:#x}, {} bytes (probe at {:#x}, file offset {offset:#x})",
            function.demangled(),
            function.address,
            function.size,
            site.note.pc
        ),
        None => format!(
            "  address {:#x} (file offset {offset:#x}), in no function of the symbol tables",
            site.note.pc
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths, providers, names and argument specs are the target's: control characters
    /// in them are escaped, one probe per line whatever its name holds.
    #[test]
    fn names_are_escaped() {
        let site = ProbeSite {
            binary: usdt::MappedObject::from_path(std::path::Path::new("/tmp/x\x1b]0;t\x07")),
            note: usdt::UsdtNote {
                provider: "p\x1b[31m".into(),
                name: "gc\nusdt:/bin/sh:fake:probe".into(),
                pc: 0x10,
                semaphore: None,
                arg_spec: "8@%rdi\x1b[A".into(),
                note_offset: 0x200,
                location: Ok(usdt::SiteOffsets {
                    probe: 0x10,
                    semaphore: None,
                    nop5: false,
                }),
            },
            args: Err("bad \x1b[A".into()),
            kind: usdt::ProbeKind::Usdt,
            function: None,
        };
        let text = render(std::slice::from_ref(&site), false);
        assert_eq!(
            text,
            "usdt:/tmp/x\\x1b]0;t\\x07:p\\x1b[31m:gc\\x0ausdt:/bin/sh:fake:probe\n"
        );
        let verbose = render(&[site], true);
        assert!(!verbose.contains('\x1b'), "{verbose}");
        assert!(
            verbose.contains("args \"8@%rdi\\x1b[A\": undecodable: bad \\x1b[A\n"),
            "{verbose}"
        );
    }

    #[test]
    fn targets_become_specifiers() {
        let spec = |t, pid| target_specifier(Some(t), pid).unwrap();
        assert_eq!(
            spec("/usr/bin/python3.11", false).path.as_deref(),
            Some("/usr/bin/python3.11")
        );
        assert_eq!(spec("./app", false).pattern.to_string(), "*:*");
        assert_eq!(
            spec("python:gc__*", true).pattern.to_string(),
            "python:gc__*"
        );
        assert_eq!(spec("gc__*", true).pattern.to_string(), "*:gc__*");
        assert_eq!(spec("usdt:/bin/x:p:n", false).pattern.to_string(), "p:n");
        assert!(target_specifier(None, false).is_err());
        assert_eq!(
            target_specifier(None, true).unwrap().path.as_deref(),
            Some("*")
        );
    }

    #[test]
    fn malformed_sites_are_listed_and_marked() {
        use crate::probe::usdt::{MappedObject, SiteOffsets, SiteProblem, UsdtNote};
        let site = |pc, location| ProbeSite {
            binary: MappedObject::from_path(std::path::Path::new("/bin/app")),
            note: UsdtNote {
                provider: "p".into(),
                name: "n".into(),
                pc,
                semaphore: Some(0x3001),
                arg_spec: "8@%rdi".into(),
                note_offset: 0x2a0,
                location,
            },
            args: Ok(vec![]),
            kind: usdt::ProbeKind::Usdt,
            function: None,
        };
        let sites = [
            site(
                0x1000,
                Ok(SiteOffsets {
                    probe: 0x1000,
                    semaphore: Some(0x2000),
                    nop5: false,
                }),
            ),
            site(
                0x1004,
                Err(SiteProblem::SemaphoreMisaligned { addr: 0x3001 }),
            ),
        ];
        assert_eq!(
            render(&sites, false),
            "usdt:/bin/app:p:n (1 of 2 sites malformed; -v says why)\n"
        );
        let verbose = render(&sites, true);
        assert!(
            verbose.contains("  site pc 0x1000 (file offset 0x1000), semaphore 0x3001"),
            "{verbose}"
        );
        assert!(
            verbose.contains(
                "  malformed site pc 0x1004, semaphore 0x3001 (note at file offset 0x2a0): \
                 semaphore 0x3001 is not 2-byte aligned\n"
            ),
            "{verbose}"
        );
    }
}
