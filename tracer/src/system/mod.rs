//! tracer's own process and what it runs on: /proc ([`procfs`]), what an OS error means
//! ([`oserror`], [`out_of_memory`]), privileges, signals and why a run stopped ([`stop`]),
//! and the terminal ([`console`], [`text`]). Every other area may use it; it uses none.

pub mod console;
pub mod oserror;
pub mod out_of_memory;
pub mod privileges;
pub mod procfs;
pub mod stop;
pub mod text;
