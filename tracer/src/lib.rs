//! tracer: an eBPF tracer and wall-clock profiler for language runtimes.
//!
//! Where each concept lives:
//! - `usdt`: USDT note parsing, argument specs, probe patterns, process discovery;
//! - `probe_plan`: which sites to attach and what the kernel does at each;
//! - `late_sites`: sites in what is mapped while tracing (a library `dlopen`ed, a
//!   process started later), held at the loader and attached before they run;
//! - `loader` (with `btf`): the only module that talks to aya and the kernel;
//! - `targets`: which processes a run traces (PIDs, `--children`, `--exe`, `--comm`,
//!   `--cgroup`), found at the start and followed by the kernel;
//! - `runtimes`: the runtimes recognised by their probes and what is measured for each;
//! - `sampling`: on-CPU sampling and off-CPU accounting attached and driven for a
//!   wall-clock profile (`profile` and `attach` alike);
//! - `histogram`, `tasks`, `wallclock`: aggregation of what the kernel collected
//!   (`wallclock` also writes pprof and speedscope files);
//! - `stacks`: naming recorded stacks as frames (user, kernel, process; the `_[k]` and
//!   ` [fp]` marks), the one home of stack naming;
//! - `symbolize`: naming addresses (blazesym), and `frame_tokens` the frames that have no
//!   address (a Python function at a line);
//! - `elf`: symbols looked up by name in mapped ELF files, and where they are loaded;
//! - `python`: CPython's frames read from the interpreter and merged into user stacks;
//! - `jit`: JIT-compiled code named without the user's help (HotSpot's perf map);
//! - `threads`: what each thread of a process is doing now, read from /proc (`tracer stacks`);
//! - `unwind`: DWARF unwinding of user stack snapshots (framehop), for binaries without
//!   frame pointers;
//! - `render`, `report`: histograms, flamegraphs and reports;
//! - `cli`, `commands`, `stop`, `privileges`: the command line and a run's lifecycle;
//! - `console`: standard output and error, which never panic nor hold up a stop.
//! - `procfs`, `oserror`: what a failure means: a target that exited or that /proc hides,
//!   the open-file limit, permissions, a memory limit (`out_of_memory` ends tracer with
//!   it when an allocation fails).

pub mod btf;
pub mod cli;
pub mod commands;
pub mod console;
pub mod elf;
pub mod frame_tokens;
#[cfg(test)]
mod golden;
pub mod histogram;
pub mod jit;
pub mod late_sites;
pub mod launch;
pub mod loader;
pub mod oserror;
pub mod out_of_memory;
pub mod privileges;
pub mod probe_plan;
pub mod processes;
pub mod procfs;
pub mod python;
pub mod render;
pub mod report;
pub mod runtimes;
pub mod sampling;
pub mod stacks;
pub mod stop;
pub mod symbolize;
pub mod targets;
pub mod tasks;
pub mod text;
pub mod threads;
pub mod unwind;
pub mod usdt;
pub mod wallclock;
