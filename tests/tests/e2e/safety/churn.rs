//! A tracer that runs for weeks: `attach --comm` while a service starts dozens of short
//! processes a second, with `--metrics` and `--profile-every`. Its resident memory and
//! the entries of its kernel maps kept per process must stay flat once the first exited
//! processes are let go (`--keep-exited`), and nothing it reports may go missing.
//!
//! In CI the run lasts a minute; `cargo xtask soak` runs it for longer
//! (`TRACER_SOAK_SECONDS`), and prints a line per sample.

use std::{
    collections::{BTreeMap, HashSet},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{
    TracerRun, executable_copy_as, http_get, metrics_addr, out_dir, privileged_test,
    require_privileged_alone,
};
use serde_json::Value;

const FORKING_SERVER: &str = env!("CARGO_BIN_EXE_forking-server");

/// The kernel maps with entries per process or thread.
const PER_PROCESS_MAPS: [&str; 6] = [
    "OFFCPU_TIME",
    "ONCPU_SAMPLES",
    "LATENCY_BY_PROC",
    "PROCESS_METRICS",
    "LATENCY_STARTS",
    "TASK_STATES",
];

/// Exited processes kept whole: small, so the run lets many go.
const KEEP_EXITED: usize = 200;

/// The rolling profiles' window (`--profile-every`), in seconds. Exited processes are let
/// go at each window's end, so the per-process maps fill up over a window and drop at its
/// end: samples compared with each other are taken at the same point of their windows.
const WINDOW_S: u64 = 10;

/// A process's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// `bpftool -j ARGS`, parsed.
fn bpftool(args: &[&str]) -> Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("bpftool (cargo xtask setup installs it)");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The entries of each of process `pid`'s maps named in [`PER_PROCESS_MAPS`] (its maps
/// are the BPF map descriptors it holds).
fn map_entries(pid: u32) -> BTreeMap<String, usize> {
    let mut entries = BTreeMap::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) else {
            continue;
        };
        let id = id.trim();
        let shown = bpftool(&["map", "show", "id", id]);
        let Some(name) = shown["name"].as_str() else {
            continue;
        };
        if PER_PROCESS_MAPS.contains(&name) && !entries.contains_key(name) {
            let dump = bpftool(&["map", "dump", "id", id]);
            entries.insert(name.to_string(), dump.as_array().map_or(0, Vec::len));
        }
    }
    entries
}

/// The value of the series named `series` (with its labels) in the exposition `text`.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// One look at the tracer: its memory, its maps, and its metrics.
struct Sample {
    at: Duration,
    rss_kib: u64,
    maps: BTreeMap<String, usize>,
    oncpu_seconds: f64,
    map_full: f64,
    /// Series in the scrape, and those named by a PID rather than a program.
    series: usize,
    unnamed_series: usize,
}

