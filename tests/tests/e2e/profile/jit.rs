//! JIT-compiled code named without asking the user: a JVM started with no flag is asked
//! for its perf map at the start and again at the stop.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::*;

const HOT: &str = r#"
public class HoHot {
    static volatile long sink;
    static long hoSpin(long n) {
        long s = 0;
        for (long i = 0; i < n; i++) { s += (i * i) ^ (s >>> 3); }
        return s;
    }
    static long lateSpin(long n) {
        long s = 1;
        for (long i = 0; i < n; i++) { s = s * 31 + (i ^ (s >>> 7)); }
        return s;
    }
    static void spinFor(long millis, boolean late) {
        long end = System.nanoTime() + millis * 1_000_000L;
        while (System.nanoTime() < end) { sink += late ? lateSpin(200_000) : hoSpin(200_000); }
    }
    public static void main(String[] args) throws Exception {
        System.out.println("ready pid=" + ProcessHandle.current().pid());
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in)).readLine();
        spinFor(Long.parseLong(args[0]), false);
        spinFor(Long.parseLong(args[1]), true);
        System.out.println("spun");
    }
}
"#;

/// `HoHot` compiled once into the tests' scratch directory.
fn classes() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jit-classes");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("HoHot.java");
    std::fs::write(&file, HOT).unwrap();
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&dir)
        .arg(&file)
        .output()
        .expect("javac (JDK 17) is needed for the JVM tests");
    assert!(javac.status.success(), "{javac:?}");
    dir
}

