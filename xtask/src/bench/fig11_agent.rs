//! Figure 11: the always-on agent's own cost. `tracer attach --comm forking-server
//! --metrics ADDR --profile-every 10s` runs while a loop starts forking-server over and
//! over (each a parent and three children that live a few milliseconds: a service that
//! churns processes), for `--agent-seconds` [default: 600; --quick: 60]. Ten times over
//! the run it reads the tracer's CPU time and resident memory (/proc/PID/stat and
//! status), the entries of its two maps that grow with processes (bpftool), and scrapes
//! /metrics once, timed. At the end, 100 scrapes in a row give the CPU time and latency of
//! one scrape.
//!
//! Baselines from the same run: the workload's own CPU time (its reaped processes'), for
//! the tracer's share; its resident memory after the first tenth of the run, for its
//! growth; the tracer's CPU time per second between scrapes, for a scrape's.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    Config, Row,
    harness::{Stream, Tool, bin, error_lines},
    stats::median,
};

/// How many samples are taken over the run.
const SAMPLES: usize = 10;
/// Scrapes in the burst at the end.
const BURST: usize = 100;

/// CPU time (user and system) of process `pid` in seconds, from /proc/PID/stat.
fn cpu_seconds(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = &stat[stat.rfind(')').context("no ) in stat")? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no memory preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / per_second)
}

/// Resident memory of process `pid` in MiB (VmRSS).
fn rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// Waits for the workload shell: the processes it started, and the CPU time of it and
/// every process it reaped (wait4's usage of a child includes its own reaped children's).
fn finish_workload(mut shell: std::process::Child) -> Result<(u64, f64)> {
    let mut out = String::new();
    shell
        .stdout
        .take()
        .context("no stdout")?
        .read_to_string(&mut out)?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 only writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; the pid is our unreaped child's.
    let rc = unsafe { libc::wait4(shell.id() as i32, &raw mut status, 0, &raw mut usage) };
    if rc < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("the workload failed (wait status {status:#x}): {out}");
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let processes = out.trim().parse().context("the workload's count")?;
    Ok((processes, seconds(usage.ru_utime) + seconds(usage.ru_stime)))
}

/// Entries of the maps named `name` (bpftool's dumps; the tracer's, as nothing else of
/// that name runs during the bench), 0 when it cannot say.
fn map_entries(name: &str) -> usize {
    let json = |args: &[&str]| {
        Command::new("bpftool")
            .arg("-j")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|out| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok())
    };
    let Some(maps) = json(&["map", "show"]) else {
        return 0;
    };
    let ids: Vec<String> = maps
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"] == name)
        .filter_map(|m| m["id"].as_u64())
        .map(|id| id.to_string())
        .collect();
    ids.iter()
        .filter_map(|id| json(&["map", "dump", "id", id]))
        .filter_map(|dump| dump.as_array().map(Vec::len))
        .sum()
}

