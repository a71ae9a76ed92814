//! The specifier grammar (issue 13, item 1), end to end on targets built here, each case
//! compared with what bpftrace lists for the same text where bpftrace can do it:
//! `*:FILE:*`, one- and two-part names, `list --pid P 'usdt:*'`, file paths with
//! wildcards (relative and absolute, by file, by PID and with `-- CMD`), bpftrace's quoted
//! names (`test:"\"probe1\""`), and bad input.
//!
//! `tracer list` by file and by PID needs no privilege, so those tests always run; running
//! bpftrace, or tracing, needs root.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
};

use crate::common::*;

/// A probe as listed: (file, provider, name), the file made absolute.
type Probe = (PathBuf, String, String);

/// The targets, laid out once per test binary:
/// `bin/{app,app2}` (prov:start, prov:"probe1", other:stop), `bin/app.c` (not ELF),
/// `bin/noprobes` (ELF without probes), `lib/libgx.so` (libprov:fired) and `bin/uselib`
/// (mainprov:ready, linked with the library).
struct Layout {
    dir: PathBuf,
}

fn layout() -> &'static Layout {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        let dir = std::fs::canonicalize(out_dir("specifiers")).unwrap();
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        let app = compile_target("gcc", "src/grammar/app.c", "grammar-app", &[]);
        std::fs::copy(&app, dir.join("bin/app")).unwrap();
        std::fs::copy(&app, dir.join("bin/app2")).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("src/grammar/app.c"),
            dir.join("bin/app.c"),
        )
        .unwrap();
        let none = compile_target("gcc", "src/grammar/noprobes.c", "grammar-noprobes", &[]);
        std::fs::copy(&none, dir.join("bin/noprobes")).unwrap();
        let lib = compile_target(
            "gcc",
            "src/grammar/lib.c",
            "grammar-libgx.so",
            &["-shared", "-fPIC"],
        );
        let lib_path = dir.join("lib/libgx.so");
        std::fs::copy(&lib, &lib_path).unwrap();
        let rpath = format!("-Wl,-rpath,{}", dir.join("lib").display());
        // The library comes before the source on the command line: keep it needed anyway.
        let uselib = compile_target(
            "gcc",
            "src/grammar/uselib.c",
            "grammar-uselib",
            &["-Wl,--no-as-needed", lib_path.to_str().unwrap(), &rpath],
        );
        std::fs::copy(&uselib, dir.join("bin/uselib")).unwrap();
        Layout { dir }
    })
}

impl Layout {
    /// The probes of `files` (names under the layout's directory), as (provider, name).
    fn probes(&self, files: &[&str], probes: &[(&str, &str)]) -> BTreeSet<Probe> {
        files
            .iter()
            .flat_map(|file| {
                probes
                    .iter()
                    .map(move |(p, n)| (self.dir.join(file), p.to_string(), n.to_string()))
            })
            .collect()
    }

    /// What `app` and `app2` have.
    fn app(&self, files: &[&str]) -> BTreeSet<Probe> {
        self.probes(
            files,
            &[("prov", "start"), ("prov", "\"probe1\""), ("other", "stop")],
        )
    }

    fn run(&self, program: &Path, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
    }

    /// `tracer list [--pid PID] PATTERN`, run in the layout's directory.
    fn tracer_list(&self, pid: Option<u32>, pattern: &str) -> Listed {
        let pid = pid.map(|p| p.to_string());
        let mut args = vec!["list"];
        if let Some(pid) = &pid {
            args.extend(["--pid", pid]);
        }
        args.push(pattern);
        Listed::new(self, self.run(&tracer_bin(), &args))
    }

    /// `bpftrace -l [-p PID] PATTERN`, run in the layout's directory; its `usdt:` lines.
    fn bpftrace_list(&self, pid: Option<u32>, pattern: &str) -> Listed {
        let pid = pid.map(|p| p.to_string());
        let mut args = vec!["-l"];
        if let Some(pid) = &pid {
            args.extend(["-p", pid]);
        }
        args.push(pattern);
        Listed::new(self, self.run(Path::new("bpftrace"), &args))
    }
}

/// What a listing printed, the probes made comparable: bpftrace prints paths as given
/// (`./bin/app`) or under `/proc/PID/root`, tracer absolute.
struct Listed {
    probes: BTreeSet<Probe>,
    success: bool,
    stderr: String,
    stdout: String,
}

