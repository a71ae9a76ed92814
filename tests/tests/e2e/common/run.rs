//! `TracerRun`: one run of the tracer, its command line built up as a user types it, then
//! started (and left running until it attached) or run to its end.

use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
};

use super::{TracePrinted, Tracer, parse_trace_json, tracer_bin};

/// A tracer command line, not yet run.
#[must_use = "a TracerRun does nothing until it is started or run"]
pub struct TracerRun {
    binary: PathBuf,
    args: Vec<OsString>,
}

impl TracerRun {
    /// `tracer COMMAND`, of the binary the tests run ([`tracer_bin`]).
    pub fn new(command: &str) -> TracerRun {
        TracerRun {
            binary: tracer_bin(),
            args: vec![command.into()],
        }
    }

    pub fn attach() -> TracerRun {
        TracerRun::new("attach")
    }

    pub fn trace() -> TracerRun {
        TracerRun::new("trace")
    }

    pub fn profile() -> TracerRun {
        TracerRun::new("profile")
    }

    /// The tracer binary at `binary` instead (an installed copy, say).
    pub fn binary(mut self, binary: &Path) -> TracerRun {
        self.binary = binary.to_path_buf();
        self
    }

    /// `--pid PID`.
    pub fn pid(self, pid: u32) -> TracerRun {
        self.arg("--pid").arg(pid.to_string())
    }

    /// `--format json`.
    pub fn json(self) -> TracerRun {
        self.args(["--format", "json"])
    }

    /// `-o DIR`: where the files go.
    pub fn out(self, dir: &Path) -> TracerRun {
        self.arg("-o").arg(dir)
    }

    /// `-d DURATION`.
    pub fn duration(self, duration: &str) -> TracerRun {
        self.args(["-d", duration])
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> TracerRun {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<A: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = A>) -> TracerRun {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// `-- PROGRAM ARGS`: the command the tracer launches and follows.
    pub fn command<A: AsRef<OsStr>>(
        self,
        program: impl AsRef<OsStr>,
        args: impl IntoIterator<Item = A>,
    ) -> TracerRun {
        self.arg("--").arg(program).args(args)
    }

    /// Starts the tracer and returns once it printed that it attached.
    pub fn start(self) -> Tracer {
        Tracer::spawn(self.command_line(), self.describe())
    }

    /// Runs the tracer to its end, whatever its exit.
    pub fn output(self) -> Finished {
        let described = self.describe();
        let out = self
            .command_line()
            .output()
            .unwrap_or_else(|e| panic!("cannot run {described}: {e}"));
        Finished {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            described,
        }
    }

    /// Runs the tracer to its end; fails the test unless it succeeded.
    pub fn run(self) -> Finished {
        let finished = self.output();
        assert!(
            finished.status.success(),
            "{} failed ({}):\n{}\nstdout:\n{}",
            finished.described,
            finished.status,
            finished.stderr,
            finished.stdout
        );
        finished
    }

    fn command_line(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command.args(&self.args);
        command
    }

    /// `tracer ARGS` as a shell would show it, for failure messages.
    fn describe(&self) -> String {
        let mut line = String::from("tracer");
        for arg in &self.args {
            line.push(' ');
            line.push_str(&arg.to_string_lossy());
        }
        line
    }
}

/// A tracer run to its end.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    described: String,
}

impl Finished {
    /// Standard output as one JSON document (`attach --format json`'s report).
    pub fn report(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "{} printed no JSON report ({e}):\n{}\nstderr:\n{}",
                self.described, self.stdout, self.stderr
            )
        })
    }

    /// Standard output as `trace --format json` prints it: events and other JSON lines.
    pub fn trace(&self) -> TracePrinted {
        parse_trace_json(&self.stdout)
    }

    /// The first JSON line of standard output that has `key`.
    pub fn json_line_with(&self, key: &str) -> serde_json::Value {
        self.stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .find(|v: &serde_json::Value| v.get(key).is_some())
            .unwrap_or_else(|| panic!("no JSON line with {key:?} in {}", self.stdout))
    }
}
