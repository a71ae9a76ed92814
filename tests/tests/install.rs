//! `cargo xtask install --prefix DIR`: the binary, man pages a reader opens with `man`,
//! and completion scripts each shell loads.

use std::{path::Path, process::Command};

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
#[ignore = "builds and installs the tracer with cargo xtask: run with --include-ignored (cargo xtask test does)"]
fn install_puts_the_binary_man_pages_and_completions_under_the_prefix() {
    let prefix = std::env::temp_dir().join(format!("tracer-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let install = Command::new(cargo)
        .args(["xtask", "install", "--prefix"])
        .arg(&prefix)
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(install.status.success(), "{install:?}");

    let version = Command::new(prefix.join("bin/tracer"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("tracer "));

    let man = prefix.join("share/man/man1");
    for page in [
        "tracer",
        "tracer-attach",
        "tracer-list",
        "tracer-trace",
        "tracer-profile",
        "tracer-stacks",
    ] {
        let shown = Command::new("man")
            .arg("-l")
            .arg(man.join(format!("{page}.1")))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.status.success() && text.contains("NAME") && text.contains(page),
            "{page}: {shown:?}"
        );
    }

    let bash = prefix.join("share/bash-completion/completions/tracer");
    let complete = Command::new("bash")
        .arg("-c")
        .arg(format!("source {}; complete -p tracer", bash.display()))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&complete.stdout).contains("-F _tracer tracer"),
        "{complete:?}"
    );
    for file in [
        "share/zsh/site-functions/_tracer",
        "share/fish/vendor_completions.d/tracer.fish",
    ] {
        let text = std::fs::read_to_string(prefix.join(file)).unwrap();
        assert!(text.contains("tracer"), "{file}");
    }
    std::fs::remove_dir_all(&prefix).unwrap();
}