impl Listed {
    fn new(layout: &Layout, out: Output) -> Self {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let probes = stdout
            .lines()
            .filter_map(|line| line.strip_prefix("usdt:"))
            .map(|line| {
                let mut fields = line.rsplitn(3, ':');
                let (name, provider, path) = (
                    fields.next().unwrap(),
                    fields.next().unwrap_or_else(|| panic!("{line}")),
                    fields.next().unwrap_or_else(|| panic!("{line}")),
                );
                let path = match path.strip_prefix("/proc/") {
                    Some(rest) => Path::new("/").join(rest.split_once("/root/").unwrap().1),
                    None => layout.dir.join(path),
                };
                let path = std::fs::canonicalize(&path).unwrap_or(path);
                (path, provider.to_string(), name.to_string())
            })
            .collect();
        Listed {
            probes,
            success: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout,
        }
    }

    /// The probes, checked to have been listed successfully.
    fn ok(&self, what: &str) -> &BTreeSet<Probe> {
        assert!(
            self.success,
            "{what}: failed\n{}{}",
            self.stdout, self.stderr
        );
        &self.probes
    }
}

/// One listing case: the text, the probes expected, and whether bpftrace lists the same.
struct Case {
    pattern: String,
    expected: BTreeSet<Probe>,
    /// What bpftrace 0.17 does differently, when it does: then it is not compared.
    bpftrace_differs: Option<&'static str>,
}

fn case(pattern: &str, expected: BTreeSet<Probe>) -> Case {
    Case {
        pattern: pattern.to_string(),
        expected,
        bpftrace_differs: None,
    }
}

fn ours_only(pattern: &str, expected: BTreeSet<Probe>, why: &'static str) -> Case {
    Case {
        bpftrace_differs: Some(why),
        ..case(pattern, expected)
    }
}

