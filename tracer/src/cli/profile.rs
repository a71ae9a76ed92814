//! `tracer profile`: its raw arguments and its validated config.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::parse::parse_duration;
use super::{
    ConfigError, MapSizeArgs, MetricsArgs, MetricsConfig, SamplingArgs, TargetArgs, map_sizes,
};
use crate::profile::sampling::Sampling;
use crate::{kernel::MapSizes, profile::wallclock::GroupBy, target::TargetSpec};

#[derive(Debug, Args)]
pub(crate) struct ProfileArgs {
    /// What to profile (every thread of each process); every process when absent.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Stop after this long (e.g. 10s, 500ms, 2m); otherwise at Ctrl-C or target exit.
    #[arg(long, short)]
    pub duration: Option<String>,
    /// Ignore off-CPU intervals shorter than this (e.g. 100us); the wall-clock view then
    /// leaves them out.
    #[arg(long, default_value = "0")]
    pub min_block: String,
    /// Put each thread under its own frame, below the process.
    #[arg(long)]
    pub per_thread: bool,
    /// Which processes share a tower in the flame graphs: `process` (one each, rooted
    /// at `name [pid]`) or `name` (every process running the same program, rooted at its
    /// name: eight PostgreSQL backends make one tower).
    #[arg(long, value_enum, default_value_t = GroupBy::Process, value_name = "BY")]
    pub group_by: GroupBy,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub maps: MapSizeArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Directory for the outputs [default: tracer-profile-PID, or tracer-profile].
    #[arg(long = "output", short = 'o')]
    pub output: Option<PathBuf>,
}

/// `tracer profile`, validated.
#[derive(Debug, Clone)]
pub(crate) struct ProfileConfig {
    /// What to profile ([`TargetSpec::is_everything`]: every process).
    pub targets: TargetSpec,
    pub duration: Option<Duration>,
    pub min_block: Duration,
    pub per_thread: bool,
    pub group_by: GroupBy,
    pub sampling: Sampling,
    pub map_sizes: MapSizes,
    pub output_dir: PathBuf,
    /// `--metrics ADDR`.
    pub metrics: Option<MetricsConfig>,
}

impl TryFrom<ProfileArgs> for ProfileConfig {
    type Error = ConfigError;

    fn try_from(args: ProfileArgs) -> Result<Self, ConfigError> {
        let targets = TargetSpec::try_from(&args.targets)?;
        Ok(Self {
            duration: args
                .duration
                .as_deref()
                .map(|text| parse_duration("duration", text))
                .transpose()?,
            min_block: parse_duration("min-block", &args.min_block)?,
            per_thread: args.per_thread,
            group_by: args.group_by,
            sampling: Sampling::try_from(&args.sampling)?,
            map_sizes: map_sizes(&args.maps)?,
            metrics: MetricsConfig::from_args(args.metrics),
            output_dir: args
                .output
                .unwrap_or_else(|| match targets.is_everything() {
                    false => PathBuf::from(format!("tracer-profile-{}", targets.short_name())),
                    true => PathBuf::from("tracer-profile"),
                }),
            targets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tests::profile_config;

    #[test]
    fn profile_config_validates() {
        let config = profile_config(&[]).unwrap();
        assert!(config.targets.is_everything());
        assert_eq!(config.sampling.frequency_hz, 99);
        assert_eq!(config.output_dir, PathBuf::from("tracer-profile"));
        let config = profile_config(&["-p", "7", "-F", "499", "-d", "2s", "--per-thread"]).unwrap();
        assert_eq!(config.targets.single_pid(), Some(7));
        assert_eq!(config.sampling.frequency_hz, 499);
        assert_eq!(config.duration, Some(Duration::from_secs(2)));
        assert!(config.per_thread);
        assert_eq!(config.output_dir, PathBuf::from("tracer-profile-7"));
        assert_eq!(
            profile_config(&["--frequency", "0"]).unwrap_err(),
            ConfigError::Frequency(0)
        );
        assert_eq!(
            profile_config(&["--pid", "0"]).unwrap_err(),
            ConfigError::ZeroPid
        );
        assert!(profile_config(&["--min-block", "x"]).is_err());
    }
}
