//! Naming file offsets of the mapped objects with blazesym.
//!
//! Blazesym reads each object through the one descriptor the snapshots hold of it. The
//! objects of a big batch are shared out between this thread's symbolizer and the naming
//! thread's. An object stays with the symbolizer it was first given to, so its file is
//! parsed once.

use std::collections::HashSet;
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use blazesym::symbolize::evict::{self, Evict};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Sym, Symbolizer};

use super::StackSymbolizer;
use super::maps::{MappedObject, ProcessMaps};
use super::naming_thread::{NamingRequest, NamingThread, ObjectSymbols};

/// An offset into the file of a mapped object: (device, inode, file offset).
pub(super) type ObjectOffset = (String, u64, u64);

/// Names to look up above which the objects are shared out between two threads.
const SHARED_NAMING_OFFSETS: usize = 4096;

/// A blazesym symbolizer that demangles Rust and C++ names and expands inlined functions
/// where debug information has them.
pub(super) fn new_blazesym() -> Symbolizer {
    Symbolizer::builder()
        // Names are demangled in `frames_of`, only those that are mangled.
        .enable_demangling(false)
        .enable_code_info(true)
        .enable_inlined_fns(true)
        // Our paths are /proc/self/fd/N, and a number can be reused for another file
        // after a snapshot is dropped: let blazesym notice the change.
        .enable_auto_reload(true)
        .build()
}

/// A mapped object's file as blazesym is to read it.
#[derive(Clone, Debug)]
pub(super) struct ElfFile {
    /// `/proc/self/fd/N` of our descriptor of it.
    pub(super) path: String,
    /// Read its debug information, not only its symbol table.
    debug_syms: bool,
}

impl ElfFile {
    /// Symbols for file offsets `offsets`; `None` where it has none.
    pub(super) fn symbolize(
        &self,
        symbolizer: &Symbolizer,
        offsets: &[u64],
    ) -> Result<Vec<Option<Sym<'static>>>, blazesym::Error> {
        let mut elf = Elf::new(&self.path);
        elf.debug_syms = self.debug_syms;
        let symbols = symbolizer.symbolize(&Source::Elf(elf), Input::FileOffset(offsets))?;
        Ok(symbols
            .into_iter()
            .map(|s| s.into_sym().map(Sym::into_owned))
            .collect())
    }
}

