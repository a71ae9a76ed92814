//! `attach --profile-every`: the wall-clock profile of each window written while tracing,
//! and of the last one (cut short) at the stop.

use std::path::PathBuf;

use crate::{
    cli::{AttachConfig, RollingConfig},
    kernel::Loader,
    output::render::{export::ExportInfo, rolling::write_window},
    profile::{
        sampling::{WallClockSampler, Window},
        wallclock::BuildOptions,
    },
    stack::{processes::Processes, symbolize::StackSymbolizer},
};

/// The windows of a run.
pub(super) struct Rolling {
    config: RollingConfig,
    window: Window,
    dir: PathBuf,
    name: String,
    options: BuildOptions,
    /// The wall clock's time at the monotonic clock's 0, to date the windows.
    unix_at_zero_ns: u64,
    /// The one target, when it is the only process.
    only_pid: Option<u32>,
}

impl Rolling {
    /// Windows from `started_ns` (CLOCK_MONOTONIC), when the wall clock said
    /// `start_unix_ns`, of what `name` says.
    pub(super) fn new(
        config: &AttachConfig,
        started_ns: u64,
        start_unix_ns: u64,
        name: String,
    ) -> Option<Self> {
        let rolling = config.rolling?;
        Some(Self {
            config: rolling,
            window: Window::starting_at(started_ns),
            dir: config.output_dir.clone(),
            name,
            options: BuildOptions {
                frequency_hz: config.sampling.frequency_hz,
                per_thread: config.per_thread,
                group_by: config.group_by,
            },
            unix_at_zero_ns: start_unix_ns.saturating_sub(started_ns),
            only_pid: config.targets.single_pid(),
        })
    }

    /// What the next window subtracts.
    pub(super) fn window_mut(&mut self) -> &mut Window {
        &mut self.window
    }

    /// Whether the window open has lasted its length at `now_ns`.
    pub(super) fn due(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.window.start_ns()) >= self.config.every.as_nanos() as u64
    }

    /// Writes the window that ends at `now_ns` and opens the next. A window that cannot
    /// be written is said, and the trace goes on.
    pub(super) fn write(
        &mut self,
        sampler: &mut WallClockSampler,
        loader: &Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        now_ns: u64,
    ) {
        let start_ns = self.window.start_ns();
        let written = sampler
            .window(
                &mut self.window,
                loader,
                processes,
                symbolizer,
                now_ns,
                self.options,
            )
            .and_then(|profile| {
                let info = ExportInfo {
                    name: &self.name,
                    frequency_hz: self.options.frequency_hz,
                    start_unix_ns: self.unix_at_zero_ns + start_ns,
                    duration_ns: now_ns.saturating_sub(start_ns),
                    process_labels: true,
                    only_pid: self.only_pid,
                };
                Ok(write_window(&profile, &self.dir, &info, self.config.keep)?)
            });
        match written {
            Ok(files) => log::debug!("window written: {files:?}"),
            Err(e) => crate::status!("Cannot write the profile of a window: {e:#}."),
        }
    }
}
