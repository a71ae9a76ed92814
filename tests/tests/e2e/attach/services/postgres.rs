//! PostgreSQL and pgbench, the real thing: backends forked after attaching, every
//! transaction counted as bpftrace and pgbench count them, and the query texts psql sent.

use super::*;

// ---------------------------------------------------------------------------------------
// PostgreSQL 15 and pgbench

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const POSTGRES: &str = "/usr/lib/postgresql/15/bin/postgres";

/// A throwaway PostgreSQL cluster run by the `postgres` user in a directory of its own
/// (also its socket directory; no TCP), autovacuum off, initialized for pgbench (scale
/// 2). Stopped and removed when dropped, whatever the test did.
struct PgCluster {
    dir: PathBuf,
    started: bool,
}

impl PgCluster {
    fn start(name: &str) -> PgCluster {
        let dir = out_dir(name);
        // SAFETY: getpwnam's argument is a NUL-terminated string; the result is read at
        // once, before any other call that could reuse its buffer.
        let (uid, gid) = unsafe {
            let pw = libc::getpwnam(c"postgres".as_ptr());
            assert!(
                !pw.is_null(),
                "no postgres user: PostgreSQL 15 is not installed"
            );
            ((*pw).pw_uid, (*pw).pw_gid)
        };
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut cluster = PgCluster {
            dir,
            started: false,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "--no-sync", "-U", "postgres"],
        );
        let options = format!(
            "-k {} -c listen_addresses='' -c autovacuum=off -c fsync=off",
            cluster.dir.display()
        );
        let log = cluster.dir.join("server.log");
        cluster.started = true;
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
        cluster.pgbench(&["-i", "-s", "2", "-q"]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").to_str().unwrap().to_string()
    }

