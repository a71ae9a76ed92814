//! tracer: an eBPF tracer and wall-clock profiler for language runtimes.
//!
//! The areas, each a directory, in the order their arrows point (an area uses only those
//! listed before it; `tests/architecture.rs` checks it):
//! - `system`: tracer's own process and OS: /proc, OS errors, privileges, signals and
//!   stops, the terminal, running out of memory;
//! - `kernel`: the loader, the only area that talks to aya and the kernel (BPF objects,
//!   maps, links held by the keeper, BTF);
//! - `target`: which processes a run traces (PIDs, `--children`, `--exe`, `--comm`,
//!   `--cgroup`, a launched command), found at the start and followed by the kernel;
//! - `stack`: unwinding, symbolizing (ELF, JIT code, Python frames) and naming stacks;
//! - `probe`: USDT notes and function probes, the runtimes they belong to, the plan of
//!   what to attach, and sites mapped while tracing;
//! - `profile`: sampling and the aggregates read back (wall-clock profiles, tasks,
//!   histograms, thread states);
//! - `output`: rendering (flamegraphs, histograms, timelines, pprof) and reports;
//! - `session`: the life of one run of `attach`, `trace` or `profile`, its steps in the
//!   order they must take (start, load, attach, go, stop);
//! - `cli` and `commands` at the top: the command line and each command's run.

//!
//! Nothing outside the crate reaches into the areas: the binary calls [`main`], and the
//! render benchmark (`bench-render`) takes the few items [`for_bench`] names.
#![warn(unreachable_pub)]

mod cli;
mod commands;
mod kernel;
mod output;
mod probe;
mod profile;
mod session;
mod stack;
mod system;
mod target;

pub use commands::entry::main;
pub use system::out_of_memory::ExitOnOutOfMemory;

/// What `bench-render` (`cargo xtask bench`) measures outside a run: building a
/// wall-clock profile from raw aggregates, naming its stacks and rendering them.
pub mod for_bench {
    pub use crate::output::render::flamegraph::{
        FoldedStacks, Palette, SvgOptions, write_flamegraph_svg,
    };
    pub use crate::output::render::write_folded_view;
    pub use crate::profile::wallclock::{BuildOptions, GroupBy, RawProfile, build_profile};
    pub use crate::stack::naming::StackSource;
    pub use crate::stack::processes::Processes;
    pub use crate::stack::symbolize::StackSymbolizer;
}
