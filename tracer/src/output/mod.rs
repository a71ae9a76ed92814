//! What a run writes: flamegraphs, histograms, timelines, exports and metrics
//! ([`render`]), each command's report ([`report`]), and the endpoint that serves metrics
//! while a run lasts ([`endpoint`]).

pub(crate) mod endpoint;
#[cfg(test)]
mod golden;
#[cfg(test)]
pub(crate) mod markdown;
pub(crate) mod render;
pub(crate) mod report;
