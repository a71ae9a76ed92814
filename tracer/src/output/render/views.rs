//! The files of a wall-clock profile: three flame graph views (wall-clock, on-CPU,
//! off-CPU; folded stacks and SVG each), pprof and speedscope.

use std::path::{Path, PathBuf};

use super::{
    ViewFiles,
    flamegraph::{Palette, SvgOptions},
};
use crate::output::render::export::{self, ExportInfo};
use crate::profile::wallclock::{OFF_CPU_FRAME, RUNNABLE_FRAME, WallClockProfile};
use crate::stack::naming::StackProfile;

/// Where each output went; `None` for a file that could not be written.
#[derive(Debug, Default)]
pub(crate) struct ProfileFiles {
    pub wall: Option<ViewFiles>,
    pub oncpu: Option<ViewFiles>,
    pub offcpu: Option<ViewFiles>,
    pub pprof: Option<PathBuf>,
    pub speedscope: Option<PathBuf>,
}

/// Writes every output file it can, and returns which were written and the first error.
pub(crate) fn write_profile_files(
    profile: &WallClockProfile,
    dir: &Path,
    what: &str,
    info: &ExportInfo<'_>,
) -> (ProfileFiles, Option<anyhow::Error>) {
    let mut first_error: Option<anyhow::Error> = None;
    let keep =
        |result: std::io::Result<()>, path: PathBuf, first_error: &mut Option<_>| match result {
            Ok(()) => Some(path),
            Err(e) => {
                first_error.get_or_insert(
                    anyhow::Error::new(e).context(format!("writing {}", path.display())),
                );
                None
            }
        };
    let seconds = |ns: u64| ns as f64 / 1e9;
    let traced = format!("{:.1} s profiled", seconds(info.duration_ns));
    let oncpu_text = format!(
        "{} on-CPU samples at {} Hz ({:.3} s)",
        profile.oncpu_samples,
        info.frequency_hz,
        seconds(profile.oncpu_ns)
    );
    let offcpu_text = format!(
        "{} off-CPU intervals ({:.3} s)",
        profile.offcpu_intervals,
        seconds(profile.offcpu_ns)
    );
    let view = |name: &str, stacks: &StackProfile, title: String, subtitle: String, palette| {
        let options = SvgOptions {
            title: &title,
            subtitle: Some(&subtitle),
            count_name: "us",
            palette,
        };
        super::write_view(stacks, dir, name, &options)
    };
    let specs = [
        (
            "wallclock",
            &profile.wall,
            format!("Wall-clock time of {what}"),
            format!(
                "{traced}; {oncpu_text} + {offcpu_text}; blocked time ends in {OFF_CPU_FRAME}, \
                 preempted time in {RUNNABLE_FRAME}"
            ),
            Palette::OnCpu,
        ),
        (
            "oncpu",
            &profile.oncpu,
            format!("On-CPU time of {what}"),
            format!("{traced}; {oncpu_text}"),
            Palette::OnCpu,
        ),
        (
            "offcpu",
            &profile.offcpu,
            format!("Off-CPU time of {what}"),
            format!("{traced}; {offcpu_text}"),
            Palette::OffCpu,
        ),
    ];
    let pprof = dir.join("wallclock.pb.gz");
    let speedscope = dir.join("wallclock.speedscope.json");
    // The views, pprof and speedscope files on threads of their own: rendering is most of
    // the time from Ctrl-C to exit.
    let (views, pprof_written, speedscope_written) = std::thread::scope(|scope| {
        let views: Vec<_> = specs
            .into_iter()
            .map(|(name, stacks, title, subtitle, palette)| {
                scope.spawn(move || view(name, stacks, title, subtitle, palette))
            })
            .collect();
        let pprof_written = scope.spawn(|| export::write_pprof(&profile.wall, info, &pprof));
        let speedscope_written = export::write_speedscope(
            &[
                ("wall-clock", &profile.wall),
                ("on-CPU", &profile.oncpu),
                ("off-CPU", &profile.offcpu),
            ],
            info,
            &speedscope,
        );
        let views: Vec<_> = views
            .into_iter()
            .map(|v| v.join().expect("rendering a view panicked"))
            .collect();
        let pprof_written = pprof_written.join().expect("writing pprof panicked");
        (views, pprof_written, speedscope_written)
    });
    let views: Vec<Option<ViewFiles>> = views
        .into_iter()
        .map(|written| match written {
            Ok(files) => Some(files),
            Err(e) => {
                first_error.get_or_insert(e.into());
                None
            }
        })
        .collect();
    let pprof = keep(pprof_written, pprof, &mut first_error);
    let speedscope = keep(speedscope_written, speedscope, &mut first_error);
    let [wall, oncpu, offcpu] = <[Option<ViewFiles>; 3]>::try_from(views).expect("three views");
    (
        ProfileFiles {
            wall,
            oncpu,
            offcpu,
            pprof,
            speedscope,
        },
        first_error,
    )
}
