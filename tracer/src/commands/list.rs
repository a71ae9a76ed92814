//! `tracer list [--pid PID] [-v] [TARGET]`: the USDT probes of a file or a process, one per
//! line as bpftrace spells them; `-v` adds every site.

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Result;

use crate::{
    cli::ListConfig,
    render::escape_text,
    usdt::{self, ProbeSite, Scope, UsdtSpecifier},
};

pub fn run(config: ListConfig) -> Result<()> {
    let spec = target_specifier(config.target.as_deref(), config.pid.is_some())?;
    let scope = match config.pid {
        Some(pid) => Scope::Process(pid.get()),
        None => Scope::Files { exe: None },
    };
    let sites = usdt::resolve(std::slice::from_ref(&spec), scope)?;
    print!("{}", render(&sites, config.verbose));
    Ok(())
}

/// What the user named: a bpftrace specifier, a file, or (with a PID) a probe pattern.
fn target_specifier(target: Option<&str>, have_pid: bool) -> Result<UsdtSpecifier> {
    let Some(target) = target else {
        if have_pid {
            return Ok(usdt::parse_specifier("usdt:*:*:*")?);
        }
        anyhow::bail!(
            "nothing to list: give a file (tracer list /usr/bin/python3.11) or --pid PID"
        );
    };
    if target.starts_with("usdt:") || target.starts_with("U:") {
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
    let mut probes: BTreeMap<(PathBuf, String, String), Vec<&ProbeSite>> = BTreeMap::new();
    for site in sites {
        let key = (
            site.binary.path.clone(),
            site.note.provider.clone(),
            site.note.name.clone(),
        );
        probes.entry(key).or_default().push(site);
    }
    let mut out = String::new();
    for ((path, provider, name), sites) in probes {
        let probe = format!("usdt:{}:{provider}:{name}", path.display());
        out.push_str(&escape_text(&probe));
        out.push('\n');
        if !verbose {
            continue;
        }
        for site in sites {
            let note = &site.note;
            let semaphore = match (note.semaphore, note.semaphore_file_offset) {
                (Some(addr), Some(off)) => format!("semaphore {addr:#x} (file offset {off:#x})"),
                (Some(addr), None) => format!("semaphore {addr:#x} (not in the file)"),
                (None, _) => "no semaphore".into(),
            };
            let args = match &site.args {
                Ok(args) if args.is_empty() => "no arguments".to_string(),
                Ok(args) => args
                    .iter()
                    .map(usdt::describe)
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(reason) => format!("undecodable: {reason}"),
            };
            out.push_str(&format!(
                "  site pc {:#x} (file offset {:#x}), {semaphore}\n    args \"{}\": {}\n",
                note.pc,
                note.file_offset,
                escape_text(&note.arg_spec),
                escape_text(&args)
            ));
        }
    }
    out
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
                file_offset: 0x10,
                semaphore: None,
                semaphore_file_offset: None,
                arg_spec: "8@%rdi\x1b[A".into(),
            },
            args: Err("bad \x1b[A".into()),
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
}
