//! Profiles: on-CPU sampling and off-CPU accounting ([`sampling`]), with stack
//! snapshots unwound in user space ([`dwarf_snapshots`]), and the aggregates
//! built from what the kernel collected: wall-clock profiles ([`wallclock`]), task
//! timelines ([`tasks`]), latency histograms ([`histogram`]), and what each thread of a
//! process is doing now ([`threads`], `tracer stacks`), and the profiles of rolling windows
//! ([`windows`]).

pub mod dwarf_snapshots;
pub mod histogram;
pub mod retire;
pub mod sampling;
pub mod tasks;
pub mod threads;
pub mod wallclock;
pub mod windows;
