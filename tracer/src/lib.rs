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

pub mod cli;
pub mod commands;
pub mod kernel;
pub mod output;
pub mod probe;
pub mod profile;
pub mod session;
pub mod stack;
pub mod system;
pub mod target;
