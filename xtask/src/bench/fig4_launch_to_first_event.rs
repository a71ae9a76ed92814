//! Figure 4: launch to first event. t0 = CLOCK_MONOTONIC just before spawning the tool;
//! the target fires `tracer:gc__begin` every 100 µs; the figure is the first event's
//! timestamp (bpf_ktime_get_ns, the same clock) minus t0: for `tracer attach` the earliest
//! `first_hit_monotonic_ns` of its JSON report, for `tracer trace` the first event's
//! `time_ns`, for bpftrace the `nsecs` its first event prints. With `TRACER_BASELINE` set
//! to another build of tracer (the one before a change), its `attach` and `trace` are
//! measured in the same rounds, to judge the change against it.
//!
//! Beside them, in the same rounds and after the same rest, the kernel's own share: one
//! bare uprobe registration (`perf_event_open`, no program). The first registration after
//! a quiet spell waits for an RCU grace period (`rcu_sync_enter` on `dup_mmap_sem`), which
//! every uprobe-based tool pays before its first event, however fast it is otherwise.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::{
    Config, PeakMemory, Row,
    harness::{Stream, Tool, bin, json_lines, monotonic_ns, ready_pid},
    stats::{list_ms, median},
    yes_no,
};

/// How long the machine rests before each launch.
const SETTLE: Duration = Duration::from_millis(300);

/// The tools figure 4 starts, in the order of the first round (later rounds rotate it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    TracerAttach,
    TracerTrace,
    Bpftrace,
    BaselineAttach,
    BaselineTrace,
}

/// What a round times: a tool's launch, or the kernel's share of one.
#[derive(Clone, Copy)]
enum Measured {
    Launch(Launcher),
    /// One bare uprobe registration, timed in this process.
    UprobeRegistration,
}

