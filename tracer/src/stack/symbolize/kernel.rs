//! Naming the addresses of kernel stacks from `/proc/kallsyms`.
//!
//! Kernel addresses can be named on another thread while user stacks are named. A
//! symbolizer on a thread of its own can keep kallsyms parsed for every request.

use std::fs::File;
use std::io::{self, BufRead};
use std::sync::{LazyLock, mpsc};
use std::time::Instant;

use blazesym::MaybeDefault;
use blazesym::symbolize::source::{Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::StackSymbolizer;
use super::frames::{Frame, frames_of, lookups, until_zero};
use super::naming_thread::{PREPARE_DELAY, next_request};

impl StackSymbolizer {
    /// Names a kernel stack (innermost first; see [`StackSymbolizer::user_frames`] for
    /// the conventions) from /proc/kallsyms. Without real addresses there (not root, or
    /// `kptr_restrict`), every frame is [`UNKNOWN`](super::UNKNOWN).
    pub fn kernel_frames(&mut self, addrs: &[u64]) -> Vec<Frame> {
        let stacks = self.kernel_stacks(&[addrs]);
        stacks.into_iter().flatten().cloned().collect()
    }

    /// Names many kernel stacks, each as [`StackSymbolizer::kernel_frames`] would, each
    /// distinct address once and all in one batch (see [`StackSymbolizer::user_stacks`]).
    pub fn kernel_stacks(&mut self, stacks: &[&[u64]]) -> Vec<Vec<&Frame>> {
        let missing = self.unnamed_kernel_addresses(stacks.iter().copied());
        if !missing.is_empty() {
            // Either symbolizer keeps kallsyms parsed for the next call.
            let named = match &self.kernel_thread {
                Some(_) => self.name_kernel_apart(missing).wait(),
                None => missing.name_with(&self.symbolizer),
            };
            self.add_kernel_names(named);
        }
        static UNKNOWN_FRAME: LazyLock<Frame> = LazyLock::new(Frame::unknown);
        let unknown = |addrs: &&[u64]| vec![&*UNKNOWN_FRAME; until_zero(addrs).len()];
        if self.kallsyms_usable != Some(true) || self.kernel_failed {
            return stacks.iter().map(unknown).collect();
        }
        let cache = &self.kernel_cache;
        stacks
            .iter()
            .map(|addrs| {
                lookups(addrs)
                    .flat_map(|(lookup, _)| &cache[&lookup])
                    .collect()
            })
            .collect()
    }

    /// The distinct addresses of `stacks` not named yet, to name with
    /// [`KernelAddresses::name`], on another thread if wanted, and to hand back to
    /// [`StackSymbolizer::add_kernel_names`]. Empty when kernel frames cannot be named
    /// (no addresses in /proc/kallsyms, or naming failed before).
    pub fn unnamed_kernel_addresses<'s>(
        &mut self,
        stacks: impl IntoIterator<Item = &'s [u64]>,
    ) -> KernelAddresses {
        if !self.kallsyms_usable() || self.kernel_failed {
            return KernelAddresses(Vec::new());
        }
        let mut missing: Vec<u64> = stacks
            .into_iter()
            .flat_map(lookups)
            .map(|(lookup, _)| lookup)
            .filter(|lookup| !self.kernel_cache.contains_key(lookup))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        KernelAddresses(missing)
    }

    /// Whether /proc/kallsyms shows real addresses (warned about once if not).
    pub(super) fn kallsyms_usable(&mut self) -> bool {
        *self.kallsyms_usable.get_or_insert_with(|| {
            let usable = kallsyms_has_addresses();
            if !usable {
                log::warn!("/proc/kallsyms hides kernel addresses; kernel frames stay unnamed");
            }
            usable
        })
    }

    /// Names `addresses` on another thread (the kernel naming thread once
    /// [`StackSymbolizer::prepare`] started it, one of their own otherwise) while the caller
    /// goes on; what [`PendingKernelNames::wait`] returns goes to
    /// [`StackSymbolizer::add_kernel_names`].
    pub fn name_kernel_apart(&mut self, addresses: KernelAddresses) -> PendingKernelNames {
        let (reply, named) = mpsc::channel();
        let sent = match &self.kernel_thread {
            Some(thread) => thread.jobs.send((addresses, reply)).map_err(|e| e.0),
            None => Err((addresses, reply)),
        };
        if let Err((addresses, reply)) = sent {
            self.kernel_thread = None;
            std::thread::spawn(move || {
                let _ = reply.send(addresses.name());
            });
        }
        PendingKernelNames(named)
    }

    /// Keeps the names [`KernelAddresses::name`] gave; after a failure, kernel frames
    /// stay unnamed.
    pub fn add_kernel_names(&mut self, named: KernelNames) {
        match named.0 {
            Ok(named) => self.kernel_cache.extend(named),
            Err(err) => {
                log::warn!("cannot symbolize kernel stacks: {err}");
                self.kernel_failed = true;
            }
        }
    }
}

