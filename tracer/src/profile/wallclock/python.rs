//! What a stack says of the state of the Python thread that has it: running, waiting for
//! the GIL, collecting garbage, blocked or runnable. A frame's kind comes from its name: a
//! Python function, part of CPython's collector, or where CPython takes or hands over the
//! GIL. A thread's Python time is the sum over its stacks, each under its state.

use super::ThreadTime;

/// What a frame says of the state of the Python thread that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PythonFrameKind {
    /// A Python function.
    Function,
    /// Part of CPython's garbage collector.
    Collector,
    /// Where CPython takes or hands over the GIL.
    Gil,
    Other,
}

impl PythonFrameKind {
    pub(super) fn of(name: &str) -> Self {
        // Python frames read `function (file.py:LINE)` (see `crate::stack::python`).
        let is_python = name.ends_with(')')
            && name
                .rsplit_once(" (")
                .is_some_and(|(_, place)| place.contains(".py") || place.starts_with('<'));
        if is_python {
            Self::Function
        } else if PYTHON_GC_FUNCTIONS.contains(&name) {
            Self::Collector
        } else if PYTHON_GIL_FUNCTIONS.contains(&name) {
            Self::Gil
        } else {
            Self::Other
        }
    }
}

/// CPython's collector functions (3.9 to 3.13), as builds with a symbol table name them.
const PYTHON_GC_FUNCTIONS: [&str; 7] = [
    "gc_collect_main",
    "gc_collect_with_callback",
    "collect_with_callback",
    "gc_collect_impl",
    "gc_collect_generations",
    "_PyGC_Collect",
    "_PyGC_CollectNoFail",
];

/// CPython's functions that wait to take the GIL or to hand it over.
const PYTHON_GIL_FUNCTIONS: [&str; 6] = [
    "take_gil",
    "drop_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "_PyThreadState_Attach",
];

/// How a Python thread spent one stack's time (see
/// [`PythonThreadTime`](super::PythonThreadTime)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PythonState {
    NotPython,
    Running,
    Gil,
    Collecting,
    Blocked,
    Runnable,
}

/// Adds `ns` in `state` to a thread's Python time (which it has from its first stack
/// with Python frames).
pub(super) fn add_python_time(time: &mut ThreadTime, state: PythonState, ns: u64) {
    if state != PythonState::NotPython {
        time.python.get_or_insert_default().add(state, ns);
    }
}
