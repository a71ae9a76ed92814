//! Probes: USDT notes and function probes found in files ([`usdt`]), the runtimes they
//! belong to ([`runtimes`]), which sites to attach and what the kernel does at each
//! ([`plan`]), and sites mapped while tracing ([`late_sites`]).

pub(crate) mod late_sites;
pub(crate) mod plan;
pub(crate) mod runtimes;
pub(crate) mod usdt;