/// Profiles `java HoHot` (no JVM flag) for 4 s: 2 s in `hoSpin`, then `lateSpin`,
/// compiled after the start, until after the tracer stopped. Returns the on-CPU folded
/// stacks, the tracer's standard error, and the JVM's pid.
fn profile_jvm(java: &str, name: &str, extra: &[&str]) -> (String, String, u32) {
    require_privileged();
    let _alone = jvm_alone();
    let classes = classes();
    let target = StdinTarget::start(
        Command::new(java)
            .arg("-cp")
            .arg(&classes)
            .args(["HoHot", "2000", "4000"]),
    );
    let pid = target.pid;
    let dir = out_dir(name);
    let pid_text = pid.to_string();
    let mut args = vec![
        "profile",
        "--pid",
        &pid_text,
        "--per-thread",
        "--duration",
        "4s",
        "-o",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let tracer = Tracer::start(&args);
    let rest = target.release_and_finish();
    assert!(rest.contains("spun"), "{rest}");
    let (ok, _out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let oncpu = std::fs::read_to_string(dir.join("oncpu.folded")).unwrap();
    (oncpu, err, pid)
}

fn java_methods_named_without_a_flag(java: &str, name: &str) {
    let (oncpu, err, pid) = profile_jvm(java, name, &[]);
    assert!(
        err.contains(&format!(
            "asked the JVM {pid} for its perf map at the start"
        )) && err.contains(&format!(
            "asked the JVM {pid} for its perf map before naming the stacks"
        )),
        "{err}"
    );
    // The spinning thread is the one whose samples name either method.
    let spinner = oncpu
        .lines()
        .find(|l| l.contains("HoHot.hoSpin"))
        .and_then(|l| l.split(';').nth(1))
        .unwrap_or_else(|| panic!("hoSpin is never named\n{oncpu}"))
        .to_string();
    let of_spinner = |l: &str| l.split(';').nth(1) == Some(spinner.as_str());
    let total = folded_weight_where(&oncpu, |l| of_spinner(l));
    let named = folded_weight_where(&oncpu, |l| {
        of_spinner(l) && (l.contains("HoHot.hoSpin") || l.contains("HoHot.lateSpin"))
    });
    let late = folded_weight_where(&oncpu, |l| of_spinner(l) && l.contains("HoHot.lateSpin"));
    eprintln!("{spinner}: {named} of {total} us named, lateSpin {late} us\n{err}");
    assert!(named as f64 >= 0.8 * total as f64, "{oncpu}");
    assert!(
        late > 0,
        "lateSpin, compiled after the start, is unnamed\n{oncpu}"
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
}

#[privileged_test]
fn jdk17_methods_are_named_without_a_flag() {
    java_methods_named_without_a_flag("java", "jit-jdk17");
}

#[privileged_test]
fn temurin25_methods_are_named_without_a_flag() {
    let java = "/usr/lib/jvm/temurin-25-jdk-amd64/bin/java";
    assert!(
        Path::new(java).is_file(),
        "{java} is missing: the machines this project runs on have Temurin 25"
    );
    java_methods_named_without_a_flag(java, "jit-temurin25");
}

/// `--no-jit-symbols` leaves the JVM untouched: no perf map is written.
#[privileged_test]
fn no_jit_symbols_leaves_the_jvm_alone() {
    let (_oncpu, err, pid) = profile_jvm("java", "jit-none", &["--no-jit-symbols"]);
    let map = format!("/tmp/perf-{pid}.map");
    assert!(!Path::new(&map).exists(), "{map} was written\n{err}");
    assert!(!err.contains("asked the JVM"), "{err}");
    assert!(
        !Path::new(&format!("/tmp/.java_pid{pid}")).exists(),
        "the JVM's attach listener was started"
    );
}

const NODE_SPIN: &str = r"
function hotLoop(n) { let s = 0; for (let i = 0; i < n; i++) { s = (s + i * i) % 1000003; } return s; }
console.log(`ready pid=${process.pid}`);
process.stdin.once('data', () => {
    const end = Date.now() + 2000;
    let t = 0;
    while (Date.now() < end) { t += hotLoop(100000); }
    console.log(`spun ${t}`);
    process.exit(0);
});
";

/// Node started with `--perf-prof` writes a jitdump and maps it: its JIT-compiled
/// JavaScript is named from it.
#[privileged_test]
fn node_code_is_named_from_its_jitdump() {
    require_privileged();
    let dir = out_dir("jit-node");
    let script = dir.join("spin.js");
    std::fs::write(&script, NODE_SPIN).unwrap();
    let target = StdinTarget::start(
        Command::new("node")
            .arg("--perf-prof")
            .arg(&script)
            .current_dir(&dir),
    );
    assert_named_on_cpu(target, &dir, "hotLoop");
}

/// `tracer stacks` shows the thread on a CPU too, from one sample of it: a JVM's
/// spinning thread is in its hot method, named from the perf map it is asked for.
#[privileged_test]
fn stacks_shows_what_a_running_thread_runs() {
    require_privileged();
    let _alone = jvm_alone();
    let classes = classes();
    let mut command = Command::new("java");
    command
        .arg("-cp")
        .arg(&classes)
        .args(["HoHot", "60000", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid: u32 = line
        .trim()
        .strip_prefix("ready pid=")
        .unwrap()
        .parse()
        .unwrap();
    std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
    // hoSpin is named once the JIT compiled it, which takes longer on a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let spinning = loop {
        std::thread::sleep(std::time::Duration::from_secs(2));
        let dump = TracerRun::new("stacks").pid(pid).json().run().report();
        let spinning = dump["threads"].as_array().unwrap().iter().find(|t| {
            t["user_stack"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f.as_str().unwrap_or_default().contains("HoHot.hoSpin"))
        });
        if let Some(spinning) = spinning {
            break Ok(spinning.clone());
        }
        if std::time::Instant::now() > deadline {
            break Err(dump);
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let spinning =
        spinning.unwrap_or_else(|dump| panic!("no thread in hoSpin after 30 s\n{dump:#}"));
    assert!(
        ["running", "runnable"].contains(&spinning["state"].as_str().unwrap()),
        "{spinning:#}"
    );
}

/// Runs `program ARGS`, failing the test with its output if it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
}

/// Code registered through the GDB JIT interface (as LLVM's JITs register what they
/// emit) is named from the object registered with it.
#[privileged_test]
fn code_registered_with_the_gdb_jit_interface_is_named() {
    require_privileged();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gdb-jit");
    std::fs::create_dir_all(&tmp).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gdbjit");
    let path = |name: &str| tmp.join(name).to_str().unwrap().to_string();
    let source = |name: &str| src.join(name).to_str().unwrap().to_string();
    // The object a JIT would emit: linked at the address its code is copied to.
    let address = "0x7e0000000000";
    run(
        "gcc",
        &[
            "-O1",
            "-fno-pic",
            "-fno-omit-frame-pointer",
            "-c",
            &source("jitted.c"),
            "-o",
            &path("jitted.o"),
        ],
    );
    run(
        "ld",
        &[
            "-e",
            "0",
            &format!("-Ttext={address}"),
            &path("jitted.o"),
            "-o",
            &path("jitted.elf"),
        ],
    );
    run(
        "objcopy",
        &[
            "-O",
            "binary",
            "--only-section=.text",
            &path("jitted.elf"),
            &path("jitted.bin"),
        ],
    );
    run(
        "gcc",
        &["-O2", "-o", &path("gdb-jit-demo"), &source("demo.c")],
    );
    let target = StdinTarget::start(Command::new(path("gdb-jit-demo")).args([
        path("jitted.elf"),
        path("jitted.bin"),
        address.to_string(),
        "1500".to_string(),
    ]));
    assert_named_on_cpu(target, &out_dir("jit-gdb"), "jitted_spin");
}

/// Profiles `target` (its files in `dir`) from its release to its exit, which it says
/// with `spun`, and checks that at least 80% of its on-CPU time names `function`.
fn assert_named_on_cpu(target: StdinTarget, dir: &Path, function: &str) {
    let tracer = TracerRun::profile().pid(target.pid).out(dir).start();
    let rest = target.release_and_finish();
    assert!(rest.contains("spun"), "{rest}");
    let (ok, _out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let oncpu = std::fs::read_to_string(dir.join("oncpu.folded")).unwrap();
    let total = folded_weight_where(&oncpu, |_| true);
    let named = folded_weight_where(&oncpu, |l| l.contains(function));
    eprintln!("{function} in {named} of {total} us on CPU");
    assert!(named as f64 >= 0.8 * total as f64, "{oncpu}");
}
