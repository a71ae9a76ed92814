//! What a run writes: flamegraphs, histograms, timelines and exports ([`render`]), and
//! each command's report ([`report`]).

#[cfg(test)]
mod golden;
pub mod render;
pub mod report;
