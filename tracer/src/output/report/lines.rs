//! The lines and limits that the text of `tracer attach` and the summary of `tracer
//! profile` share.

use std::path::Path;

/// How many threads the text report lists.
pub(crate) const THREADS_SHOWN: usize = 10;

/// What the report says of programs the kernel skipped: nothing when none was.
pub(crate) fn program_misses_line(misses: &[(&'static str, u64)]) -> String {
    if misses.is_empty() {
        return String::new();
    }
    let each: Vec<String> = misses
        .iter()
        .map(|(program, runs)| format!("{program} {runs} times"))
        .collect();
    format!(
        "Not seen: the kernel skipped programs already running on their CPU: {}.\n",
        each.join(", ")
    )
}

/// A written file's path, or what the summary says of one that could not be written.
pub(crate) fn shown(path: Option<&Path>) -> String {
    match path {
        Some(path) => path.display().to_string(),
        None => "(not written, see the error below)".into(),
    }
}