/// One scrape of `addr`: the body's length and how long it took.
fn scrape(addr: &str) -> Result<(usize, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    if !response.starts_with(b"HTTP/1.1 200") {
        bail!(
            "scrape: {}",
            String::from_utf8_lossy(&response[..response.len().min(80)])
        );
    }
    Ok((response.len(), started.elapsed()))
}

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
    let seconds = config.agent_seconds;
    let dir = std::env::temp_dir().join(format!("tracer-bench-agent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut tracer = Tool::spawn(
        Command::new(bin("tracer"))
            .args([
                "attach",
                "--comm",
                "forking-server",
                "--metrics",
                "127.0.0.1:0",
                "--profile-every",
                "10s",
                "--keep",
                "6",
                "--format",
                "json",
                "-o",
            ])
            .arg(&dir),
        "tracer",
    )?;
    let line = tracer.wait_line(Stream::Stderr, Duration::from_secs(60), |l| {
        l.starts_with("Serving metrics at http://")
    })?;
    let addr = line
        .trim_start_matches("Serving metrics at http://")
        .trim_end_matches("/metrics.")
        .to_string();
    tracer.wait_line(Stream::Stderr, Duration::from_secs(60), |l| {
        l.starts_with("Attached")
    })?;
    let pid = tracer.pid();

    // The workload: a shell that starts forking-server after forking-server, and says how
    // many processes it started.
    let script = format!(
        "end=$(( $(date +%s) + {seconds} )); n=0; \
         while [ $(date +%s) -lt $end ]; do \
           {} --children 3 --pairs 2 --pair-ms 1 --block-ms 5 > /dev/null || exit 1; \
           n=$((n + 4)); \
         done; echo $n",
        bin("forking-server").display()
    );
    let workload = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the workload")?;
    println!(
        "{:>6} {:>10} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "time", "CPU (s)", "CPU (%)", "RSS (MiB)", "TARGETS", "OFFCPU_TIME", "scrape"
    );
    let started = Instant::now();
    let cpu_at_start = cpu_seconds(pid)?;
    let (mut last_cpu, mut last_at) = (cpu_at_start, started);
    let mut rss = Vec::new();
    let mut scrape_ms = Vec::new();
    for sample in 1..=SAMPLES {
        let at = started + Duration::from_secs(seconds) * sample as u32 / SAMPLES as u32;
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let cpu = cpu_seconds(pid)?;
        let now = Instant::now();
        let share = (cpu - last_cpu) / now.duration_since(last_at).as_secs_f64();
        (last_cpu, last_at) = (cpu, now);
        let (_, took) = scrape(&addr)?;
        rss.push(rss_mib(pid)?);
        scrape_ms.push(took.as_secs_f64() * 1e3);
        println!(
            "{:>5.0}s {:>10.2} {:>8.1}% {:>9.1} {:>9} {:>10} {:>7.1}ms",
            now.duration_since(started).as_secs_f64(),
            cpu - cpu_at_start,
            share * 100.0,
            rss[rss.len() - 1],
            map_entries("TARGETS"),
            map_entries("OFFCPU_TIME"),
            scrape_ms[scrape_ms.len() - 1],
        );
    }
    let (processes, workload_cpu) = finish_workload(workload)?;
    let elapsed = started.elapsed().as_secs_f64();
    let tracer_cpu = cpu_seconds(pid)? - cpu_at_start;

    // Between scrapes, then a burst of them.
    let idle_from = (cpu_seconds(pid)?, Instant::now());
    std::thread::sleep(Duration::from_secs(5));
    let idle_per_second = (cpu_seconds(pid)? - idle_from.0) / idle_from.1.elapsed().as_secs_f64();
    let burst_from = cpu_seconds(pid)?;
    let mut burst_ms = Vec::new();
    let mut bytes = 0;
    for _ in 0..BURST {
        let (len, took) = scrape(&addr)?;
        bytes = len;
        burst_ms.push(took.as_secs_f64() * 1e3);
    }
    let per_scrape_ms = (cpu_seconds(pid)? - burst_from) / BURST as f64 * 1e3;

    tracer.interrupt();
    let finished = tracer.finish(Duration::from_secs(60))?;
    if !finished.success {
        bail!("tracer failed: {}", error_lines(&finished.stderr, 3));
    }
    let _ = std::fs::remove_dir_all(&dir);

    let tracer_share = tracer_cpu / elapsed;
    let workload_share = workload_cpu / elapsed;
    let early_rss = rss[0];
    let late_rss = rss[rss.len() - 1];
    println!(
        "{processes} processes started in {elapsed:.0} s ({:.0}/s); tracer CPU {tracer_cpu:.2} s \
         ({:.1}% of a CPU), workload {workload_cpu:.2} s ({:.1}%); RSS {early_rss:.1} MiB after \
         a tenth of the run, {late_rss:.1} MiB at its end (VmHWM at exit {:.1} MiB); a scrape \
         of {bytes} bytes: {per_scrape_ms:.2} ms of CPU, median {:.2} ms to answer ({:.2} ms \
         during the run); {:.1} ms of CPU per second between scrapes",
        processes as f64 / elapsed,
        tracer_share * 100.0,
        workload_share * 100.0,
        finished.max_rss_kib as f64 / 1024.0,
        median(&burst_ms),
        median(&scrape_ms),
        idle_per_second * 1e3,
    );
    let figure = |what: &str| format!("11. agent on a churning service: {what}");
    Ok(vec![
        Row {
            figure: figure("CPU share"),
            tracer: format!("{:.1}% of a CPU", tracer_share * 100.0),
            baselines: format!(
                "workload {:.1}% ({:.0} processes/s)",
                workload_share * 100.0,
                processes as f64 / elapsed
            ),
            ratio: format!("{:.2}", tracer_share / workload_share.max(1e-9)),
            goal: "< 1".into(),
            met: super::yes_no(tracer_share < workload_share),
        },
        Row {
            figure: figure("memory"),
            tracer: format!("{late_rss:.1} MiB at the end"),
            baselines: format!("{early_rss:.1} MiB after a tenth"),
            ratio: format!("{:.2}", late_rss / early_rss.max(1e-9)),
            goal: "<= 1.10 (flat)".into(),
            met: super::yes_no(late_rss <= 1.10 * early_rss),
        },
        Row {
            figure: figure("a scrape"),
            tracer: format!(
                "{per_scrape_ms:.2} ms CPU, {:.2} ms to answer",
                median(&burst_ms)
            ),
            baselines: format!("{:.1} ms CPU per second idle", idle_per_second * 1e3),
            ratio: format!("{:.2}", per_scrape_ms / (idle_per_second * 1e3).max(1e-9)),
            goal: "-".into(),
            met: "-".into(),
        },
    ])
}
