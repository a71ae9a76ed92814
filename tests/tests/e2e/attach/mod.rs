//! `tracer attach`: GCs and tasks of runtimes (our demo, real JVMs, Python, Julia's
//! probes, tokio), services of many processes, the timeline, and the always-on agent.

mod always_on;
mod gc;
mod julia;
mod runtimes;
mod services;
mod tasks;
mod timeline;
mod tokio;
