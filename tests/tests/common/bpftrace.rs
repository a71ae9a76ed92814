//! bpftrace beside the tracer: starting it, knowing when it is attached, stopping it and
//! reading the maps it prints at exit.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
    process::{Child, ChildStderr, ChildStdout, Command, Stdio},
    sync::Once,
};

/// A running `bpftrace` whose script prints a line starting with `Tracing` in BEGIN, which
/// bpftrace runs once every probe is attached.
pub struct Bpftrace {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
}

impl Bpftrace {
    /// Starts `bpftrace -p PID ARGS` and returns once it is attached.
    pub fn for_pid(pid: u32, args: &[&str]) -> Bpftrace {
        let pid = pid.to_string();
        let mut all = vec!["-p", &pid];
        all.extend_from_slice(args);
        Bpftrace::start(&all)
    }

    /// Starts `bpftrace ARGS` and returns once it is attached. tracefs is mounted first if
    /// it is not (bpftrace needs it for some probe types; it stays mounted).
    pub fn start(args: &[&str]) -> Bpftrace {
        Bpftrace::start_in(Path::new("."), args)
    }

    /// [`Bpftrace::start`] in directory `dir`: its `usdt:*` is a file pattern there.
    pub fn start_in(dir: &Path, args: &[&str]) -> Bpftrace {
        mount_tracefs();
        let mut child = Command::new("bpftrace")
            .current_dir(dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bpftrace is installed by `cargo xtask setup`");
        let mut bpftrace = Bpftrace {
            stdout: BufReader::new(child.stdout.take().unwrap()),
            stderr: child.stderr.take().unwrap(),
            child,
        };
        let mut early = String::new();
        loop {
            let mut line = String::new();
            if bpftrace.stdout.read_line(&mut line).unwrap() == 0 {
                let mut err = String::new();
                bpftrace.stderr.read_to_string(&mut err).unwrap();
                let status = bpftrace.child.wait().unwrap();
                panic!("bpftrace {args:?} exited before attaching ({status}): {early}{err}");
            }
            early.push_str(&line);
            if line.starts_with("Tracing") {
                return bpftrace;
            }
        }
    }

    /// Waits for bpftrace to exit (with `-p`, it does when the traced process exits) and
    /// parses the maps it printed.
    pub fn finish(mut self) -> BpftraceMaps {
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        self.stderr.read_to_string(&mut err).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "bpftrace failed ({status}): {err}\n{out}");
        BpftraceMaps::parse(&out)
    }

    /// Stops bpftrace as Ctrl-C does (it prints its maps and exits) and parses the maps.
    pub fn stop(self) -> BpftraceMaps {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.finish()
    }
}

/// Mounts tracefs on /sys/kernel/tracing unless something is mounted there.
fn mount_tracefs() {
    static MOUNT: Once = Once::new();
    MOUNT.call_once(|| {
        let mounted = Command::new("mountpoint")
            .args(["-q", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            let status = Command::new("mount")
                .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
                .status()
                .expect("mount (util-linux)");
            assert!(status.success(), "mounting tracefs failed: {status}");
        }
    });
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The maps bpftrace prints at exit, by name with the key (`count`, `runs[2]`): the text
/// after `: `, and for histograms the sum of their bucket counts.
pub struct BpftraceMaps {
    values: BTreeMap<String, String>,
    hist_totals: BTreeMap<String, u64>,
    pub text: String,
}

impl BpftraceMaps {
    pub fn parse(text: &str) -> BpftraceMaps {
        let mut values = BTreeMap::new();
        let mut hist_totals = BTreeMap::new();
        let mut current_hist: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix('@') {
                let (name, value) = rest
                    .split_once(": ")
                    .or_else(|| rest.strip_suffix(':').map(|n| (n, "")))
                    .unwrap_or_else(|| panic!("unexpected map line {line:?}"));
                let value = value.trim();
                current_hist = value.is_empty().then(|| name.to_string());
                if value.is_empty() {
                    hist_totals.insert(name.to_string(), 0);
                } else {
                    values.insert(name.to_string(), value.to_string());
                }
            } else if let (Some(hist), Some(bucket)) = (&current_hist, line.strip_prefix('[')) {
                // `[8K, 16K)     12 |@@@@|`, or `[0]     1 |@|` for the smallest buckets.
                let count = bucket
                    .split_once([')', ']'])
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("unexpected bucket line {line:?}"));
                *hist_totals.get_mut(hist).unwrap() += count;
            } else if line.trim().is_empty() {
                current_hist = None;
            }
        }
        BpftraceMaps {
            values,
            hist_totals,
            text: text.to_string(),
        }
    }

    /// A map holding one integer (`count()`, `sum()`, `min()`, `max()`).
    pub fn int(&self, name: &str) -> u64 {
        let value = self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no @{name}:\n{}", self.text));
        value
            .parse()
            .unwrap_or_else(|e| panic!("@{name}: {value:?}: {e}"))
    }

    /// A `stats()` map, `count N, average A, total T`: (count, total).
    pub fn stats(&self, name: &str) -> (u64, u64) {
        let value = self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no @{name}:\n{}", self.text));
        let field = |field: &str| -> u64 {
            value
                .split(", ")
                .find_map(|part| part.strip_prefix(field))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("@{name}: no {field} in {value:?}"))
        };
        (field("count "), field("total "))
    }

    /// The sum of the bucket counts of histogram `name`.
    pub fn hist_total(&self, name: &str) -> u64 {
        *self
            .hist_totals
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no histogram @{name}:\n{}", self.text))
    }

    /// The keys of the maps `name[KEY]`, with their integer values.
    pub fn keyed(&self, name: &str) -> BTreeMap<String, u64> {
        self.values
            .iter()
            .filter_map(|(k, v)| {
                let key = k.strip_prefix(name)?.strip_prefix('[')?.strip_suffix(']')?;
                Some((key.to_string(), v.parse().ok()?))
            })
            .collect()
    }
}
