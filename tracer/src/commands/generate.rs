//! `tracer generate man|completions DIR`: the man pages and shell completions, generated
//! from the same clap definitions as `--help`, so they never drift from it.

use std::{fs, path::Path};

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::{Cli, Generated};

pub(crate) fn run(what: Generated, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    match what {
        Generated::Man => man_pages(dir),
        Generated::Completions => completions(dir),
    }
}

/// `tracer.1`, then `tracer-COMMAND.1` for each visible command.
fn man_pages(dir: &Path) -> Result<()> {
    let command = Cli::command();
    write_page(dir, "tracer", command.clone())?;
    for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("tracer-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("tracer {}", sub.get_name()));
        write_page(dir, &name, page)?;
    }
    Ok(())
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command).render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// Each shell's completion script, under the name that shell looks for.
fn completions(dir: &Path) -> Result<()> {
    for (shell, file) in [
        (Shell::Bash, "tracer.bash"),
        (Shell::Zsh, "_tracer"),
        (Shell::Fish, "tracer.fish"),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "tracer", &mut script);
        let path = dir.join(file);
        fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_page_per_command_and_a_script_per_shell() {
        let dir = std::env::temp_dir().join(format!("tracer-generate-{}", std::process::id()));
        run(Generated::Man, &dir).unwrap();
        run(Generated::Completions, &dir).unwrap();
        for name in [
            "tracer.1",
            "tracer-attach.1",
            "tracer-list.1",
            "tracer-trace.1",
            "tracer-profile.1",
            "tracer-stacks.1",
            "tracer.bash",
            "_tracer",
            "tracer.fish",
        ] {
            let text = fs::read_to_string(dir.join(name)).unwrap();
            assert!(text.contains("tracer"), "{name}");
        }
        assert!(!dir.join("tracer-generate.1").exists());
        let attach = fs::read_to_string(dir.join("tracer-attach.1")).unwrap();
        assert!(attach.contains("no\\-python\\-frames"), "{attach}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
