//! Task probes for [tokio] runtimes, through tokio's task hooks: one line of setup and every
//! task of the runtime fires the crate's task probes with its tokio task id.
//!
//! ```ignore
//! let runtime = probes::tokio::instrument(&mut tokio::runtime::Builder::new_multi_thread())
//!     .enable_all()
//!     .build()?;
//! ```
//!
//! # Building
//!
//! The task hooks (`on_task_spawn`, `on_before_task_poll`, `on_after_task_poll`,
//! `on_task_terminate`) are unstable tokio APIs (tokio 1.54): they exist only when the
//! *final* build sets `--cfg tokio_unstable`. So this module needs both the `tokio` feature
//! and that cfg:
//!
//! ```text
//! # Cargo.toml:  probes = { version = "...", features = ["tokio"] }
//! RUSTFLAGS="--cfg tokio_unstable" cargo build --release
//! ```
//!
//! (or `rustflags = ["--cfg", "tokio_unstable"]` under `[build]` in `.cargo/config.toml`).
//! Without the cfg the module is absent; the rest of the crate is unaffected.
//!
//! # Events
//!
//! | tokio hook | probe | arguments |
//! |---|---|---|
//! | `on_task_spawn` | `tracer:rt__new__task`, `tracer:rt__task__name` | parent, child; task, spawn location (`FILE:LINE:COLUMN`) |
//! | `on_before_task_poll` | `tracer:rt__run__task` | task |
//! | `on_after_task_poll` | `tracer:rt__pause__task` | task |
//! | `on_task_terminate` | `tracer:rt__finish__task` | task |
//!
//! A task is its tokio [`Id`](tokio::task::Id) as a number (what it displays as). The parent
//! is the task that called `spawn`, or 0 when the caller is not a task (`block_on`, a plain
//! thread). Every poll is one run: `rt__run__task` just before it, `rt__pause__task` just
//! after it, on the worker thread that polls; between two polls a task is parked (waiting
//! to be woken, or woken and waiting for a worker). A task can move between worker threads
//! from one poll to the next, so follow tasks by id, not by thread (as
//! `probes/scripts/task_run_park.bt` does).
//!
//! Order: tokio runs the termination hook inside the poll that completes the task, so a
//! task's last events are `rt__run__task`, `rt__finish__task`, `rt__pause__task` — the order
//! Julia's runtime fires them in too. A task dropped without completing (aborted while idle,
//! or at runtime shutdown) gets `rt__finish__task` outside any poll. `spawn_blocking` tasks
//! fire only `rt__finish__task` (tokio calls no spawn or poll hook for them). Tasks of a
//! `LocalSet` are not covered by the termination hook. `rt__start__task` is not fired:
//! tokio has no hook for a task's first poll (it is the first `rt__run__task` of its id).
//!
//! # Cost
//!
//! tokio calls the hooks on every spawn and poll. With no tracer attached, each costs the
//! call and the probe's semaphore test; the spawn hook also looks up the current task id.
//!
//! # Replacing hooks
//!
//! tokio keeps one callback per hook: [`instrument`] replaces any set before it, and a hook
//! set after it replaces ours. A runtime with hooks of its own can call [`task_spawned`],
//! [`before_task_poll`], [`after_task_poll`] and [`task_terminated`] from them instead.

use core::hash::{Hash, Hasher};

use tokio::runtime::{Builder, TaskMeta};

/// Sets the four task hooks of `builder` to fire the crate's task probes; returns it for
/// chaining.
pub fn instrument(builder: &mut Builder) -> &mut Builder {
    builder
        .on_task_spawn(task_spawned)
        .on_before_task_poll(before_task_poll)
        .on_after_task_poll(after_task_poll)
        .on_task_terminate(task_terminated)
}

/// The `on_task_spawn` hook: `rt__new__task(parent, task)`, and `rt__task__name(task,
/// FILE:LINE:COLUMN)` with where it was spawned.
pub fn task_spawned(meta: &TaskMeta<'_>) {
    let parent = tokio::task::try_id().map_or(0, task_id);
    let task = task_id(meta.id());
    crate::rt_new_task(parent, task);
    let at = meta.spawned_at();
    crate::rt_task_name_with(task, || {
        let name = std::format!("{}:{}:{}", at.file(), at.line(), at.column());
        std::ffi::CString::new(name).unwrap_or_default()
    });
}

/// The `on_before_task_poll` hook: `rt__run__task(task)`.
pub fn before_task_poll(meta: &TaskMeta<'_>) {
    crate::rt_run_task(task_id(meta.id()));
}

/// The `on_after_task_poll` hook: `rt__pause__task(task)`.
pub fn after_task_poll(meta: &TaskMeta<'_>) {
    crate::rt_pause_task(task_id(meta.id()));
}

/// The `on_task_terminate` hook: `rt__finish__task(task)`.
pub fn task_terminated(meta: &TaskMeta<'_>) {
    crate::rt_finish_task(task_id(meta.id()));
}

/// A tokio task id as the number it displays as.
///
/// `Id` is opaque: it only offers `Display` (which would need formatting on every poll) and
/// `Hash`, which hashes the number itself (`write_u64`). A hasher that keeps what it is given
/// reads it back for the price of a move.
#[inline(always)]
pub fn task_id(id: tokio::task::Id) -> u64 {
    /// Keeps the last `u64` written; other writes (not expected) fold in byte by byte.
    struct Keep(u64);

    impl Hasher for Keep {
        fn finish(&self) -> u64 {
            self.0
        }

        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(b);
            }
        }

        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }

    let mut keep = Keep(0);
    id.hash(&mut keep);
    keep.finish()
}
