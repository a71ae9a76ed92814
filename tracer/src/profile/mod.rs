//! Profiles: on-CPU sampling and off-CPU accounting ([`sampling`]), with stack
//! snapshots unwound in user space ([`dwarf_snapshots`]), and the aggregates
//! built from what the kernel collected: wall-clock profiles ([`wallclock`]), task
//! timelines ([`tasks`]), latency histograms ([`histogram`]), and what each thread of a
//! process is doing now ([`threads`], `tracer stacks`), and the profiles of rolling windows
//! ([`windows`]).

pub(crate) mod dwarf_snapshots;
pub(crate) mod histogram;
pub(crate) mod retire;
pub(crate) mod sampling;
pub(crate) mod tasks;
pub(crate) mod threads;
pub(crate) mod wallclock;
pub(crate) mod windows;