pub(super) fn measure(config: &Config, memory: &mut PeakMemory) -> Result<Vec<Row>> {
    let loop_bin = bin("bench-usdt-loop");
    let probe = format!("usdt:{}:tracer:gc__begin", loop_bin.display());
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-launch-{}", std::process::id()));
    let baseline = std::env::var_os("TRACER_BASELINE").map(std::path::PathBuf::from);
    let mut launchers = vec![
        Measured::Launch(Launcher::TracerAttach),
        Measured::Launch(Launcher::TracerTrace),
        Measured::Launch(Launcher::Bpftrace),
        Measured::UprobeRegistration,
    ];
    if baseline.is_some() {
        launchers.extend([
            Measured::Launch(Launcher::BaselineAttach),
            Measured::Launch(Launcher::BaselineTrace),
        ]);
    }
    let floor_site = own_code_site(never_called as *const () as usize)?;
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); launchers.len()];
    for round in 0..config.rounds {
        for k in 0..launchers.len() {
            let which = (k + round) % launchers.len();
            let mut target = Tool::spawn(
                Command::new(&loop_bin).args(["--forever", "--interval-us", "100"]),
                "bench-usdt-loop",
            )?;
            let pid = ready_pid(&mut target)?.to_string();
            // The previous launch's teardown (its programs, maps and uprobes freed after
            // RCU grace periods) is let to finish first: a launch measured while those
            // are still under way waits for them too, whichever tool it is.
            std::thread::sleep(SETTLE);
            let t0 = monotonic_ns();
            let first = match launchers[which] {
                Measured::UprobeRegistration => register_uprobe(&floor_site),
                Measured::Launch(launcher) => launch_to_first_event(
                    launcher,
                    baseline.as_deref(),
                    &pid,
                    &probe,
                    &out_dir,
                    memory,
                ),
            };
            target.kill();
            ms[which].push(first?.saturating_sub(t0) as f64 / 1e6);
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    let [attach, trace, bpftrace, floor] = [0, 1, 2, 3].map(|i| median(&ms[i]));
    if let Some(path) = &baseline {
        let [old_attach, old_trace] = [4, 5].map(|i| median(&ms[i]));
        println!(
            "  baseline {}: attach median {old_attach:.1} ms (runs {}), trace {old_trace:.1} ms (runs {}); this build: attach {:+.0}%, trace {:+.0}%",
            path.display(),
            list_ms(&ms[4]),
            list_ms(&ms[5]),
            (attach / old_attach - 1.0) * 100.0,
            (trace / old_trace - 1.0) * 100.0
        );
    }
    println!(
        "target fires tracer:gc__begin every 100 us; first event time - CLOCK_MONOTONIC before spawn, {} rounds, {} ms of rest before each launch",
        config.rounds,
        SETTLE.as_millis()
    );
    println!(
        "  tracer attach --pid:  median {attach:.1} ms (runs {}; first_hit_monotonic_ns of its JSON report)",
        list_ms(&ms[0])
    );
    println!(
        "  tracer trace --pid:   median {trace:.1} ms (runs {}; time_ns of the first event)",
        list_ms(&ms[1])
    );
    println!(
        "  bpftrace -p:          median {bpftrace:.1} ms (runs {}; nsecs printed by the first event)",
        list_ms(&ms[2])
    );
    println!(
        "  one uprobe registration: median {floor:.1} ms (runs {}; perf_event_open alone, in this process: the kernel's share of every launch)",
        list_ms(&ms[3])
    );
    println!(
        "  bpftrace / tracer: attach {:.1}x, trace {:.1}x; above the kernel's share: attach {:+.1} ms, trace {:+.1} ms, bpftrace {:+.1} ms",
        bpftrace / attach,
        bpftrace / trace,
        attach - floor,
        trace - floor,
        bpftrace - floor
    );
    let row = |figure: &str, tracer: f64| Row {
        figure: figure.into(),
        tracer: format!("{tracer:.1} ms"),
        // The kernel's share of both: no launch can be faster.
        baselines: format!("bpftrace {bpftrace:.1} ms (kernel {floor:.1} ms)"),
        ratio: format!(
            "{:.2}x ({:.1}x faster)",
            tracer / bpftrace,
            bpftrace / tracer
        ),
        goal: "<= 20 ms, 5x faster".into(),
        met: yes_no(tracer <= 20.0 && bpftrace / tracer >= 5.0),
    };
    Ok(vec![
        row("4. launch to first event, attach", attach),
        row("4b. launch to first event, trace", trace),
    ])
}

/// `PERF_FLAG_FD_CLOEXEC` of `linux/perf_event.h`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Never called: the instruction the kernel-floor uprobe is registered at.
#[inline(never)]
extern "C" fn never_called() {
    std::hint::black_box(());
}

/// The file and file offset of the code at `address` in this process.
fn own_code_site(address: usize) -> Result<(std::ffi::CString, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [range, perms, offset, _dev, _inode, path, ..] = fields[..] else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16);
        let (start, end, offset) = (hex(start)?, hex(end)?, hex(offset)?);
        if perms.contains('x') && (start..end).contains(&(address as u64)) {
            let path = std::ffi::CString::new(path)?;
            return Ok((path, address as u64 - start + offset));
        }
    }
    anyhow::bail!("no executable mapping holds {address:#x}")
}

/// Registers a uprobe at `site` for every process (on CPU 0, as tracer's early
/// registration does) and removes it. Returns CLOCK_MONOTONIC when the registration
/// returned: the removal waits for grace periods of its own, not part of any launch.
fn register_uprobe(site: &(std::ffi::CString, u64)) -> Result<u64> {
    let pmu_type: u32 = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
        .context("uprobe PMU type")?
        .trim()
        .parse()?;
    // perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, 72 bytes): type, size, then
    // config1 (the path) at byte 56 and config2 (the offset) at byte 64; zeros elsewhere.
    let mut attr = [0u64; 9];
    attr[0] = u64::from(pmu_type) | (72u64 << 32);
    attr[7] = site.0.as_ptr() as u64;
    attr[8] = site.1;
    // SAFETY: `attr` is a valid perf_event_attr of the size it states, and the path it
    // points to outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    let registered = monotonic_ns();
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("perf_event_open of a uprobe");
    }
    // SAFETY: the fd was just opened and nothing else holds it.
    unsafe { libc::close(fd as i32) };
    Ok(registered)
}