#[privileged_test]
fn memory_and_maps_stay_flat_while_processes_come_and_go() {
    require_privileged_alone();
    let seconds: u64 = std::env::var("TRACER_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = out_dir("churn");
    let server = executable_copy_as(FORKING_SERVER, &dir, "churner");
    let profiles = dir.join("profiles");
    let keep = KEEP_EXITED.to_string();
    let tracer = TracerRun::attach()
        .args([
            "--comm",
            "churner",
            "--metrics",
            "127.0.0.1:0",
            "--profile-every",
            &format!("{WINDOW_S}s"),
            "--keep",
            "3",
            "--keep-exited",
            &keep,
        ])
        .json()
        .out(&profiles)
        .start();
    let addr = metrics_addr(&tracer);
    let pid = tracer.pid();

    // The service: a parent and three children that live a few milliseconds, over and
    // over; it says how many processes it started.
    let script = format!(
        "end=$(( $(date +%s) + {seconds} )); n=0; \
         while [ $(date +%s) -lt $end ]; do \
           {} --children 3 --pairs 2 --pair-ms 1 --block-ms 5 > /dev/null || exit 1; \
           n=$((n + 4)); \
         done; echo $n",
        server.display()
    );
    let workload = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    // A sample in the middle of every window from the third on: the first two fill what
    // is kept (the last exited processes) and let the first ones go.
    let middles = (2..).map(|window| Duration::from_secs(window * WINDOW_S + WINDOW_S / 2));
    for at in middles.take_while(|at| at.as_secs() < seconds) {
        std::thread::sleep(at.saturating_sub(started.elapsed()));
        let (_, text) = http_get(&addr, "/metrics");
        let sample = Sample {
            at: started.elapsed(),
            rss_kib: rss_kib(pid),
            maps: map_entries(pid),
            oncpu_seconds: series_value(&text, "tracer_oncpu_seconds_total{process=\"churner\"}")
                .unwrap_or(0.0),
            map_full: series_value(&text, "tracer_events_lost_total{reason=\"map_full\"}")
                .unwrap_or(f64::NAN),
            series: text.lines().filter(|l| !l.starts_with('#')).count(),
            unnamed_series: text
                .lines()
                .filter(|l| l.contains("process=\"[pid "))
                .count(),
        };
        if let Some(unnamed) = text.lines().find(|l| l.contains("process=\"[pid ")) {
            println!("named by PID: {unnamed}");
        }
        println!(
            "{:>5.0} s  RSS {:>7.1} MiB  on CPU {:>7.2} s  map_full {}  series {}  {:?}",
            sample.at.as_secs_f64(),
            sample.rss_kib as f64 / 1024.0,
            sample.oncpu_seconds,
            sample.map_full,
            sample.series,
            sample.maps
        );
        samples.push(sample);
    }
    let out = workload.wait_with_output().unwrap();
    assert!(out.status.success(), "the workload failed");
    let started_processes: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // The last processes are let go at the next window.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill has no memory preconditions; the tracer is our child, not reaped.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let (ok, stdout, stderr) = tracer.finish();
    assert!(ok, "{stderr}");

    let first = &samples[0];
    let last = samples.last().unwrap();
    assert!(
        started_processes > 2_000,
        "only {started_processes} processes: not a churn"
    );
    // Flat: what grew with each process would have more than doubled from the first
    // sample to the last (25 s and 55 s into a one-minute run).
    assert!(
        last.rss_kib <= first.rss_kib + first.rss_kib / 5 + 8 * 1024,
        "resident memory grew from {} to {} KiB",
        first.rss_kib,
        last.rss_kib
    );
    for (name, &entries) in &last.maps {
        let before = first.maps.get(name).copied().unwrap_or(0);
        assert!(
            entries <= before + before / 2 + 500,
            "{name} grew from {before} to {entries} entries"
        );
    }
    assert!(
        last.maps.contains_key("OFFCPU_TIME"),
        "no maps found: {:?}",
        last.maps
    );
    assert!(last.map_full < 1.0, "entries were lost to full maps");
    // Series are per program, not per process: their number does not grow with churn.
    for sample in &samples {
        assert_eq!(
            sample.unnamed_series, 0,
            "series named by PID at {:?}",
            sample.at
        );
    }
    assert!(
        last.series <= first.series + 20,
        "series grew from {} to {}",
        first.series,
        last.series
    );
    // Counters never go backwards, also across the processes let go.
    for pair in samples.windows(2) {
        assert!(
            pair[1].oncpu_seconds >= pair[0].oncpu_seconds && pair[0].oncpu_seconds > 0.0,
            "on-CPU time went from {} to {}",
            pair[0].oncpu_seconds,
            pair[1].oncpu_seconds
        );
    }

    // Every process is accounted for: the last ones by PID, the others by name.
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let listed = report["processes"].as_array().unwrap().len() as u64;
    let folded = report["processes_folded"]["churner"].as_u64().unwrap_or(0);
    assert_eq!(
        listed + folded,
        started_processes,
        "{}",
        report["processes_folded"]
    );
    assert!(
        listed <= KEEP_EXITED as u64 + 8,
        "{listed} processes listed"
    );
    // The processes let go are in the profile under their program's name; those kept
    // under their own PIDs.
    let folded_stacks = std::fs::read_to_string(profiles.join("wallclock.folded")).unwrap();
    let weight = |root: &dyn Fn(&str) -> bool| -> u64 {
        folded_stacks
            .lines()
            .filter(|l| root(l.split(';').next().unwrap_or_default()))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    let pid_roots: HashSet<&str> = folded_stacks
        .lines()
        .filter_map(|l| l.split(';').next())
        .filter(|root| root.starts_with("churner ["))
        .collect();
    assert!(
        pid_roots.len() as u64 <= listed,
        "{} processes by PID in the profile, {listed} in the report",
        pid_roots.len()
    );
    let by_program = weight(&|root| root == "churner");
    let by_pid = weight(&|root| root.starts_with("churner ["));
    assert!(
        by_program > 10 * by_pid && by_pid > 0,
        "let go: {by_program} us, kept: {by_pid} us"
    );
    let _ = std::fs::remove_dir_all(dir);
}