/// The path blazesym reads `file` by: our descriptor of it.
fn fd_path(file: &File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// Drops what `symbolizer` parsed of the file at `path`, and its descriptor of it.
pub(super) fn forget_file(symbolizer: &mut Symbolizer, path: &str) {
    // Not an error when nothing of it was parsed.
    let _ = symbolizer.evict(&Evict::Elf(evict::Elf::new(path)));
}

/// Whether `file` is the file of device and inode `id`.
pub(super) fn is_same_file(file: &File, id: Option<(u64, u64)>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    id.is_some() && file.metadata().ok().map(|m| (m.dev(), m.ino())) == id
}

impl StackSymbolizer {
    /// The device and inode of the file this process runs.
    pub(super) fn own_executable(&mut self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt as _;
        *self.own_executable.get_or_insert_with(|| {
            fs::metadata("/proc/self/exe")
                .ok()
                .map(|m| (m.dev(), m.ino()))
        })
    }

    /// Symbols for the file offsets of each mapped object of `work` (its index in
    /// `maps.objects`, its offsets); `None` where it has none. With many offsets in more
    /// than one object, the objects are shared out between this symbolizer and the one
    /// of the [`NamingThread`] (by offsets, the most first), and an object stays with the
    /// one it was given to: each file is parsed once, and a stopping tracer makes its
    /// user wait for naming.
    pub(super) fn symbolize_objects(
        &mut self,
        maps: &ProcessMaps,
        work: &[(usize, Vec<u64>)],
    ) -> Vec<Vec<Option<Sym<'static>>>> {
        let own_executable = self.own_executable();
        let files: Vec<Option<ElfFile>> = work
            .iter()
            .map(|(index, _)| self.elf_file(&maps.objects[*index], own_executable))
            .collect();
        // An object named on the naming thread before is named there again (its file is
        // parsed there); new ones go to the side with fewer offsets, most first, once
        // there are enough to share.
        let key = |i: usize| {
            let object = &maps.objects[work[i].0];
            (object.dev.clone(), object.inode)
        };
        let mut on_thread: Vec<bool> = (0..work.len())
            .map(|i| self.on_naming_thread.contains(&key(i)))
            .collect();
        let total: usize = work.iter().map(|(_, offsets)| offsets.len()).sum();
        if total >= SHARED_NAMING_OFFSETS {
            let load = |on: bool, sides: &[bool]| -> usize {
                (0..work.len())
                    .filter(|&i| sides[i] == on)
                    .map(|i| work[i].1.len())
                    .sum()
            };
            let mut by_size: Vec<usize> = (0..work.len())
                .filter(|&i| !on_thread[i] && !self.on_main_symbolizer.contains(&key(i)))
                .collect();
            by_size.sort_by_key(|&i| std::cmp::Reverse(work[i].1.len()));
            let (mut here, mut there) = (load(false, &on_thread), load(true, &on_thread));
            for i in by_size {
                if there < here {
                    on_thread[i] = true;
                    there += work[i].1.len();
                } else {
                    here += work[i].1.len();
                }
            }
        }
        if on_thread.contains(&true) && self.naming_thread.is_none() {
            self.naming_thread = NamingThread::start();
        }
        let thread_jobs: Vec<(usize, ElfFile, Vec<u64>)> = (0..work.len())
            .filter(|&i| on_thread[i])
            .filter_map(|i| Some((i, files[i].clone()?, work[i].1.clone())))
            .collect();
        let sent = match (&self.naming_thread, thread_jobs.is_empty()) {
            (Some(thread), false) => thread.jobs.send(NamingRequest::Name(thread_jobs)).is_ok(),
            _ => false,
        };
        let mut named: Vec<Option<ObjectSymbols>> = vec![None; work.len()];
        for i in 0..work.len() {
            if !on_thread[i] || !sent {
                named[i] = files[i].as_ref().map(|file| {
                    file.symbolize(&self.symbolizer, &work[i].1)
                        .map_err(|err| err.to_string())
                });
                self.on_main_symbolizer.insert(key(i));
            }
        }
        if sent && let Some(thread) = &self.naming_thread {
            for (i, symbols) in thread.named.recv().unwrap_or_default() {
                named[i] = Some(symbols);
            }
            for i in (0..work.len()).filter(|&i| on_thread[i]) {
                self.on_naming_thread.insert(key(i));
            }
        }
        named
            .into_iter()
            .enumerate()
            .map(|(i, symbols)| match symbols {
                Some(Ok(symbols)) => symbols,
                Some(Err(err)) => {
                    // Not an ELF file (e.g. a JIT's memfd) or unreadable: fall back, once.
                    let object = &maps.objects[work[i].0];
                    let path = crate::system::text::escape_text(&object.path);
                    log::warn!("cannot read symbols of {path}: {err}");
                    self.unreadable.insert(key(i));
                    vec![None; work[i].1.len()]
                }
                // Unreadable, or lost with the naming thread: unnamed.
                None => vec![None; work[i].1.len()],
            })
            .collect()
    }

    /// Lets go of the files no snapshot maps any more: what either symbolizer parsed of
    /// them, their names by offset, and our descriptor. A process that maps one later
    /// has it opened and parsed again.
    pub(super) fn forget_unmapped_files(&mut self) {
        let unmapped: HashSet<(String, u64)> = self
            .shared_files
            .iter()
            .filter(|(_, file)| Arc::strong_count(file) == 1)
            .map(|(key, _)| key.clone())
            .collect();
        if unmapped.is_empty() {
            return;
        }
        let mut on_thread = Vec::new();
        let mut closing = Vec::new();
        for key in &unmapped {
            let Some(file) = self.shared_files.remove(key) else {
                continue;
            };
            let path = fd_path(&file);
            if self.on_naming_thread.remove(key) {
                on_thread.push(path);
            } else {
                forget_file(&mut self.symbolizer, &path);
            }
            self.on_main_symbolizer.remove(key);
            closing.push(file);
        }
        if let Some(thread) = &self.naming_thread
            && !on_thread.is_empty()
        {
            let _ = thread.jobs.send(NamingRequest::Forget(on_thread));
        }
        // Closed only now: a descriptor number reused by a file opened later is asked
        // of the naming thread after it forgot the old file.
        drop(closing);
        self.object_cache
            .retain(|(dev, inode, _), _| !unmapped.contains(&(dev.clone(), *inode)));
    }

    /// `object`'s file as blazesym is to read it, through our one descriptor of it;
    /// `None` if it cannot be read.
    pub(super) fn elf_file(
        &mut self,
        object: &MappedObject,
        own_executable: Option<(u64, u64)>,
    ) -> Option<ElfFile> {
        let key = (object.dev.clone(), object.inode);
        if self.unreadable.contains(&key) {
            return None;
        }
        if !self.shared_files.contains_key(&key)
            && let Some(file) = &object.file
        {
            self.shared_files.insert(key.clone(), Arc::clone(file));
        }
        let file = self.shared_files.get(&key)?;
        Some(ElfFile {
            path: fd_path(file),
            // The tracer's own frames (a system-wide profile has them) are named from its
            // symbol table alone: its debug information is tens of megabytes to parse
            // while the user waits for the report.
            debug_syms: !is_same_file(file, own_executable),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Frame;
    use super::super::test_support::{calls_inlined_helper, symbolization_target};
    use super::*;

    /// The tracer's own frames are named from its symbol table: no inlined frames.
    #[test]
    fn names_its_own_frames_from_the_symbol_table() {
        let stack = calls_inlined_helper();
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let frames = StackSymbolizer::new().user_frames(&maps, &stack);
        assert!(frames.iter().all(|f| !f.inlined), "{frames:#?}");
        assert!(
            frames
                .iter()
                .any(|f| f.name.ends_with("calls_inlined_helper")),
            "{frames:#?}"
        );
    }

    /// Once no snapshot maps a file, what was parsed of it and our descriptor of it are
    /// let go; a later snapshot has it named again, the same.
    #[test]
    fn lets_go_of_a_file_once_no_snapshot_maps_it() {
        // A program no other test looks at, so that no other snapshot holds its file.
        let mut child = std::process::Command::new("tail")
            .args(["-f", "/dev/null"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let in_tail = |maps: &ProcessMaps| -> ((String, u64), u64) {
            let (index, object) = maps
                .objects
                .iter()
                .enumerate()
                .find(|(_, o)| o.module == "tail")
                .unwrap();
            let mapping = maps
                .mappings
                .iter()
                .find(|m| m.target == super::super::maps::Target::Object(index))
                .unwrap();
            ((object.dev.clone(), object.inode), mapping.start + 0x40)
        };
        let mut symbolizer = StackSymbolizer::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let maps = loop {
            let maps = ProcessMaps::capture(pid).unwrap();
            if maps.objects.iter().any(|o| o.module == "tail") {
                break maps;
            }
            assert!(std::time::Instant::now() < deadline, "tail never ran");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let (key, address) = in_tail(&maps);
        let first = symbolizer.user_frames(&maps, &[address]);
        let cached = |s: &StackSymbolizer| {
            s.object_cache
                .keys()
                .any(|(d, i, _)| (d, i) == (&key.0, &key.1))
        };
        assert!(symbolizer.shared_files.contains_key(&key) && cached(&symbolizer));
        let tgids = HashSet::from([pid]);
        symbolizer.forget_processes(&tgids);
        assert!(
            symbolizer.shared_files.contains_key(&key) && cached(&symbolizer),
            "let go of a file a snapshot still maps"
        );
        drop(maps);
        symbolizer.forget_processes(&tgids);
        assert!(
            !symbolizer.shared_files.contains_key(&key),
            "the file is still open"
        );
        assert!(!cached(&symbolizer), "its names are still kept");
        let maps = ProcessMaps::capture(pid).unwrap();
        assert_eq!(symbolizer.user_frames(&maps, &[address]), first);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Many addresses in two objects are shared out between two symbolizers: each named
    /// as it is in batches too small to share, and each object, once given to one, stays
    /// with it (its file parsed once), also in a later batch of new addresses.
    #[test]
    fn names_many_addresses_in_two_objects_as_few_at_a_time() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let ours = symbolization_target as fn(u64) -> u64 as usize as u64;
        let libc = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let batch = |first: u64| -> Vec<Vec<u64>> {
            (first..first + SHARED_NAMING_OFFSETS as u64 / 2 + 100)
                .flat_map(|i| [vec![ours + i * 4], vec![libc + i * 4, ours + i * 2]])
                .collect()
        };
        let mut symbolizer = StackSymbolizer::new();
        symbolizer.own_executable = Some(None);
        let mut reference = StackSymbolizer::new();
        reference.own_executable = Some(None);
        for first in [0, SHARED_NAMING_OFFSETS as u64] {
            let stacks = batch(first);
            let stacks: Vec<&[u64]> = stacks.iter().map(Vec::as_slice).collect();
            let shared: Vec<Vec<Frame>> = symbolizer
                .user_stacks(&maps, &stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect();
            let mut few_at_a_time: Vec<Vec<Frame>> = Vec::new();
            for batch in stacks.chunks(SHARED_NAMING_OFFSETS / 8) {
                few_at_a_time.extend(
                    reference
                        .user_stacks(&maps, batch)
                        .into_iter()
                        .map(|frames| frames.into_iter().cloned().collect()),
                );
            }
            assert_eq!(shared, few_at_a_time, "batch from {first}");
            assert!(
                shared
                    .iter()
                    .flatten()
                    .any(|f| f.module.as_deref().is_some_and(|m| m.starts_with("libc")))
            );
            assert!(
                !symbolizer.on_naming_thread.is_empty(),
                "nothing shared out"
            );
            assert!(
                symbolizer
                    .on_naming_thread
                    .is_disjoint(&symbolizer.on_main_symbolizer),
                "an object parsed by both symbolizers"
            );
        }
        assert!(reference.on_naming_thread.is_empty());
    }
}