/// Starts `launcher` on process `pid` and returns the CLOCK_MONOTONIC time of the first
/// event it recorded, as the tool itself reports it.
fn launch_to_first_event(
    launcher: Launcher,
    baseline: Option<&Path>,
    pid: &str,
    probe: &str,
    out_dir: &Path,
    memory: &mut PeakMemory,
) -> Result<u64> {
    let tracer = match launcher {
        Launcher::BaselineAttach | Launcher::BaselineTrace => {
            baseline.context("no baseline")?.to_path_buf()
        }
        _ => bin("tracer"),
    };
    let (mut cmd, name, what) = match launcher {
        Launcher::TracerAttach | Launcher::BaselineAttach => {
            let mut cmd = Command::new(&tracer);
            cmd.args(["attach", "--pid", pid, "--format", "json", "-o"])
                .arg(out_dir);
            (cmd, "tracer", "attach (launch)")
        }
        Launcher::TracerTrace | Launcher::BaselineTrace => {
            let mut cmd = Command::new(&tracer);
            cmd.args(["trace", "--format", "json", "--pid", pid, probe]);
            (cmd, "tracer", "trace (per-event JSON)")
        }
        Launcher::Bpftrace => {
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-p", pid, "-e"]);
            cmd.arg(format!(
                "{probe} {{ printf(\"first %llu\\n\", nsecs); exit(); }}"
            ));
            (cmd, "bpftrace", "trace (per-event JSON)")
        }
    };
    let mut tool = Tool::spawn(&mut cmd, name)?;
    let timeout = Duration::from_secs(30);
    let first = match launcher {
        Launcher::TracerAttach | Launcher::BaselineAttach => tool
            .wait_line(Stream::Stderr, timeout, |l| l.starts_with("Attached"))
            .map(|_| std::thread::sleep(Duration::from_millis(20))),
        Launcher::TracerTrace | Launcher::BaselineTrace => tool
            .wait_line(Stream::Stdout, timeout, |l| {
                serde_json::from_str::<Value>(l).is_ok_and(|event| event["time_ns"].is_u64())
            })
            .map(|_| ()),
        Launcher::Bpftrace => tool
            .wait_line(Stream::Stdout, timeout, |l| l.starts_with("first "))
            .map(|_| ()),
    };
    tool.interrupt();
    let finished = tool.finish(Duration::from_secs(10));
    first?;
    let finished = finished?;
    // The baseline build's memory is not this build's (figure 6).
    if !matches!(launcher, Launcher::BaselineAttach | Launcher::BaselineTrace) {
        memory.note(name, what, finished.max_rss_kib);
    }
    match launcher {
        // attach reports when each probe first fired; the earliest is its first event.
        // Its stdout is the report, one pretty-printed JSON object; probes not hit have null.
        Launcher::TracerAttach | Launcher::BaselineAttach => {
            let report: Value = serde_json::from_str(&finished.stdout)
                .with_context(|| format!("tracer attach's report: {}", finished.stdout))?;
            report["probes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|probe| probe["first_hit_monotonic_ns"].as_u64())
                .min()
                .with_context(|| format!("no probe hit in {}", finished.stdout))
        }
        Launcher::TracerTrace | Launcher::BaselineTrace => json_lines(&finished.stdout)
            .find_map(|event| event["time_ns"].as_u64())
            .with_context(|| format!("no event in {}", finished.stdout)),
        Launcher::Bpftrace => {
            let line = finished
                .stdout
                .lines()
                .find(|l| l.starts_with("first "))
                .context("bpftrace printed no first event")?;
            Ok(line["first ".len()..].trim().parse::<u64>()?)
        }
    }
}
