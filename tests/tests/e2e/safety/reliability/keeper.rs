//! The link keeper: a tracer and its keeper killed at any step (while attaching or
//! detaching a thousand sites, together, by cgroup, while releasing) never harm the
//! target, and the next start repairs what they left.

use super::*;

/// SIGINT, then SIGKILL a few milliseconds later, while `trace` removes its uprobes from
/// a thousand semaphore-guarded sites: the kernel cannot remove a uprobe from a task with
/// a fatal signal pending ("failed to unregister, leaking uprobe"), so a tracer that
/// removed them itself left breakpoints and raised semaphores in the target for good. The
/// link keeper removes them; every site and semaphore must be back, whatever the delay,
/// and none of the tracer's programs or links may stay in the kernel.
#[privileged_test]
fn a_sigkill_while_detaching_a_thousand_sites_leaves_nothing_behind() {
    require_privileged();
    three_at_a_time(&[0, 2, 5, 8, 12, 20], sigkill_while_detaching);
}

/// Runs `case` for each of `delays`, three at once (each runs a target of 1,000 sites).
fn three_at_a_time(delays: &[u64], case: fn(u64)) {
    for batch in delays.chunks(3) {
        thread::scope(|s| {
            for &delay_ms in batch {
                s.spawn(move || case(delay_ms));
            }
        });
    }
}

fn sigkill_while_detaching(delay_ms: u64) {
    let case = format!("SIGINT, SIGKILL {delay_ms} ms later");
    let program = many_sites().to_str().unwrap();
    let target = Target::start(program, &["--seconds", "60"]);
    let sites = ProbeSites::of(target.pid);
    assert_eq!(sites.semaphores.len(), MANY_SITES, "{case}");
    let tracer = LiveTracer::start(
        &[
            "trace",
            "--count",
            "--pid",
            &target.pid.to_string(),
            "usdt:*:many:*",
        ],
        read_all,
    );
    let objects = TracerObjects::of(tracer.pid());
    objects.assert_listed();
    sites.assert_attached();
    assert!(
        sites.semaphore_values().iter().all(|&v| v == 1),
        "{case}: every semaphore raised"
    );
    target.release();
    thread::sleep(Duration::from_millis(300));
    send(tracer.pid(), libc::SIGINT);
    thread::sleep(Duration::from_millis(delay_ms));
    send(tracer.pid(), libc::SIGKILL);
    let (status, _, _) = tracer.finish();
    // The stop may be over before the SIGKILL comes.
    assert!(
        status.signal() == Some(libc::SIGKILL) || status.success(),
        "{case}: {status:?}"
    );
    assert!(running(target.pid), "{case}: the target still runs");
    sites.wait_untouched(&case, Duration::from_secs(5));
    objects.assert_released();
    send(target.pid, libc::SIGTERM);
    let truth = target.finish();
    assert!(truth["rounds"].as_u64().unwrap() > 0, "{case}");
}

/// SIGKILL while `trace` is still attaching a thousand semaphore-guarded sites (a link
/// that fails half-way unregisters what it had registered, in the killed task's context
/// if the tracer creates it): nothing may be left in the target.
#[privileged_test]
fn a_sigkill_while_attaching_a_thousand_sites_leaves_nothing_behind() {
    require_privileged();
    three_at_a_time(
        &[5, 15, 30, 45, 60, 90, 150, 220, 300],
        sigkill_while_attaching,
    );
}

