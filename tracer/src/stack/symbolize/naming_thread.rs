//! A second blazesym symbolizer on a thread of its own, and preparing ahead what naming
//! stacks will need.
//!
//! The thread names the objects it is given. While no request waits, it parses the files
//! it was asked to prepare. Preparing starts a while after the thread does, so that the
//! launch goes first.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blazesym::symbolize::Sym;

use super::StackSymbolizer;
use super::kernel::KernelNamingThread;
use super::maps::{ProcessMaps, Target};
use super::objects::{ElfFile, forget_file, is_same_file, new_blazesym};

/// How long after [`StackSymbolizer::prepare`] its parsing starts: the launch and the
/// first reads of the rings go first.
pub(super) const PREPARE_DELAY: Duration = Duration::from_millis(300);

/// The files [`StackSymbolizer::prepare`] parses at most (each costs memory).
const PREPARED_FILES: usize = 8;

/// Whether a mapped file named `module` is a C library: glibc's (`libc.so.6`, or
/// `libc-2.31.so` before 2.34) or musl's (`libc.musl-x86_64.so.1`, `ld-musl-x86_64.so.1`).
fn is_c_library(module: &str) -> bool {
    module.starts_with("libc.so")
        || module.starts_with("libc-")
        || module.starts_with("libc.musl-")
        || module.starts_with("ld-musl-")
}

/// Objects to name: (index in the caller's list, file, file offsets).
pub(super) type NamingJob = Vec<(usize, ElfFile, Vec<u64>)>;

/// What the [`NamingThread`] is asked.
#[derive(Debug)]
pub(super) enum NamingRequest {
    /// Parse these files (an offset of each is looked up, its name not wanted), while no
    /// job waits, from [`PREPARE_DELAY`] after the thread started: no reply.
    Prepare(Vec<(ElfFile, u64)>),
    /// Name these: one reply.
    Name(NamingJob),
    /// Drop what was parsed of these files (their `/proc/self/fd` paths): no process
    /// maps them any more. No reply.
    Forget(Vec<String>),
}

/// Symbols for the offsets of an object (`None` where it has none), or why it has none.
pub(super) type ObjectSymbols = Result<Vec<Option<Sym<'static>>>, String>;

/// A blazesym symbolizer on a thread of its own, living as long as the
/// [`StackSymbolizer`] that started it: blazesym's caches are `Rc`, so a symbolizer stays
/// on the thread that made it, and keeps what it parsed for the next request.
#[derive(Debug)]
pub(super) struct NamingThread {
    pub(super) jobs: mpsc::Sender<NamingRequest>,
    pub(super) named: mpsc::Receiver<Vec<(usize, ObjectSymbols)>>,
}

impl NamingThread {
    /// `None` if no thread can be started: everything is then named on the caller's.
    pub(super) fn start() -> Option<Self> {
        let (jobs, requests) = mpsc::channel::<NamingRequest>();
        let (replies, named) = mpsc::channel();
        let prepare_from = Instant::now() + PREPARE_DELAY;
        std::thread::Builder::new()
            .name("tracer-naming".into())
            .spawn(move || {
                let mut symbolizer = new_blazesym();
                let mut to_prepare: Vec<(ElfFile, u64)> = Vec::new();
                // Ends when the StackSymbolizer (the sender) is dropped.
                while let Some(request) = next_request(
                    &requests,
                    &mut to_prepare,
                    prepare_from,
                    |(file, offset)| {
                        let _ = file.symbolize(&symbolizer, &[offset]);
                    },
                ) {
                    match request {
                        NamingRequest::Prepare(files) => {
                            // Kept in order, taken from the end.
                            to_prepare.extend(files.into_iter().rev());
                        }
                        NamingRequest::Forget(paths) => {
                            to_prepare.retain(|(file, _)| !paths.contains(&file.path));
                            for path in &paths {
                                forget_file(&mut symbolizer, path);
                            }
                        }
                        NamingRequest::Name(job) => {
                            // Naming is what the stop waits for: what was not parsed yet
                            // is parsed as it is named.
                            to_prepare.clear();
                            let reply = job
                                .into_iter()
                                .map(|(i, file, offsets)| {
                                    let symbols = file.symbolize(&symbolizer, &offsets);
                                    (i, symbols.map_err(|err| err.to_string()))
                                })
                                .collect();
                            if replies.send(reply).is_err() {
                                break;
                            }
                        }
                    }
                }
            })
            .ok()?;
        Some(Self { jobs, named })
    }
}

/// The next request on `requests`; while none comes and there is something `to_prepare`
/// (from `prepare_from` on), prepares it with `prepare`, one at a time. `None` once the
/// sender is gone.
pub(super) fn next_request<R, P>(
    requests: &mpsc::Receiver<R>,
    to_prepare: &mut Vec<P>,
    prepare_from: Instant,
    mut prepare: impl FnMut(P),
) -> Option<R> {
    loop {
        if to_prepare.is_empty() {
            return requests.recv().ok();
        }
        let wait = prepare_from.saturating_duration_since(Instant::now());
        match requests.recv_timeout(wait) {
            Ok(request) => return Some(request),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(item) = to_prepare.pop() {
                    prepare(item);
                }
            }
        }
    }
}

