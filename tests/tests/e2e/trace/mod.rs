//! `tracer trace`: USDT probes and their arguments, function probes, the stacks of hits,
//! probes in what is loaded later, and notes that lie.

mod functions;
mod hit_stacks;
mod later;
mod malformed_notes;
mod usdt;
mod usdt_args;
mod usdt_nop5;
mod usdt_strings;
