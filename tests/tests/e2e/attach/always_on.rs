//! A tracer that runs all the time: `attach --metrics`, which a real Prometheus (Debian's
//! package, started here on loopback with a one-second scrape interval) scrapes, PromQL's
//! answers checked against what the target itself counted and timed; and rolling
//! profiles (`--profile-every`), each window's pprof decoded with prost.

use std::{
    io::Write as _,
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::{
    GC_DEMO, Target, TracerRun, executable_copy, http_get, metrics_addr, out_dir, privileged_test,
    require_privileged, run_tracer,
};
use prost::Message as _;
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

/// How long Prometheus gets to see what the target did (a few scrapes).
const SCRAPES_WAIT: Duration = Duration::from_secs(30);

/// `text` as a URL query value.
fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Prometheus server scraping one target every second, stopped when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: &str, dir: &Path) -> Prometheus {
        assert!(
            Path::new(PROMETHEUS).is_file(),
            "{PROMETHEUS} is missing: `cargo xtask setup` installs Debian's prometheus"
        );
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: tracer\n    static_configs:\n\
                 \x20     - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("cannot start prometheus");
        let prometheus = Prometheus {
            child,
            addr,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = TcpStream::connect(&prometheus.addr).is_ok()
                && http_get(&prometheus.addr, "/-/ready").0.contains(" 200 ");
            if ready {
                return prometheus;
            }
            assert!(Instant::now() < deadline, "{}", prometheus.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The value of an instant query that gives one number; `None` while it gives none.
    fn scalar(&self, promql: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", url_encoded(promql));
        let (status, body) = http_get(&self.addr, &path);
        assert!(status.contains(" 200 "), "{promql}: {status}\n{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        let result = answer["data"]["result"].as_array()?;
        let sample = result.first()?;
        assert_eq!(result.len(), 1, "{promql}: {body}");
        sample["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `promql` gives `want`; returns what it gave last.
    fn wait_for(&self, promql: &str, want: f64) -> Option<f64> {
        let deadline = Instant::now() + SCRAPES_WAIT;
        loop {
            let value = self.scalar(promql);
            if value == Some(want) || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The median of `values`.
fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

#[privileged_test]
fn prometheus_counts_the_gc_pauses_of_a_target_started_after_the_tracer() {
    require_privileged();
    let dir = out_dir("metrics-prometheus");
    // A copy of its own: gc-demos the other tests run are not this test's.
    let gc_demo = executable_copy(GC_DEMO, &dir);
    let mut tracer = TracerRun::attach()
        .args([
            "--exe",
            gc_demo.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
        ])
        .json()
        .out(&dir.join("attach"))
        .start();
    let addr = metrics_addr(&tracer);
    let prometheus = Prometheus::start(&addr, &dir);
    // The tracer is up before any target: Prometheus sees it, with no pause yet.
    assert_eq!(prometheus.wait_for("up{job=\"tracer\"}", 1.0), Some(1.0));

    let gcs = 12;
    let target = Target::start(
        gc_demo.to_str().unwrap(),
        &[
            "--gcs",
            &gcs.to_string(),
            "--pause-ms",
            "20",
            "--interval-ms",
            "20",
        ],
    );
    target.release();
    let truth = target.finish();
    assert_eq!(truth["gcs"], gcs);
    let mut pauses: Vec<u64> = truth["pause_inner_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();

    let count = "sum(tracer_gc_pause_seconds_count{process=\"gc-demo\"})";
    assert_eq!(
        prometheus.wait_for(count, f64::from(gcs)),
        Some(f64::from(gcs)),
        "{}",
        prometheus.log()
    );
    // The median lies in the power-of-two bucket of the target's own median pause.
    let median_ns = median(&mut pauses);
    let low_ns = 1u64 << median_ns.ilog2();
    let quantile = prometheus
        .scalar("histogram_quantile(0.5, sum by (le) (tracer_gc_pause_seconds_bucket))")
        .expect("no median");
    assert!(
        quantile >= low_ns as f64 / 1e9 && quantile <= (2 * low_ns) as f64 / 1e9,
        "median {quantile} s; the target's own is {median_ns} ns, in [{low_ns}, {}) ns",
        2 * low_ns
    );
    let sum = prometheus
        .scalar("sum(tracer_gc_pause_seconds_sum)")
        .unwrap();
    let truth_sum: u64 = pauses.iter().sum();
    let outer_sum: u64 = truth["pause_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        sum >= truth_sum as f64 / 1e9 && sum <= outer_sum as f64 / 1e9,
        "pauses total {sum} s; the target's own between {truth_sum} and {outer_sum} ns"
    );
    println!(
        "PromQL: {count} = {gcs} (the target's {gcs}); median {quantile} s (the target's \
         {median_ns} ns, bucket [{low_ns}, {}) ns); sum {sum} s (the target's {truth_sum} to \
         {outer_sum} ns)",
        2 * low_ns
    );

    // The target is gone; the tracer keeps serving, and the counts stay.
    assert_eq!(
        prometheus.wait_for("max_over_time(tracer_processes[2s])", 0.0),
        Some(0.0)
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(prometheus.scalar(count), Some(f64::from(gcs)));
    assert_eq!(prometheus.scalar("up{job=\"tracer\"}"), Some(1.0));

    // What it serves is valid for Prometheus's own checker.
    let (status, text) = http_get(&addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let mut check = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    for family in [
        "tracer_offcpu_seconds_total{process=\"gc-demo\"}",
        "tracer_oncpu_seconds_total{process=\"gc-demo\"}",
        "tracer_events_lost_total{reason=\"map_full\"} 0",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(family), "no {family} in\n{text}");
    }

    // SIGINT: it stops and reports as without --metrics.
    // SAFETY: kill has no memory preconditions; the tracer is our child, not reaped.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    tracer.wait_for_stderr("Stopped");
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "{stderr}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["latencies"]["gc_pause"]["count"], gcs, "{report:#}");
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn profile_serves_each_processs_time_on_and_off_cpu() {
    require_privileged();
    let dir = out_dir("metrics-profile");
    let target = Target::start(
        GC_DEMO,
        &["--gcs", "60", "--pause-ms", "20", "--interval-ms", "30"],
    );
    let pid = target.pid.to_string();
    let tracer = TracerRun::profile()
        .pid(target.pid)
        .args(["--metrics", "127.0.0.1:0", "--metrics-labels", "pid"])
        .out(&dir)
        .start();
    let addr = metrics_addr(&tracer);
    target.release();
    // Two seconds into the three of the run: the profile stops when its target exits.
    std::thread::sleep(Duration::from_secs(2));
    let (status, text) = http_get(&addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let truth = target.finish();
    assert_eq!(truth["gcs"], 60);
    let (ok, _, stderr) = tracer.finish();
    assert!(ok, "{stderr}");
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let labels = format!("{{process=\"gc-demo\",pid=\"{pid}\"}}");
    // Two seconds of four threads, mostly blocked; the collector spins 40% of the time.
    let offcpu = value(&format!("tracer_offcpu_seconds_total{labels}"));
    let oncpu = value(&format!("tracer_oncpu_seconds_total{labels}"));
    assert!(offcpu > 2.0 && offcpu < 10.0, "{offcpu} s off CPU\n{text}");
    assert!(oncpu > 0.3 && oncpu < 2.0, "{oncpu} s on CPU\n{text}");
    // A profile attaches no probes: no latency families.
    assert!(!text.contains("tracer_gc_pause_seconds"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn a_metrics_address_that_cannot_be_listened_on_is_refused_before_attaching() {
    require_privileged();
    let me = std::process::id().to_string();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    for (addr, says) in [
        ("localhost", "not an address and port"),
        (taken.as_str(), "cannot listen there"),
    ] {
        let out = run_tracer(&["attach", "--pid", &me, "--metrics", addr, "-d", "1s"]);
        let stderr = out.stderr.as_str();
        assert!(!out.status.success(), "{addr}: {stderr}");
        assert!(
            stderr.contains(&format!("--metrics {addr}")) && stderr.contains(says),
            "{addr}: {stderr}"
        );
        assert!(!stderr.contains("Attached"), "{stderr}");
    }
}

/// The fenced block of `page` that starts with the line `# NAME`.
fn fenced_block(page: &str, name: &str) -> String {
    let first = format!("# {name}\n");
    page.split("```")
        .map(|block| block.strip_prefix("yaml\n").unwrap_or(block))
        .find(|block| block.starts_with(&first))
        .unwrap_or_else(|| panic!("no block {name} in docs/metrics.md"))
        .to_string()
}

#[test]
fn the_scrape_config_and_alerting_rules_of_the_docs_pass_promtool() {
    assert!(
        Path::new(PROMTOOL).is_file(),
        "{PROMTOOL} is missing: `cargo xtask setup` installs Debian's prometheus"
    );
    let page = include_str!("../../../../docs/metrics.md");
    let dir = out_dir("metrics-docs");
    for name in ["prometheus.yml", "tracer-alerts.yml"] {
        std::fs::write(dir.join(name), fenced_block(page, name)).unwrap();
    }
    // Checking the configuration checks the rule files it names too.
    let out = Command::new(PROMTOOL)
        .args(["check", "config"])
        .arg(dir.join("prometheus.yml"))
        .output()
        .expect("cannot run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check config: {said}");
    assert!(said.contains("2 rules found"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The parts of pprof's `Profile` (profile.proto) the rolling test reads.
#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

fn gunzip(path: &Path) -> Vec<u8> {
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .expect("gzip is needed to read the pprof output");
    assert!(out.status.success(), "gzip -dc {}", path.display());
    out.stdout
}

/// The windows' pprof files in `dir`, oldest first.
fn window_profiles(dir: &Path) -> Vec<(String, Profile)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("wallclock-") && n.ends_with(".pb.gz"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let bytes = gunzip(&dir.join(&name));
            let profile =
                Profile::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, profile)
        })
        .collect()
}

#[privileged_test]
fn rolling_profiles_hold_each_windows_share_of_the_work() {
    require_privileged();
    let dir = out_dir("rolling");
    // About 4 s of collections, with its four threads alive throughout.
    let target = Target::start(
        GC_DEMO,
        &["--gcs", "80", "--pause-ms", "20", "--interval-ms", "30"],
    );
    let pid = target.pid.to_string();
    let tracer = TracerRun::attach()
        .pid(target.pid)
        .args(["--profile-every", "1s", "--keep", "10"])
        .out(&dir)
        .start();
    target.release();
    let truth = target.finish();
    let (ok, _, stderr) = tracer.finish();
    assert!(ok, "{stderr}");
    let windows = window_profiles(&dir);
    // Four whole windows and the last one cut short by the target's exit, at least.
    assert!(windows.len() >= 4, "{} windows: {stderr}", windows.len());
    for pair in windows.windows(2) {
        let (first, next) = (&pair[0].1, &pair[1].1);
        let gap = next.time_nanos - (first.time_nanos + first.duration_nanos);
        assert_eq!(
            gap, 0,
            "{} ends {gap} ns from where {} starts",
            pair[0].0, pair[1].0
        );
    }
    assert_eq!(truth["gcs"], 80);
    let mut whole_windows = 0;
    // The windows between the first and the last: the four threads ran, blocked or
    // waited for a CPU for all of each, so the wall time adds up to four times its length.
    for (name, profile) in &windows[1..windows.len() - 1] {
        let string = |id: i64| profile.string_table[id as usize].as_str();
        let wall_us: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
        let length_us = profile.duration_nanos / 1000;
        assert!(
            (profile.duration_nanos - 1_000_000_000).abs() < 300_000_000,
            "{name}: {} ns long",
            profile.duration_nanos
        );
        assert!(
            (wall_us as f64 - 4.0 * length_us as f64).abs() < 0.15 * 4.0 * length_us as f64,
            "{name}: {wall_us} us of wall time in a window of {length_us} us, for 4 threads"
        );
        for sample in &profile.sample {
            let labels: Vec<(&str, String)> = sample
                .label
                .iter()
                .map(|l| match string(l.key) {
                    "pid" => ("pid", l.num.to_string()),
                    key => (key, string(l.str).to_string()),
                })
                .collect();
            assert_eq!(
                labels,
                [("process", "gc-demo".to_string()), ("pid", pid.clone())],
                "{name}"
            );
        }
        whole_windows += 1;
    }
    assert!(whole_windows >= 2, "{whole_windows}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_systemd_unit_of_the_docs_passes_systemd_analyze() {
    let unit = include_str!("../../../../docs/deploy/tracer.service");
    let dir = out_dir("systemd-unit");
    // Verifying checks that the program exists: the one built here stands in.
    let tracer = crate::common::tracer_bin();
    let unit = unit.replace("/usr/local/bin/tracer", tracer.to_str().unwrap());
    let path = dir.join("tracer.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("cannot run systemd-analyze (Debian's systemd package has it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}