fn sigkill_while_attaching(delay_ms: u64) {
    let case = format!("SIGKILL {delay_ms} ms after the tracer started");
    let program = many_sites().to_str().unwrap();
    let target = Target::start(program, &["--seconds", "60"]);
    let sites = ProbeSites::of(target.pid);
    let mut tracer = Command::new(tracer_bin())
        .args(["trace", "--count", "--pid", &target.pid.to_string()])
        .arg("usdt:*:many:*")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(delay_ms));
    send(tracer.id(), libc::SIGKILL);
    tracer.wait().unwrap();
    target.release();
    sites.wait_untouched(&case, Duration::from_secs(5));
    // Nor in the tracer's own code (the uprobes that warm the kernel up for the attach):
    // the kernel says when it could not remove one.
    let log = Command::new("dmesg").output().expect("dmesg");
    let leak = format!(":{} failed to unregister", tracer.id());
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        !log.lines().any(|line| line.contains(&leak)),
        "{case}: the kernel leaked a uprobe of the tracer: {}",
        log.lines()
            .filter(|l| l.contains(&leak))
            .collect::<Vec<_>>()
            .join("\n")
    );
    send(target.pid, libc::SIGTERM);
    let truth = target.finish();
    assert!(truth["rounds"].as_u64().unwrap() > 0, "{case}");
}

/// The link keeper of tracer `tracer`: its child named `tracer-keeper`.
fn keeper_of(tracer: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{tracer}/task/{tracer}/children"))
        .unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .find(|child| {
            std::fs::read_to_string(format!("/proc/{child}/comm"))
                .is_ok_and(|comm| comm.trim() == "tracer-keeper")
        })
        .unwrap_or_else(|| panic!("tracer {tracer} has no link keeper"))
}

/// The state letter of process `pid` (`S`, `T`, `Z`...), or `None` once it is gone.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// A `trace --count` of every probe of a `many-sites` target just released, attached
/// (every semaphore raised) and running for 300 ms: the target, its sites, the tracer and
/// what it holds.
fn many_sites_traced() -> (Target, ProbeSites, LiveTracer<String>, TracerObjects) {
    let target = Target::start(many_sites().to_str().unwrap(), &["--seconds", "60"]);
    let sites = ProbeSites::of(target.pid);
    let tracer = LiveTracer::start(
        &[
            "trace",
            "--count",
            "--pid",
            &target.pid.to_string(),
            "usdt:*:many:*",
        ],
        read_all,
    );
    let objects = TracerObjects::of(tracer.pid());
    objects.assert_listed();
    sites.assert_attached();
    target.release();
    thread::sleep(Duration::from_millis(300));
    (target, sites, tracer, objects)
}

/// After a kill of tracer and keeper: the target must live on (a breakpoint left without
/// its uprobe kills it with SIGTRAP at its next hit), and the next tracer to start must
/// release whatever was left, saying so, and leave every site and semaphore as the file
/// has them. Returns whether something was left for it.
fn assert_repaired_by_the_next_start(
    case: &str,
    target: Target,
    sites: &ProbeSites,
    objects: &TracerObjects,
) -> bool {
    assert_repaired_by_a_start(case, target, sites, objects, true)
}

/// [`assert_repaired_by_the_next_start`]; with `says_so` false, the release may be
/// another test's tracer's (any start repairs), whose words this test cannot read.
fn assert_repaired_by_a_start(
    case: &str,
    target: Target,
    sites: &ProbeSites,
    objects: &TracerObjects,
    says_so: bool,
) -> bool {
    thread::sleep(Duration::from_secs(1));
    assert!(
        running(target.pid),
        "{case}: the target died after the kill"
    );
    let left = sites.breakpoints() > 0;
    let next = run_tracer(&[
        "trace",
        "--count",
        "--duration",
        "100ms",
        "--pid",
        &target.pid.to_string(),
        "usdt:*:many:p0",
    ]);
    let stderr = next.stderr.as_str();
    assert!(next.status.success(), "{case}: the next tracer: {stderr}");
    if left && says_so {
        assert!(
            stderr.contains("left its probes attached: released"),
            "{case}: the next tracer found the probes left and said nothing: {stderr}"
        );
    }
    sites.wait_untouched(case, Duration::from_secs(2));
    objects.assert_released();
    assert_eq!(
        dl_debug_state_breakpoints(target.pid, &ld_so_of(target.pid)),
        0,
        "{case}: a breakpoint left at _dl_debug_state: the next dlopen kills the target"
    );
    assert!(running(target.pid), "{case}: the target died");
    send(target.pid, libc::SIGTERM);
    let truth = target.finish();
    assert!(truth["rounds"].as_u64().unwrap() > 0, "{case}");
    left
}

