//! The life of one run of `attach`, `trace` or `profile`, in the order its steps must
//! take. Each step takes the one before it by value, so none can be skipped, taken twice
//! or taken out of order:
//! 1. [`Session::start`]: what loading needs starts on threads of its own, and the one
//!    target is watched for its exit;
//! 2. [`Session::load`]: the programs load, with the settings the command declares, and
//!    the command attaches what it traces;
//! 3. [`Attaching::go`]: Ctrl-C and SIGTERM stop the run from here on instead of killing
//!    the tracer, so it says the run has started only after this;
//! 4. [`Running::until_stopped`]: the command's work runs until the first reason to stop;
//! 5. [`Stopped::let_signals_kill`]: once the targets are as they were, a second Ctrl-C
//!    ends a tracer still writing its report.

use std::{future::Future, io, time::Duration};

use anyhow::Result;
use tokio::runtime::Runtime;

use crate::{
    kernel::{Launch, LaunchNeeds, Loader, LoaderError, MapsPending, Settings, keeper},
    system::stop::{self, ProcessWatch, StopReason, StopSignals},
    target::{self, TargetTracker},
};

/// What ends a run besides its own work and the signals.
struct Ends {
    /// The one target: its exit stops the run.
    target: Option<ProcessWatch>,
    /// How long the run lasts; `None`: until something else stops it.
    duration: Option<Duration>,
}

/// A run starting: nothing is loaded or attached yet.
pub(crate) struct Session {
    launch: Launch,
    ends: Ends,
}

impl Session {
    /// Starts what loading needs, and watches the one target `single` (which must exist
    /// now) so that its exit stops the run; `duration` is how long the run lasts. Call it
    /// first thing, after forking a command: it starts threads.
    pub(crate) fn start(
        needs: LaunchNeeds,
        single: Option<u32>,
        duration: Option<Duration>,
    ) -> Result<Self> {
        let target = single.map(ProcessWatch::target).transpose()?;
        Ok(Self {
            launch: Launch::start(needs),
            ends: Ends { target, duration },
        })
    }

    /// Loads the programs with `settings`, taking what [`Session::start`] started.
    pub(crate) fn load(
        self,
        settings: &Settings,
    ) -> Result<(Attaching, Loader<MapsPending>), LoaderError> {
        let loader = self.launch.load(settings)?;
        Ok((Attaching { ends: self.ends }, loader))
    }
}

/// A run whose programs are loaded: the command attaches them to its targets.
pub(crate) struct Attaching {
    ends: Ends,
}

impl Attaching {
    /// Catches Ctrl-C and SIGTERM: from now on they stop the run. Until then their
    /// default action kills the tracer without a report, so call this before saying the
    /// run has started (or starting a traced command).
    pub(crate) fn go(self) -> Result<Running> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let signals = StopSignals::catch(&runtime)?;
        Ok(Running {
            runtime,
            signals,
            ends: self.ends,
        })
    }
}

/// A run under way, stopped by Ctrl-C and SIGTERM.
pub(crate) struct Running {
    runtime: Runtime,
    signals: StopSignals,
    ends: Ends,
}

impl Running {
    /// The runtime the run waits on: metrics are served on it, and what the work waits
    /// on is registered with it.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Runs `work` until the first reason to stop: its own (or its error), Ctrl-C,
    /// SIGTERM, the one target's exit, the end of the duration, the last process of
    /// `tracker`'s set leaving, or the exit of the keeper `keeper_pid` that holds the
    /// probes' links.
    pub(crate) fn until_stopped(
        self,
        work: impl Future<Output = io::Result<StopReason>>,
        tracker: Option<&mut TargetTracker>,
        keeper_pid: Option<u32>,
    ) -> io::Result<(StopReason, Stopped)> {
        let Self {
            runtime,
            signals,
            ends,
        } = self;
        let reason = runtime.block_on(stop::run_until_stopped_with(
            signals,
            ends.target,
            ends.duration,
            stop::either(
                work,
                stop::either(target::track(tracker), keeper::watch(keeper_pid)),
            ),
        ))?;
        Ok((reason, Stopped { _runtime: runtime }))
    }
}

/// A run that has stopped: the command detaches and reports.
pub(crate) struct Stopped {
    /// Kept until the report is written: what was registered with it stays valid.
    _runtime: Runtime,
}

impl Stopped {
    /// Gives SIGINT and SIGTERM their default action back. Call it once the targets
    /// are as they were: a second Ctrl-C then ends a tracer that waits on its output at
    /// once, and the keeper releases what is left.
    pub(crate) fn let_signals_kill(&self) {
        stop::restore_default_signals();
    }
}
