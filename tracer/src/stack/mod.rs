//! Stacks: unwinding user stack snapshots ([`unwind`]), naming addresses ([`symbolize`],
//! [`elf`], [`jit`]) and the frames that have no address ([`frame_tokens`], [`python`]),
//! the processes whose mappings name them ([`processes`]), and turning recorded stacks
//! into folded-stack frames ([`naming`]).

pub(crate) mod elf;
pub(crate) mod frame_tokens;
pub(crate) mod jit;
pub(crate) mod naming;
pub(crate) mod processes;
pub(crate) mod python;
pub(crate) mod symbolize;
pub(crate) mod unwind;