/// A blazesym symbolizer for kernel addresses (kallsyms names functions).
fn kernel_blazesym() -> Symbolizer {
    Symbolizer::builder().enable_demangling(false).build()
}

/// Kernel addresses to name, and where to send their names.
type KernelJob = (KernelAddresses, mpsc::Sender<KernelNames>);

/// A symbolizer of kallsyms on a thread of its own, which parses kallsyms
/// [`PREPARE_DELAY`] after it starts unless a request comes first, and keeps it parsed.
#[derive(Debug)]
pub(super) struct KernelNamingThread {
    jobs: mpsc::Sender<KernelJob>,
}

impl KernelNamingThread {
    pub(super) fn start() -> Option<Self> {
        let (jobs, requests) = mpsc::channel::<KernelJob>();
        let prepare_from = Instant::now() + PREPARE_DELAY;
        std::thread::Builder::new()
            .name("tracer-kernel-naming".into())
            .spawn(move || {
                let symbolizer = kernel_blazesym();
                // Any address has kallsyms parsed; its name is not wanted.
                let mut to_prepare = vec![KernelAddresses(vec![u64::MAX])];
                while let Some((addresses, reply)) =
                    next_request(&requests, &mut to_prepare, prepare_from, |addresses| {
                        let _ = addresses.name_with(&symbolizer);
                    })
                {
                    to_prepare.clear();
                    let _ = reply.send(addresses.name_with(&symbolizer));
                }
            })
            .ok()?;
        Some(Self { jobs })
    }
}

/// Kernel names being found on another thread (see [`StackSymbolizer::name_kernel_apart`]).
pub struct PendingKernelNames(mpsc::Receiver<KernelNames>);

impl PendingKernelNames {
    pub fn wait(self) -> KernelNames {
        self.0
            .recv()
            .unwrap_or_else(|_| KernelNames(Err("the kernel naming thread ended".to_string())))
    }
}

/// Kernel addresses to name (see [`StackSymbolizer::unnamed_kernel_addresses`]).
#[derive(Debug, Default)]
pub struct KernelAddresses(Vec<u64>);

/// What [`KernelAddresses::name`] found.
#[derive(Debug)]
pub struct KernelNames(Result<Vec<(u64, Vec<Frame>)>, String>);

impl KernelAddresses {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names the addresses from /proc/kallsyms with a symbolizer of its own, so that it
    /// can run on another thread while user stacks are named (a [`StackSymbolizer`] is
    /// not `Send`).
    pub fn name(self) -> KernelNames {
        self.name_with(&kernel_blazesym())
    }

    fn name_with(self, symbolizer: &Symbolizer) -> KernelNames {
        if self.0.is_empty() {
            return KernelNames(Ok(Vec::new()));
        }
        // vmlinux images are rarely installed and slow to parse; kallsyms names
        // functions.
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        let named = symbolizer
            .symbolize(&source, Input::AbsAddr(&self.0))
            .map(|symbols| {
                self.0
                    .iter()
                    .zip(symbols)
                    .map(|(&addr, symbolized)| {
                        let frames = match symbolized {
                            Symbolized::Sym(sym) => frames_of(&sym, None),
                            Symbolized::Unknown(_) => vec![Frame::unknown()],
                        };
                        (addr, frames)
                    })
                    .collect()
            })
            .map_err(|err| err.to_string());
        KernelNames(named)
    }
}

/// True when /proc/kallsyms lists real (non-zero) addresses.
fn kallsyms_has_addresses() -> bool {
    // Only the head: the kernel takes ~0.1 s to print the whole file, and blazesym reads
    // it again anyway to name the addresses.
    let Ok(file) = File::open("/proc/kallsyms") else {
        return false;
    };
    io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .take(100)
        .any(|line| {
            line.split_whitespace()
                .next()
                .and_then(|addr| u64::from_str_radix(addr, 16).ok())
                .is_some_and(|a| a != 0)
        })
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn kernel_frames() {
        let mut symbolizer = StackSymbolizer::new();
        if !kallsyms_has_addresses() {
            eprintln!("skipped: /proc/kallsyms hides addresses (not root)");
            assert_eq!(
                symbolizer.kernel_frames(&[0xffffffff81000000]),
                [Frame::unknown()]
            );
            return;
        }
        let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap();
        let (addr, name) = kallsyms
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                (kind.eq_ignore_ascii_case("t") && name == "schedule").then_some((addr, name))
            })
            .expect("schedule in kallsyms");
        let frames = symbolizer.kernel_frames(&[addr + 1, addr + 2, 0, 5]);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[0].name, name);
        assert_eq!(frames[1].name, name);
        assert_eq!(symbolizer.kernel_frames(&[1]), [Frame::unknown()]);
    }
}
