//! tracer's own process and what it runs on: /proc ([`procfs`]), what an OS error means
//! ([`oserror`], [`out_of_memory`]), privileges, signals and why a run stopped ([`stop`]),
//! and the terminal ([`console`], [`text`]). Every other area may use it; it uses none.

pub(crate) mod console;
pub(crate) mod oserror;
pub(crate) mod out_of_memory;
pub(crate) mod privileges;
pub(crate) mod procfs;
pub(crate) mod stop;
pub(crate) mod text;
