//! tracer's USDT parsing, compiled on its own for fuzzing: the module is pure (ELF notes,
//! argument specs), so the fuzz build skips aya, tokio and the eBPF programs.

#[path = "../../src/usdt/mod.rs"]
pub mod usdt;