impl StackSymbolizer {
    /// Starts parsing, on the naming threads and [`PREPARE_DELAY`] from now, what naming
    /// stacks of the processes of `maps` will need: kallsyms, and the symbols and debug
    /// information of the files nearly every stack of theirs runs through, each process's
    /// executable and C library (libc's separate debug information alone is about
    /// 100 ms; at most [`PREPARED_FILES`] files). A stopping tracer then makes its user
    /// wait for lookups, not for parsing. Names are the same with or without it; the
    /// other files are parsed at the stop, as only some are reached (parsed, each holds
    /// megabytes).
    pub fn prepare<'m>(&mut self, maps: impl IntoIterator<Item = &'m ProcessMaps>) {
        if self.kernel_thread.is_none() && self.kallsyms_usable() {
            self.kernel_thread = KernelNamingThread::start();
        }
        let own_executable = self.own_executable();
        let mut files: Vec<((String, u64), ElfFile, u64)> = Vec::new();
        'processes: for maps in maps {
            let executable = fs::metadata(format!("/proc/{}/exe", maps.pid))
                .ok()
                .map(|m| m.ino());
            for (index, object) in maps.objects.iter().enumerate() {
                if Some(object.inode) != executable && !is_c_library(&object.module) {
                    continue;
                }
                let key = (object.dev.clone(), object.inode);
                let taken = self.on_main_symbolizer.contains(&key)
                    || self.on_naming_thread.contains(&key)
                    || files.iter().any(|(k, _, _)| *k == key);
                if taken
                    || object
                        .file
                        .as_ref()
                        .is_some_and(|f| is_same_file(f, own_executable))
                {
                    continue;
                }
                // Where its code starts: a place to look up, to have it all parsed.
                let code = maps
                    .mappings
                    .iter()
                    .find(|m| m.target == Target::Object(index))
                    .map(|m| m.offset);
                if let (Some(file), Some(offset)) = (self.elf_file(object, own_executable), code) {
                    files.push((key, file, offset));
                    if files.len() == PREPARED_FILES {
                        break 'processes;
                    }
                }
            }
        }
        if files.is_empty() {
            return;
        }
        if self.naming_thread.is_none() {
            self.naming_thread = NamingThread::start();
        }
        let Some(thread) = &self.naming_thread else {
            return;
        };
        let keys: Vec<(String, u64)> = files.iter().map(|(key, _, _)| key.clone()).collect();
        let request = files.into_iter().map(|(_, file, offset)| (file, offset));
        if thread
            .jobs
            .send(NamingRequest::Prepare(request.collect()))
            .is_ok()
        {
            // Named there from now on: where they are parsed.
            self.on_naming_thread.extend(keys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Frame;
    use super::super::test_support::symbolization_target;
    use super::*;

    #[test]
    fn prepared_objects_are_named_where_they_were_parsed_and_alike() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let ours = symbolization_target as fn(u64) -> u64 as usize as u64;
        let libc = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let stacks: Vec<Vec<u64>> = (0..64).map(|i| vec![libc + i * 4, ours + i * 2]).collect();
        let stacks: Vec<&[u64]> = stacks.iter().map(Vec::as_slice).collect();
        let named = |symbolizer: &mut StackSymbolizer| -> Vec<Vec<Frame>> {
            symbolizer
                .user_stacks(&maps, &stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect()
        };
        let mut plain = StackSymbolizer::new();
        plain.own_executable = Some(None);
        let expected = named(&mut plain);
        // Named before the preparation starts, and again once it had time to run.
        for wait in [Duration::ZERO, PREPARE_DELAY * 2] {
            let mut prepared = StackSymbolizer::new();
            prepared.own_executable = Some(None);
            prepared.prepare([&maps]);
            std::thread::sleep(wait);
            assert_eq!(named(&mut prepared), expected, "after {wait:?}");
            assert!(prepared.on_naming_thread.len() >= 2, "after {wait:?}");
            assert!(
                prepared.on_main_symbolizer.is_empty(),
                "an object prepared on the naming thread was parsed on the caller's"
            );
        }
        // Kernel addresses, where kallsyms shows them (as root).
        let kernel: Vec<u64> = fs::read_to_string("/proc/kallsyms")
            .unwrap()
            .lines()
            .filter_map(|line| u64::from_str_radix(line.split(' ').next()?, 16).ok())
            .filter(|&addr| addr != 0)
            .step_by(5000)
            .map(|addr| addr + 1)
            .collect();
        let kernel_stacks: Vec<&[u64]> = kernel.chunks(4).collect();
        let kernel_names = |symbolizer: &mut StackSymbolizer| -> Vec<Vec<Frame>> {
            symbolizer
                .kernel_stacks(&kernel_stacks)
                .into_iter()
                .map(|frames| frames.into_iter().cloned().collect())
                .collect()
        };
        let expected = kernel_names(&mut StackSymbolizer::new());
        let mut prepared = StackSymbolizer::new();
        prepared.prepare([&maps]);
        assert_eq!(prepared.kernel_thread.is_some(), !kernel.is_empty());
        std::thread::sleep(PREPARE_DELAY * 2);
        assert_eq!(kernel_names(&mut prepared), expected);
    }
}
