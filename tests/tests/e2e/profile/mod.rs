//! `tracer profile`: wall-clock profiles of every thread, Python's frames, JIT code, and
//! DWARF unwinding.

mod jit;
mod python;
mod unwind;
mod wallclock;