/// SIGKILL to the tracer and its keeper together (as `pkill -9 -f tracer` sends it),
/// mid-trace or a few milliseconds after a SIGINT: the kernel cannot remove a uprobe for
/// a killed task, so the keeper's links are pinned and outlive it; the target must run on
/// unharmed, and the next tracer start must release them.
#[privileged_test]
fn killing_the_tracer_and_its_keeper_together_never_harms_the_target() {
    require_privileged();
    for delay_ms in [None, Some(0), Some(2), Some(5), Some(10)] {
        let case = match delay_ms {
            None => "SIGKILL to tracer and keeper mid-trace".to_string(),
            Some(ms) => format!("SIGINT, then SIGKILL to tracer and keeper {ms} ms later"),
        };
        let (target, sites, tracer, objects) = many_sites_traced();
        let keeper = keeper_of(tracer.pid());
        if let Some(ms) = delay_ms {
            send(tracer.pid(), libc::SIGINT);
            thread::sleep(Duration::from_millis(ms));
        }
        // Either may have exited by itself already: the stop can be over this soon.
        for pid in [tracer.pid(), keeper] {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        tracer.finish();
        assert_repaired_by_the_next_start(&case, target, &sites, &objects);
    }
}

/// A keeper killed while it releases leaves the links it had pinned (see the tracer's
/// `loader::pins`) attached: the next tracer to start releases them and says so. Made
/// certain here by pinning a running tracer's links where a keeper would have, then
/// killing tracer and keeper. The pins are named after a stand-in process, so that the
/// tracers other tests start meanwhile take them for a live keeper's; once it is gone,
/// the next start (this test's or another's) releases them.
#[privileged_test]
fn the_next_start_releases_what_a_keeper_killed_while_releasing_left() {
    require_privileged();
    let case = "a link pinned by a keeper that is gone";
    let (target, sites, tracer, objects) = many_sites_traced();
    let keeper = keeper_of(tracer.pid());
    let (_, links) = bpf_objects(keeper);
    assert!(!links.is_empty(), "the keeper holds links");
    let mut stand_in = Command::new("sleep").arg("60").spawn().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", stand_in.id())).unwrap();
    // Field 22, counted after the command name's closing parenthesis.
    let start_ticks = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap();
    let dir = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/tracer/keeper-{}-{start_ticks}",
        stand_in.id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    // Every link: which one holds the sites (rather than the loader's `dlopen` or a
    // warm-up being released) is the keeper's business. One released meanwhile is gone
    // and cannot be pinned.
    let pinned = links.iter().enumerate().filter(|(i, link)| {
        Command::new("bpftool")
            .args(["link", "pin", "id", &link.to_string()])
            .arg(dir.join(format!("link-{i}")))
            .status()
            .unwrap()
            .success()
    });
    assert!(
        pinned.count() > 0,
        "bpftool link pin pinned none of {links:?}"
    );
    send(tracer.pid(), libc::SIGKILL);
    send(keeper, libc::SIGKILL);
    tracer.finish();
    thread::sleep(Duration::from_millis(500));
    assert!(
        sites.breakpoints() > 0,
        "{case}: the pinned links did not keep their uprobes"
    );
    stand_in.kill().unwrap();
    stand_in.wait().unwrap();
    // From here any test's tracer may be the first to start, and release them.
    assert_repaired_by_a_start(case, target, &sites, &objects, false);
    assert!(!dir.exists(), "{case}: the pins directory is left");
}

/// A cgroup kill (`systemctl kill`, `docker kill`, `cgroup.kill`) of tracer and keeper
/// 0-30 ms after a SIGINT: the target must run on unharmed and end clean.
#[privileged_test]
fn a_cgroup_kill_of_tracer_and_keeper_never_harms_the_target() {
    require_privileged();
    for delay_ms in [0, 10, 30] {
        let case = format!("SIGINT, then cgroup.kill {delay_ms} ms later");
        let (target, sites, tracer, objects) = many_sites_traced();
        let keeper = keeper_of(tracer.pid());
        let cgroup = TestCgroup::create(cgroup_v2_root(), &format!("kill-{delay_ms}"));
        assert!(
            cgroup.0.join("cgroup.kill").exists(),
            "{}: not a cgroup v2 directory with cgroup.kill",
            cgroup.0.display()
        );
        for pid in [tracer.pid(), keeper] {
            cgroup.add(pid);
        }
        send(tracer.pid(), libc::SIGINT);
        thread::sleep(Duration::from_millis(delay_ms));
        std::fs::write(cgroup.0.join("cgroup.kill"), "1").unwrap();
        let (status, _, _) = tracer.finish();
        eprintln!("{case}: the tracer ended with {status:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !matches!(state_of(keeper), None | Some('Z')) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        drop(cgroup);
        assert_repaired_by_the_next_start(&case, target, &sites, &objects);
    }
}

/// The keeper ignores every catchable signal (a stray SIGALRM, SIGPWR or SIGHUP must not
/// end it with its links), and a keeper stopped by SIGSTOP is continued by its tracer at
/// once, mid-trace and at the stop: the tracer never waits on it for good.
#[privileged_test]
fn the_keeper_outlives_catchable_signals_and_is_continued_when_stopped() {
    require_privileged();
    let (target, sites, mut tracer, objects) = many_sites_traced();
    let keeper = keeper_of(tracer.pid());
    for signal in [
        libc::SIGALRM,
        libc::SIGPWR,
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGVTALRM,
        libc::SIGRTMIN(),
    ] {
        send(keeper, signal);
        thread::sleep(Duration::from_millis(20));
        assert!(
            !matches!(state_of(keeper), None | Some('Z')),
            "signal {signal} ended the keeper"
        );
    }
    send(keeper, libc::SIGSTOP);
    assert!(
        tracer.wait_for_text("was stopped by a signal: continued it"),
        "nothing said of the stopped keeper: {}",
        tracer.stderr
    );
    thread::sleep(Duration::from_millis(100));
    assert_ne!(state_of(keeper), Some('T'), "the keeper stays stopped");
    // Stopped again right before the stop: the detach must not wait for it for good.
    send(keeper, libc::SIGSTOP);
    send(tracer.pid(), libc::SIGINT);
    let started = Instant::now();
    let (status, stdout, stderr) = tracer.finish();
    assert!(status.success(), "{status:?} {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the stop took {:?}",
        started.elapsed()
    );
    assert!(stdout.contains("many:p0"), "no report: {stdout}");
    sites.wait_untouched("keeper stopped at the stop", Duration::from_secs(2));
    objects.assert_released();
    send(target.pid, libc::SIGTERM);
    target.finish();
}

/// A keeper killed mid-trace is noticed at once: the trace stops, says why, prints its
/// report and releases the links the keeper had pinned.
#[privileged_test]
fn a_killed_keeper_is_noticed_at_once_and_the_report_still_printed() {
    require_privileged();
    let (target, sites, tracer, objects) = many_sites_traced();
    let keeper = keeper_of(tracer.pid());
    send(keeper, libc::SIGKILL);
    let started = Instant::now();
    let (status, stdout, stderr) = tracer.finish();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the tracer noticed after {:?}",
        started.elapsed()
    );
    assert!(status.success(), "{status:?} {stderr}");
    assert!(
        stderr.contains("Stopped: the link keeper was killed"),
        "{stderr}"
    );
    assert!(stdout.contains("many:p0"), "no report: {stdout}");
    assert!(running(target.pid), "the target died");
    sites.wait_untouched("keeper killed mid-trace", Duration::from_secs(2));
    objects.assert_released();
    send(target.pid, libc::SIGTERM);
    target.finish();
}