/// Listing by file, from the layout's directory.
fn file_cases(l: &Layout) -> Vec<Case> {
    let dir = l.dir.display();
    let prov = |files: &[&str]| l.probes(files, &[("prov", "start"), ("prov", "\"probe1\"")]);
    let probe1 = l.probes(&["bin/app"], &[("prov", "\"probe1\"")]);
    vec![
        case("usdt:./bin/app:*", l.app(&["bin/app"])),
        case("*:./bin/app:*", l.app(&["bin/app"])),
        case("u*:./bin/app:prov:*", prov(&["bin/app"])),
        case("usdt:bin/../bin/app2:*", l.app(&["bin/app2"])),
        case(
            "usdt:./bin/app:start",
            l.probes(&["bin/app"], &[("prov", "start")]),
        ),
        case("usdt:./bin/app::*", l.app(&["bin/app"])),
        case("usdt:./bin/app*:*", l.app(&["bin/app", "bin/app2"])),
        case("usdt:./bin/app*:prov:*", prov(&["bin/app", "bin/app2"])),
        // app.c is no ELF file and noprobes has no probes: both passed over.
        case("usdt:./bin/*:*", {
            let mut all = l.app(&["bin/app", "bin/app2"]);
            all.extend(l.probes(&["bin/uselib"], &[("mainprov", "ready")]));
            all
        }),
        case(
            "usdt:bin/*2:other:*",
            l.probes(&["bin/app2"], &[("other", "stop")]),
        ),
        case(&format!("usdt:{dir}/b*/app:*"), l.app(&["bin/app"])),
        case(&format!("usdt:{dir}/*/app*:prov:start"), {
            l.probes(&["bin/app", "bin/app2"], &[("prov", "start")])
        }),
        case(r#"usdt:./bin/app:"\"probe1\"""#, probe1.clone()),
        case(r#"usdt:./bin/app:prov:"\"probe1\"""#, probe1.clone()),
        case(r#"usdt:"./bin/app":"prov":"\"probe1\"""#, probe1),
        ours_only(
            "usdt:./bin/app?:*",
            l.app(&["bin/app2"]),
            "bpftrace expands only `*` in paths: `?` is a syntax error, quoted it is no file",
        ),
        ours_only(
            "usdt:./bin/app[0-9]:other:stop",
            l.probes(&["bin/app2"], &[("other", "stop")]),
            "bpftrace expands only `*` in paths",
        ),
    ]
}

/// Listing in the running `uselib`, from the layout's directory. `libc` and the dynamic
/// loader have probes too: a case that matches every object expects theirs as well,
/// which only bpftrace's listing can say (see `others`).
fn pid_cases(l: &Layout) -> Vec<Case> {
    let dir = l.dir.display();
    let main = l.probes(&["bin/uselib"], &[("mainprov", "ready")]);
    let lib = l.probes(&["lib/libgx.so"], &[("libprov", "fired")]);
    let both: BTreeSet<Probe> = main.union(&lib).cloned().collect();
    vec![
        case("usdt:*", both.clone()),
        case("usdt:*:*", both.clone()),
        case("usdt:*:*:*", both.clone()),
        case("usdt:::*", both),
        case("usdt:fired", lib.clone()),
        case("usdt::fired", lib.clone()),
        case("usdt:*:mainprov:*", main),
        case(&format!("usdt:{dir}/lib/libgx.so:*"), lib.clone()),
        case("usdt:./lib/libgx.so:*", lib.clone()),
        case("usdt:lib/../lib/libgx.so:libprov:fired", lib.clone()),
        ours_only(
            "usdt:./lib/lib*:*",
            lib.clone(),
            "bpftrace 0.17 with -p lists nothing for a relative path with wildcards",
        ),
        ours_only(
            &format!("usdt:{dir}/lib/*:*"),
            lib.clone(),
            "bpftrace 0.17 with -p lists nothing for a path with wildcards",
        ),
        ours_only(
            "usdt:libgx.so:*",
            lib,
            "bpftrace takes a name without a slash as a file in the current directory",
        ),
    ]
}

/// Whether a case's pattern selects every object's probes (libc's too).
fn every_object(pattern: &str) -> bool {
    matches!(pattern, "usdt:*" | "usdt:*:*" | "usdt:*:*:*" | "usdt:::*")
}

/// `bin/uselib` running, killed when dropped.
struct Running {
    child: Child,
}

impl Running {
    fn start(l: &Layout) -> Self {
        let mut child = Command::new(l.dir.join("bin/uselib"))
            .current_dir(&l.dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        Running { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The files the process maps, as /proc/PID/maps names them.
    fn mapped_files(&self) -> BTreeSet<PathBuf> {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid()))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .filter(|path| path.starts_with('/'))
            .map(PathBuf::from)
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn list_by_file() {
    let l = layout();
    for case in file_cases(l) {
        let listed = l.tracer_list(None, &case.pattern);
        assert_eq!(listed.ok(&case.pattern), &case.expected, "{}", case.pattern);
    }
}

#[test]
fn list_by_pid() {
    let l = layout();
    let target = Running::start(l);
    let mapped = target.mapped_files();
    for case in pid_cases(l) {
        let listed = l.tracer_list(Some(target.pid()), &case.pattern);
        let probes = listed.ok(&case.pattern);
        if every_object(&case.pattern) {
            // Ours, and others only from files the process maps (libc, ld.so).
            assert!(
                probes.is_superset(&case.expected),
                "{}: {probes:?}",
                case.pattern
            );
            for (file, ..) in probes {
                assert!(mapped.contains(file), "{}: {file:?}", case.pattern);
            }
        } else {
            assert_eq!(probes, &case.expected, "{}", case.pattern);
        }
    }
    // No pattern at all: every object, as `usdt:*`.
    let all = l.tracer_list(Some(target.pid()), "usdt:*");
    let bare = Listed::new(
        l,
        l.run(&tracer_bin(), &["list", "--pid", &target.pid().to_string()]),
    );
    assert_eq!(bare.ok("list --pid"), all.ok("usdt:*"));
}

#[privileged_test]
fn bpftrace_lists_the_same_by_file() {
    require_privileged();
    let l = layout();
    for case in file_cases(l) {
        let ours = l.tracer_list(None, &case.pattern);
        let theirs = l.bpftrace_list(None, &case.pattern);
        match case.bpftrace_differs {
            None => assert_eq!(
                theirs.ok(&case.pattern),
                ours.ok(&case.pattern),
                "bpftrace -l '{}'",
                case.pattern
            ),
            Some(why) => eprintln!("{}: not compared: {why}", case.pattern),
        }
    }
}

#[privileged_test]
fn bpftrace_lists_the_same_by_pid() {
    require_privileged();
    let l = layout();
    let target = Running::start(l);
    let pid = Some(target.pid());
    for case in pid_cases(l) {
        let ours = l.tracer_list(pid, &case.pattern);
        let theirs = l.bpftrace_list(pid, &case.pattern);
        match case.bpftrace_differs {
            // libc's and ld.so's probes included: bpftrace says which there are.
            None => assert_eq!(
                theirs.ok(&case.pattern),
                ours.ok(&case.pattern),
                "bpftrace -l -p PID '{}'",
                case.pattern
            ),
            Some(why) => eprintln!("{}: not compared: {why}", case.pattern),
        }
    }
    let bare = Listed::new(
        l,
        l.run(
            Path::new("bpftrace"),
            &["-l", "-p", &target.pid().to_string()],
        ),
    );
    let ours = l.tracer_list(pid, "usdt:*");
    assert_eq!(bare.ok("bpftrace -l -p PID"), ours.ok("usdt:*"));
}

/// An event of `tracer trace`: (file, provider:name).
type Event = (String, String);

/// Events of `tracer trace --format json`, in order.
fn traced(stdout: &str) -> Vec<Event> {
    parse_trace_json(stdout)
        .events
        .iter()
        .filter_map(|e| {
            let probe = e.probe.strip_prefix("usdt:")?;
            let mut fields = probe.rsplitn(3, ':');
            let (name, provider, file) = (fields.next()?, fields.next()?, fields.next()?);
            Some((file.to_string(), format!("{provider}:{name}")))
        })
        .collect()
}

/// The number bpftrace's "Attaching N probes..." line gives for `program` with `-c cmd`.
fn bpftrace_attaches(l: &Layout, program: &str, cmd: &str) -> usize {
    let out = l.run(Path::new("bpftrace"), &["-e", program, "-c", cmd]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    stdout
        .lines()
        .find_map(|line| {
            line.strip_prefix("Attaching ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("bpftrace -e '{program}' -c {cmd}:\n{stdout}{stderr}"))
}

/// With `-- CMD`, a path with wildcards is expanded in the filesystem (every matching file
/// attached, as bpftrace's `-c` does) and matches the command's own executable, by file
/// name for a path without a slash.
#[privileged_test]
fn trace_a_command_with_wildcard_paths() {
    require_privileged();
    let l = layout();
    let app = l.dir.join("bin/app").display().to_string();
    let app2 = l.dir.join("bin/app2").display().to_string();
    let probe1 = "prov:\"probe1\"".to_string();
    // (probe, command, probes attached, events as (file, provider:name)).
    let cases: Vec<(&str, &str, usize, Vec<Event>)> = vec![
        // Both files' probes attached; only the command's fire.
        (
            "usdt:./bin/app*:prov:*",
            "./bin/app",
            4,
            vec![
                (app.clone(), "prov:start".into()),
                (app.clone(), probe1.clone()),
            ],
        ),
        (
            r#"usdt:./bin/app2:prov:"\"probe1\"""#,
            "./bin/app2",
            1,
            vec![(app2.clone(), probe1)],
        ),
        (
            "usdt:bin/app[0-9]:other:*",
            "./bin/app2",
            1,
            vec![(app2.clone(), "other:stop".into())],
        ),
        // No slash: the command by name (nothing in the current directory is called so).
        (
            "usdt:app*:other:stop",
            "./bin/app",
            1,
            vec![(app, "other:stop".into())],
        ),
    ];
    for (probe, cmd, probes, events) in cases {
        let out = l.run(
            &tracer_bin(),
            &["trace", "--format", "json", probe, "--", cmd],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{probe}: {stderr}");
        assert!(
            stderr.contains(&format!("Attached {probes} probes")),
            "{probe}: {stderr}"
        );
        assert_eq!(traced(&stdout), events, "{probe}: {stdout}");
    }
    // bpftrace attaches as many for the first case (bpftrace expands only `*` in paths
    // and finds no file for a name without a slash, so the others are not compared).
    assert_eq!(
        bpftrace_attaches(l, "usdt:./bin/app*:prov:* {}", "./bin/app"),
        4
    );
}

/// Bad input: non-zero, a message that says what is wrong, naming the pattern.
#[test]
fn bad_specifiers_say_what_is_wrong() {
    let l = layout();
    let cases = [
        (
            "usdt:./bin/nomatch*:*",
            "no ELF file matches the path ./bin/nomatch* of usdt:./bin/nomatch*:*:*",
        ),
        (
            "usdt:./bin/app.c*:*",
            "no ELF file matches the path ./bin/app.c* of usdt:./bin/app.c*:*:*",
        ),
        (
            "usdt:./bin/noprobes:*",
            "no USDT probes in ./bin/noprobes: its build has no SystemTap SDT notes",
        ),
        (
            "usdt:./bin/app*:nosuch:*",
            "no probes match usdt:./bin/app*:nosuch:* in the given files",
        ),
        (
            "usdt:./bin/app",
            "bad probe specifier \"usdt:./bin/app\": expected usdt:PATH:[PROVIDER:]NAME (a path \
             needs a probe after it)",
        ),
        (
            "usdt:*",
            "bad probe specifier \"usdt::*:*\": a probe without a path means every object of a \
             process: give --pid, or a command after --",
        ),
        (
            "k*:./bin/app:*",
            "bad probe specifier \"k*:./bin/app:*\": probe type \"k*\" does not match usdt; \
             wildcards in the probe type select USDT probes only",
        ),
        (
            r#"usdt:./bin/app:"probe1"#,
            r#"bad probe specifier "usdt:./bin/app:"probe1": unterminated quote"#,
        ),
    ];
    for (pattern, message) in cases {
        let out = l.tracer_list(None, pattern);
        assert!(!out.success, "{pattern}: {}", out.stdout);
        assert!(out.stdout.is_empty(), "{pattern}: {}", out.stdout);
        assert!(out.stderr.contains(message), "{pattern}: {}", out.stderr);
    }
    // In a process that does not map the file.
    let target = Running::start(l);
    let out = l.tracer_list(Some(target.pid()), "usdt:./bin/app*:*");
    assert!(!out.success);
    assert!(
        out.stderr.contains(&format!(
            "no probes match usdt:./bin/app*:*:* in process {}",
            target.pid()
        )),
        "{}",
        out.stderr
    );
}

/// A bare command name, as bpftrace takes it: the first ELF file of that name in `$PATH`,
/// a wrapper script of the same name before it (as pyenv's shims) passed over.
#[test]
fn a_bare_command_name_is_found_in_the_search_path() {
    let dir = out_dir("bare-name");
    let (shims, bin) = (dir.join("shims"), dir.join("bin"));
    std::fs::create_dir_all(&shims).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    let shim = shims.join("usdt-args");
    std::fs::write(&shim, "#!/bin/sh\nexec usdt-args \"$@\"\n").unwrap();
    let real = bin.join("usdt-args");
    std::fs::copy(env!("CARGO_BIN_EXE_usdt-args"), &real).unwrap();
    for file in [&shim, &real] {
        let mut permissions = std::fs::metadata(file).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(file, permissions).unwrap();
    }
    let path = std::env::join_paths(
        [shims.clone(), bin.clone()]
            .into_iter()
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let list = |program: &Path, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .env("PATH", &path)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{program:?} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let by_name = list(&tracer_bin(), &["list", "usdt:usdt-args:*"]);
    let real_path = real.canonicalize().unwrap();
    let by_path = list(
        &tracer_bin(),
        &["list", &format!("usdt:{}:*", real_path.display())],
    );
    assert!(by_name.lines().count() > 3, "{by_name}");
    assert_eq!(by_name, by_path);
    // bpftrace lists the same probes, of the same file.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let theirs: BTreeSet<String> = list(Path::new("bpftrace"), &["-l", "usdt:usdt-args:*"])
            .lines()
            .filter_map(|l| l.split_once("usdt-args:").map(|(_, p)| p.to_string()))
            .collect();
        let prefix = format!("usdt:{}:", real_path.display());
        let ours: BTreeSet<String> = by_name
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect();
        assert_eq!(ours, theirs, "bpftrace -l");
        assert!(
            list(Path::new("bpftrace"), &["-l", "usdt:usdt-args:*"]).contains("/bin/usdt-args:"),
            "bpftrace took another file"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
