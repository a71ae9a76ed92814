//! Probes: USDT notes and function probes found in files ([`usdt`]), the runtimes they
//! belong to ([`runtimes`]), which sites to attach and what the kernel does at each
//! ([`plan`]), and sites mapped while tracing ([`late_sites`]).

pub mod late_sites;
pub mod plan;
pub mod runtimes;
pub mod usdt;
