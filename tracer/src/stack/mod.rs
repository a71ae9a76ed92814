//! Stacks: unwinding user stack snapshots ([`unwind`]), naming addresses ([`symbolize`],
//! [`elf`], [`jit`]) and the frames that have no address ([`frame_tokens`], [`python`]),
//! the processes whose mappings name them ([`processes`]), and turning recorded stacks
//! into folded-stack frames ([`naming`]).

pub mod elf;
pub mod frame_tokens;
pub mod jit;
pub mod naming;
pub mod processes;
pub mod python;
pub mod symbolize;
pub mod unwind;
