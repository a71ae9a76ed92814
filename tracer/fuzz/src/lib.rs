//! tracer's USDT parsing, compiled on its own for fuzzing: the module is pure (ELF notes,
//! segments, argument specs), so the fuzz build skips aya, tokio and the eBPF programs.
//! `test_elf` (the unit tests' tiny ELF builder) gives the `discovery` target its seed.

#[path = "../../src/usdt/mod.rs"]
pub mod usdt;

#[path = "../../src/usdt/test_elf.rs"]
pub mod test_elf;
