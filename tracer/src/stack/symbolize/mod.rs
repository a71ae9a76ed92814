//! Naming the addresses of captured stacks.
//!
//! The tracer stops when its target exits and only then symbolizes, so nothing here may
//! need the process to be alive at that point. [`ProcessMaps`] snapshots the executable
//! mappings while the process lives and opens every mapped file right away, preferably
//! through `/proc/PID/map_files/` (the exact file even across mount namespaces or after
//! it was deleted or replaced on disk). The open descriptors keep the files readable
//! after the process is gone; blazesym reads them through `/proc/self/fd/N`, with each
//! address given as a file offset, so no process state is consulted.
//!
//! A file many processes map (an executable, libc, ld.so) is opened once, not once per
//! process: snapshots share one descriptor of each file, by device and inode (see
//! `OpenFiles`). A service that starts thousands of short-lived processes costs the
//! tracer a descriptor per distinct file, and the files it may keep open are bounded by
//! its open-file limit.
//!
//! JIT-compiled code is named from the runtime's perf map (`/tmp/perf-PID.map`), also
//! opened early; once its process exited, the map is read and its descriptor closed.
//! Kernel addresses are named from `/proc/kallsyms`.
//!
//! A frame that cannot be named is shown as `module+0xOFFSET` (the offset in the mapped
//! file), or `[unknown]` outside any known mapping; frames are never dropped.
//!
//! The parts: the frames and the addresses they are named at (`frames`), the snapshots
//! (`maps`) and the files they keep open (`open_files`), user stacks (`user`), the
//! mapped objects' symbols (`objects`), the naming thread and preparing ahead
//! (`naming_thread`), JIT code (`jit_names`) and kernel stacks (`kernel`).

mod frames;
mod jit_names;
mod kernel;
mod maps;
mod naming_thread;
mod objects;
mod open_files;
#[cfg(test)]
mod test_support;
mod user;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::rc::Rc;
use std::sync::Arc;

use blazesym::symbolize::Symbolizer;

use crate::stack::jit::jitdump::JitSymbols;

use jit_names::CachedPerfMap;
use kernel::KernelNamingThread;
use naming_thread::NamingThread;
use objects::{ObjectOffset, new_blazesym};

pub(crate) use frames::{Frame, UNKNOWN, demangle, lookup_addresses};
pub(crate) use maps::ProcessMaps;

/// Names user and kernel stack addresses. Caches parsed symbol files, so keep one for
/// the whole report. Not `Send`: blazesym's caches use `Rc`.
#[derive(Debug)]
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    perf_maps: HashMap<u32, CachedPerfMap>,
    /// Each process's jitdump as last parsed, and the length it had then.
    jitdumps: HashMap<u32, (u64, JitSymbols)>,
    /// Objects (device, inode) whose symbols could not be read: warned about once, not
    /// retried. Not keyed by our fd path: fd numbers are reused.
    unreadable: HashSet<(String, u64)>,
    /// The device and inode of the file this process runs, once looked up (`Some(None)`:
    /// none, so every file is named with its debug information).
    own_executable: Option<Option<(u64, u64)>>,
    /// Our own vDSO, which is the target's too (one image per kernel).
    own_vdso: Option<Option<(u64, u64)>>,
    /// Whether /proc/kallsyms shows real addresses; checked once.
    kallsyms_usable: Option<bool>,
    kernel_failed: bool,
    /// Frames per (pid, lookup address) and per kernel address, named once; looked up
    /// for every frame of every stack, so with a fast hash.
    user_cache: foldhash::HashMap<(u32, u64), Rc<[Frame]>>,
    kernel_cache: foldhash::HashMap<u64, Vec<Frame>>,
    /// What each file offset of each object (device, inode) is named (`None`: no symbol
    /// there), so that a library many processes map (libc) is named once for all.
    /// Shared with `user_cache`: the same frames for every process, not a copy each.
    object_cache: foldhash::HashMap<ObjectOffset, Option<Rc<[Frame]>>>,
    /// The one descriptor of each object (the snapshots'), whose `/proc/self/fd` path
    /// blazesym is given for every process that maps it: it parses each file once. Held
    /// here too, so the path stays valid for as long as blazesym may read it.
    shared_files: HashMap<(String, u64), Arc<File>>,
    /// A second symbolizer, for big profiles of several objects, and the objects
    /// (device, inode) each symbolizer has named: an object stays with the one that
    /// parsed it.
    naming_thread: Option<NamingThread>,
    on_naming_thread: HashSet<(String, u64)>,
    on_main_symbolizer: HashSet<(String, u64)>,
    /// A symbolizer of kallsyms on a thread of its own, once [`StackSymbolizer::prepare`]
    /// started it: it keeps kallsyms parsed for every request.
    kernel_thread: Option<KernelNamingThread>,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    /// Drops what was cached for processes `tgids` alone (their JIT symbols, their
    /// frames by address), and what was parsed of files that no snapshot maps any more.
    /// Call it after the processes' snapshots are dropped.
    pub fn forget_processes(&mut self, tgids: &HashSet<u32>) {
        self.perf_maps.retain(|pid, _| !tgids.contains(pid));
        self.jitdumps.retain(|pid, _| !tgids.contains(pid));
        self.user_cache.retain(|(pid, _), _| !tgids.contains(pid));
        self.forget_unmapped_files();
    }

    /// A symbolizer that demangles Rust and C++ names and expands inlined functions
    /// where debug information has them.
    pub fn new() -> Self {
        Self {
            symbolizer: new_blazesym(),
            perf_maps: HashMap::new(),
            jitdumps: HashMap::new(),
            unreadable: HashSet::new(),
            own_executable: None,
            own_vdso: None,
            kallsyms_usable: None,
            kernel_failed: false,
            user_cache: foldhash::HashMap::default(),
            kernel_cache: foldhash::HashMap::default(),
            object_cache: foldhash::HashMap::default(),
            shared_files: HashMap::new(),
            naming_thread: None,
            on_naming_thread: HashSet::new(),
            on_main_symbolizer: HashSet::new(),
            kernel_thread: None,
        }
    }
}