    /// Runs PG_BIN/`program` `args` as the postgres user; returns its stdout.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join(program))
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} as postgres: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}\n{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pgbench(&self, args: &[&str]) -> String {
        let dir = self.dir.to_str().unwrap().to_string();
        let mut all = vec!["-h", &dir];
        all.extend_from_slice(args);
        all.push("postgres");
        self.run("pgbench", &all)
    }

    /// The postmaster's pid (the first line of postmaster.pid).
    fn postmaster(&self) -> u32 {
        let file = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap();
        file.lines().next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(Path::new(PG_BIN).join("pg_ctl"))
                .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
                .current_dir(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[privileged_test]
fn postgresql_backends_forked_after_attach_are_traced_like_bpftrace_and_pgbench_count() {
    require_privileged();
    const CLIENTS: u64 = 4;
    let cluster = PgCluster::start("services-pg");
    let postmaster = cluster.postmaster();
    // The checkpointer, background writer, walwriter, ...: none of them start transactions.
    let background = children_of(postmaster);
    let dir = cluster.dir.join("attach");
    std::fs::create_dir(&dir).unwrap();
    let tracer = Running::start(
        TracerRun::attach()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args([
                "--latency",
                "postgresql:transaction__start,postgresql:transaction__commit",
            ]),
    );
    let count = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .arg("usdt:*:postgresql:transaction__start"),
    );
    // bpftrace over the binary, counting only this cluster's processes (the postmaster's
    // children: every backend is one); `@all` counts every postgres on the machine.
    let script = format!(
        "BEGIN {{ printf(\"Tracing transactions\\n\"); }}
         usdt:{POSTGRES}:postgresql:transaction__start {{
             @all = count();
             if (curtask->real_parent->tgid == {postmaster}) {{
                 @start = count(); @start_by_pid[pid] = count();
             }}
         }}
         usdt:{POSTGRES}:postgresql:transaction__commit /curtask->real_parent->tgid == {postmaster}/ {{
             @commit = count(); @commit_by_pid[pid] = count();
         }}
         usdt:{POSTGRES}:postgresql:transaction__abort /curtask->real_parent->tgid == {postmaster}/ {{
             @abort = count();
         }}"
    );
    let bpftrace = Bpftrace::start(&["-e", &script]);

    // The backends are forked now, after both attached: one per client, and one for
    // pgbench's own first connection.
    let clients = CLIENTS.to_string();
    let pgbench = cluster.pgbench(&["-n", "-c", &clients, "-j", "2", "-T", "3"]);
    let processed: u64 = pgbench
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no processed count from pgbench:\n{pgbench}"));
    // The backends exit after pgbench disconnects: wait for them, then stop both.
    let deadline = Instant::now() + Duration::from_secs(5);
    while children_of(postmaster) != background && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    tracer.interrupt();
    count.interrupt();
    let report = tracer.finish_json(&dir);
    // Its counts are read after bpftrace's and pgbench's are checked.
    let (count_ok, count_out, count_err) = count.finish();
    let bt = bpftrace.stop();
    eprintln!(
        "pgbench: {processed} transactions processed with {CLIENTS} clients\nbpftrace:\n{}",
        bt.text
    );
    let ctx = || {
        format!(
            "pgbench:\n{pgbench}\nbpftrace:\n{}\n{}",
            bt.text,
            report.context()
        )
    };

    // What bpftrace saw: every backend starts one transaction as it starts (InitPostgres
    // reads the catalogs in one), then pgbench's: so each client's backend starts its
    // share of `processed` plus one, and pgbench's first connection (its startup, and the
    // two queries pgbench asks before the run: the scale and the partitioning of
    // pgbench_accounts) starts 3. All of them commit.
    let starts = bt.int("start");
    assert_eq!(
        starts,
        processed + CLIENTS + 3,
        "transaction__start by bpftrace = pgbench's processed {processed} + {CLIENTS} \
         clients + 3\n{}",
        ctx()
    );
    assert_eq!(bt.int("commit"), starts, "{}", ctx());
    let backends = bt.keyed("start_by_pid");
    assert_eq!(
        backends.len() as u64,
        CLIENTS + 1,
        "one backend per client and pgbench's first\n{}",
        ctx()
    );
    assert_eq!(
        backends.values().filter(|&&n| n == 3).count(),
        1,
        "pgbench's first connection\n{}",
        ctx()
    );

    // The tracer saw the same, in the same processes.
    assert_eq!(
        report.hits("postgresql:transaction__start"),
        starts,
        "tracer's transaction__start hits, bpftrace's count\n{}",
        ctx()
    );
    let count_output = format!("trace --count stdout:\n{count_out}\nstderr:\n{count_err}");
    assert!(count_ok, "tracer trace failed\n{count_output}");
    let counts = trace_counts(&count_out);
    assert_eq!(
        counts.get("postgresql:transaction__start"),
        Some(&starts),
        "trace --count --children, bpftrace's count\n{count_output}\n{}",
        ctx()
    );
    assert_eq!(
        report.hits("postgresql:transaction__commit"),
        bt.int("commit"),
        "{}",
        ctx()
    );
    let processes = report.processes();
    assert!(
        processes.contains_key(&postmaster),
        "the postmaster {postmaster}\n{}",
        ctx()
    );
    // Each client's backend is named by the title it gives itself, as ps shows it.
    // pgbench's first connection lives a few milliseconds: the tracer may first see it
    // after it has exited, and then names it by the kernel's name for it.
    for (pid, &transactions) in &backends {
        let pid: u32 = pid.parse().unwrap();
        let name = processes.get(&pid);
        let titled = name.is_some_and(|name| name.starts_with("postgres: "));
        let short_lived = transactions == 3 && name.is_some_and(|name| name == "postgres");
        assert!(
            titled || short_lived,
            "backend {pid} is among the processes, by its title: {name:?}\n{}",
            ctx()
        );
    }
    let commits_by_pid = bt.keyed("commit_by_pid");
    for (name, latency) in report.latencies(
        "postgresql:transaction__start",
        "postgresql:transaction__commit",
    ) {
        // Every transaction begins and commits on its backend's one thread.
        assert_eq!(latency["count"], starts, "latency {name}\n{}", ctx());
        let per = report.per_process(&name, latency);
        for (pid, commits) in &commits_by_pid {
            let pid: u32 = pid.parse().unwrap();
            assert_eq!(
                per.get(&pid).map(|p| p.count),
                Some(*commits),
                "latency {name}: backend {pid}\n{}",
                ctx()
            );
        }
        assert_eq!(
            per.values().map(|p| p.count).sum::<u64>(),
            starts,
            "latency {name}: per_process adds up\n{}",
            ctx()
        );
    }
    assert_eq!(report.json["lost"]["unmatched_ends"], 0, "{}", ctx());
}

#[privileged_test]
fn postgresql_query_texts_are_what_psql_sent_and_what_bpftrace_reads() {
    require_privileged();
    let cluster = PgCluster::start("services-pg-str");
    let postmaster = cluster.postmaster();
    // Each shorter than bpftrace's 63 bytes but the last, which both cut.
    let long = format!("SELECT '{}' AS long_text", "x".repeat(80));
    let queries = [
        "SELECT 1 AS one",
        "CREATE TABLE str_test (t text)",
        "INSERT INTO str_test VALUES ('it''s', E'tab\\there')",
        "SELECT count(*) FROM str_test WHERE t LIKE '%s'",
        "SELECT 'naïve' AS \"quoted\"",
        &long,
    ];
    let tracer = Running::start(
        TracerRun::trace()
            .json()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .args([
                "--str",
                "query__start:arg0",
                "usdt:*:postgresql:query__start",
            ]),
    );
    // Only this cluster's backends: the postmaster's children.
    let script = format!(
        "BEGIN {{ printf(\"Tracing\\n\"); }}
         usdt:{POSTGRES}:postgresql:query__start /curtask->real_parent->tgid == {postmaster}/ {{
             printf(\"Q:%s\\n\", str(arg0));
         }}"
    );
    let bpftrace = Bpftrace::start(&["-e", &script]);
    let dir = cluster.dir.to_str().unwrap().to_string();
    let mut psql = vec!["-h", &dir, "-X", "-q", "-d", "postgres"];
    for query in &queries {
        psql.extend_from_slice(&["-c", query]);
    }
    cluster.run("psql", &psql);
    // bpftrace prints as it goes; the tracer too, but both are read at their end.
    std::thread::sleep(Duration::from_millis(500));
    let bt = bpftrace.stop();
    tracer.interrupt();
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "{stderr}\n{out}");
    let ours: Vec<(String, bool)> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|event| {
            let s = &event["strings"]["arg0"];
            assert!(s["hex"].is_null(), "valid UTF-8: {event}");
            (
                s["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{event}"))
                    .to_string(),
                s["truncated"].as_bool().unwrap(),
            )
        })
        .collect();
    // 64 bytes at most (the default), the long one cut and marked.
    let expected: Vec<(String, bool)> = queries
        .iter()
        .map(|q| (q[..q.len().min(64)].to_string(), q.len() > 64))
        .collect();
    assert_eq!(ours, expected, "{stderr}");
    // bpftrace's 64 bytes include the NUL: 63 of text.
    let theirs: Vec<&str> = bt
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("Q:"))
        .collect();
    let ours_63: Vec<&str> = ours
        .iter()
        .map(|(text, _)| &text[..text.len().min(63)])
        .collect();
    assert_eq!(theirs, ours_63, "bpftrace:\n{}", bt.text);
}
