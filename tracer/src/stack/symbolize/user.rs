//! Naming the addresses of user stacks.
//!
//! Each distinct address of a process is named once and kept. The addresses are named
//! in one batch per mapped object. An address no object names is looked up among frame
//! tokens, then JIT code, and is otherwise named by where it lies.

use std::collections::HashMap;
use std::fs;
use std::rc::Rc;

use blazesym::Pid;
use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Sym};

use crate::system::procfs::parse_maps_line;

use super::StackSymbolizer;
use super::frames::{Frame, JIT_MODULE, VDSO, fallback_frame, frames_of, lookups};
use super::maps::{ProcessMaps, Target};

impl StackSymbolizer {
    /// Names a user stack of the process `maps` was captured from.
    ///
    /// `addrs` is innermost first, as the kernel records stacks: `addrs[0]` is the
    /// instruction pointer, the rest are return addresses, which are looked up one byte
    /// earlier so they land in the call instruction (and its inlining context) rather
    /// than whatever follows it. A zero address ends the stack (stack maps are
    /// zero-padded). Inlined functions come as extra frames before the function they
    /// were inlined into, so the result stays innermost first.
    pub fn user_frames(&mut self, maps: &ProcessMaps, addrs: &[u64]) -> Vec<Frame> {
        let stacks = self.user_stacks(maps, &[addrs]);
        stacks.into_iter().flatten().cloned().collect()
    }

    /// Names many user stacks of the process `maps` was captured from, each as
    /// [`StackSymbolizer::user_frames`] would. Profiles are many stacks over few distinct
    /// addresses: each address is named once, all in one batch per mapped object, as
    /// every call into blazesym has a fixed cost that stack-by-stack calls pay over and
    /// over; and the frames are lent, not copied per stack.
    pub fn user_stacks(&mut self, maps: &ProcessMaps, stacks: &[&[u64]]) -> Vec<Vec<&Frame>> {
        let named = self.user_addresses(maps, stacks);
        stacks
            .iter()
            .map(|addrs| {
                lookups(addrs)
                    .flat_map(|(lookup, _)| named.frames(lookup))
                    .collect()
            })
            .collect()
    }

    /// Names every address of `stacks` (as [`StackSymbolizer::user_stacks`] does) and
    /// lends the frames of each, for callers that make something of each distinct
    /// address once rather than of each frame of each stack.
    pub fn user_addresses(&mut self, maps: &ProcessMaps, stacks: &[&[u64]]) -> UserAddresses<'_> {
        let pid = maps.pid();
        let mut missing: Vec<(u64, u64)> = stacks
            .iter()
            .flat_map(|addrs| lookups(addrs))
            .filter(|(lookup, _)| !self.user_cache.contains_key(&(pid, *lookup)))
            .collect();
        missing.sort_unstable();
        missing.dedup_by_key(|(lookup, _)| *lookup);
        if !missing.is_empty() {
            let named = self.resolve_user(maps, &missing);
            for ((lookup, _), frames) in missing.into_iter().zip(named) {
                self.user_cache.insert((pid, lookup), frames);
            }
        }
        UserAddresses {
            pid,
            cache: &self.user_cache,
        }
    }

    /// Names each (lookup address, original address) pair: every frame it stands for,
    /// inlined ones first.
    fn resolve_user(&mut self, maps: &ProcessMaps, addrs: &[(u64, u64)]) -> Vec<Rc<[Frame]>> {
        let mut slots: Vec<Option<Rc<[Frame]>>> = vec![None; addrs.len()];
        let mut by_object: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        let mut vdso: Vec<(usize, u64)> = Vec::new();
        for (slot, &(lookup, _)) in addrs.iter().enumerate() {
            match maps
                .find(lookup)
                .map(|m| (m.target, lookup - m.start + m.offset))
            {
                Some((Target::Object(index), file_offset)) => {
                    by_object
                        .entry(index)
                        .or_default()
                        .push((slot, file_offset));
                }
                Some((Target::Vdso, offset)) => vdso.push((slot, offset)),
                Some((Target::Anonymous, _)) | None => {}
            }
        }

        // Each file's offsets not named yet, all named at once: a file mapped under two
        // paths (a hard link, a bind mount) is one file to name.
        let mut work: Vec<(usize, Vec<u64>)> = Vec::new();
        let mut work_of_file: HashMap<(&str, u64), usize> = HashMap::new();
        for (&index, wanted) in &by_object {
            let object = &maps.objects[index];
            let at = *work_of_file
                .entry((object.dev.as_str(), object.inode))
                .or_insert_with(|| {
                    work.push((index, Vec::new()));
                    work.len() - 1
                });
            work[at]
                .1
                .extend(wanted.iter().map(|&(_, offset)| offset).filter(|&offset| {
                    !self
                        .object_cache
                        .contains_key(&(object.dev.clone(), object.inode, offset))
                }));
        }
        for (_, offsets) in &mut work {
            offsets.sort_unstable();
            offsets.dedup();
        }
        work.retain(|(_, offsets)| !offsets.is_empty());
        let symbols = self.symbolize_objects(maps, &work);
        for ((index, offsets), symbols) in work.into_iter().zip(symbols) {
            let object = &maps.objects[index];
            for (offset, symbol) in offsets.into_iter().zip(symbols) {
                let frames = symbol.map(|sym| frames_of(&sym, Some(&object.module)).into());
                self.object_cache
                    .insert((object.dev.clone(), object.inode, offset), frames);
            }
        }
        for (index, wanted) in by_object {
            let object = &maps.objects[index];
            for (slot, offset) in wanted {
                if let Some(frames) =
                    &self.object_cache[&(object.dev.clone(), object.inode, offset)]
                {
                    slots[slot] = Some(Rc::clone(frames));
                }
            }
        }
        if !vdso.is_empty() {
            for ((slot, _), sym) in vdso.iter().zip(self.symbolize_vdso(&vdso)) {
                if let Some(sym) = sym {
                    slots[*slot] = Some(frames_of(&sym, Some(VDSO)).into());
                }
            }
        }

        slots
            .into_iter()
            .zip(addrs)
            .map(|(named, &(lookup, addr))| {
                named.unwrap_or_else(|| {
                    if let Some((name, module)) = crate::stack::frame_tokens::frame(lookup) {
                        return Rc::from([Frame {
                            name,
                            module: Some(module.to_string()),
                            inlined: false,
                            offset: None,
                        }]);
                    }
                    let frame = match self.jit_name(maps, lookup) {
                        Some(name) => Frame {
                            name,
                            module: Some(JIT_MODULE.to_string()),
                            inlined: false,
                            offset: None,
                        },
                        None => fallback_frame(maps.locate(addr)),
                    };
                    Rc::from([frame])
                })
            })
            .collect()
    }

    /// Symbols for offsets into the target's vDSO, looked up in ours: the kernel maps
    /// the same image into every process, so only the base differs.
    fn symbolize_vdso(&mut self, wanted: &[(usize, u64)]) -> Vec<Option<Sym<'static>>> {
        let own = *self.own_vdso.get_or_insert_with(|| {
            let maps = fs::read_to_string("/proc/self/maps").ok()?;
            maps.lines()
                .filter_map(parse_maps_line)
                .find(|e| e.path.as_deref() == Some(VDSO))
                .map(|e| (e.start, e.end))
        });
        let Some((start, end)) = own else {
            return vec![None; wanted.len()];
        };
        let addrs: Vec<u64> = wanted.iter().map(|&(_, offset)| start + offset).collect();
        if addrs.iter().any(|&a| a >= end) {
            return vec![None; wanted.len()];
        }
        let mut process = Process::new(Pid::Slf);
        process.map_files = false;
        process.perf_map = false;
        match self
            .symbolizer
            .symbolize(&Source::Process(process), Input::AbsAddr(&addrs))
        {
            Ok(symbols) => symbols
                .into_iter()
                .map(|s| s.into_sym().map(Sym::into_owned))
                .collect(),
            Err(err) => {
                log::debug!("cannot symbolize vDSO addresses: {err}");
                vec![None; wanted.len()]
            }
        }
    }
}

/// The frames of the addresses of one process that [`StackSymbolizer::user_addresses`]
/// named.
pub struct UserAddresses<'c> {
    pid: u32,
    cache: &'c foldhash::HashMap<(u32, u64), Rc<[Frame]>>,
}

impl<'c> UserAddresses<'c> {
    /// The frames of lookup address `lookup` (see
    /// [`lookup_addresses`](super::lookup_addresses)), inlined ones first; each address has
    /// at least one.
    pub fn frames(&self, lookup: u64) -> &'c [Frame] {
        &self.cache[&(self.pid, lookup)]
    }
}

#[cfg(test)]
mod tests {
    use super::super::UNKNOWN;
    use super::super::test_support::{MAPS, calls_inlined_helper, symbolization_target};
    use super::*;

    #[test]
    fn unreadable_objects_fall_back_to_module_offset() {
        // None of these files exist, so nothing can be opened or named.
        let maps = ProcessMaps::from_maps_text(std::process::id(), MAPS);
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(
            &maps,
            &[
                0x7f1000000100,
                0x55d0c8a02011,
                0x7f0000000042,
                0x10,
                0,
                0x55d0c8a02011,
            ],
        );
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        // Offsets are of the address itself, not of the adjusted lookup address. Anonymous
        // memory (JIT code no source names) says so; an address mapped nowhere does not.
        assert_eq!(
            names,
            [
                "libfoo.so.1+0x28100",
                "app+0x2011",
                "[unknown] (anonymous memory)",
                UNKNOWN
            ]
        );
        assert_eq!(frames[0].module.as_deref(), Some("libfoo.so.1"));
        assert_eq!(frames[2].module, None);
    }

    #[test]
    fn names_a_function_of_this_binary() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let target = symbolization_target as fn(u64) -> u64 as usize as u64;
        assert!(symbolization_target(3) != 0);
        let mut symbolizer = StackSymbolizer::new();
        // As the leaf, and as a return address inside the function (looked up at -1).
        let frames = symbolizer.user_frames(&maps, &[target + 1, target + 2]);
        let outer: Vec<&Frame> = frames.iter().filter(|f| !f.inlined).collect();
        assert_eq!(outer.len(), 2, "{frames:?}");
        for frame in outer {
            assert!(frame.name.ends_with("symbolization_target"), "{frame:?}");
            assert!(
                !frame.name.contains("17h"),
                "demangled without hash: {frame:?}"
            );
            let exe = std::env::current_exe().unwrap();
            assert_eq!(
                frame.module.as_deref(),
                exe.file_name().and_then(|n| n.to_str()),
                "{frame:?}"
            );
        }
    }

    #[test]
    // Inlining is only recorded in DWARF: the release profile keeps line tables for this
    // crate (see the workspace Cargo.toml).
    fn expands_inlined_functions() {
        let stack = calls_inlined_helper();
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let mut symbolizer = StackSymbolizer::new();
        symbolizer.own_executable = Some(None);
        let frames = symbolizer.user_frames(&maps, &stack);
        let names: Vec<(&str, bool)> = frames
            .iter()
            .map(|f| (f.name.rsplit("::").next().unwrap(), f.inlined))
            .collect();
        let helper = names
            .iter()
            .position(|&n| n == ("inlined_helper", true))
            .unwrap_or_else(|| panic!("no inlined frame in {frames:#?}"));
        assert_eq!(names[helper + 1], ("calls_inlined_helper", false));
        assert_eq!(names[helper - 1], ("return_addresses", false));
    }

    #[test]
    fn names_this_processs_libc() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let getpid = libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64;
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &[getpid]);
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert!(frames[0].name.contains("getpid"), "{frames:?}");
        assert!(
            frames[0]
                .module
                .as_deref()
                .is_some_and(|m| m.starts_with("libc")),
            "{frames:?}"
        );
    }

    #[test]
    fn names_vdso_functions() {
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let Some(vdso) = maps.mappings.iter().find(|m| m.target == Target::Vdso) else {
            eprintln!("skipped: no vDSO mapped");
            return;
        };
        // Probe the whole image; some of it is code of the exported clock functions.
        let addrs: Vec<u64> = (vdso.start..vdso.end).step_by(16).collect();
        let mut symbolizer = StackSymbolizer::new();
        let frames = symbolizer.user_frames(&maps, &addrs);
        assert_eq!(frames.len(), addrs.len());
        assert!(
            frames.iter().all(|f| f.module.as_deref() == Some(VDSO)),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|f| f.name.contains("gettime")),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|f| f.name.starts_with("[vdso]+0x")),
            "{frames:?}"
        );
    }

    #[test]
    fn survives_the_process_exiting() {
        // A short-lived child: capture its maps, let it exit, then symbolize.
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        // Give exec time to replace the forked image.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut maps = ProcessMaps::capture(child.id()).unwrap();
        let libc_text = fs::read_to_string(format!("/proc/{}/maps", child.id()))
            .unwrap()
            .lines()
            .filter_map(parse_maps_line)
            .find(|e| e.is_executable() && e.path.as_deref().is_some_and(|p| p.contains("libc")))
            .map(|e| e.start);
        child.wait().unwrap();
        assert!(maps.refresh().is_err(), "the process is gone");
        let Some(libc_text) = libc_text else {
            eprintln!("skipped: /bin/sleep does not map libc dynamically");
            return;
        };
        let mut symbolizer = StackSymbolizer::new();
        // Somewhere well inside libc's text: named, or at least libc+offset.
        let frames = symbolizer.user_frames(&maps, &[libc_text + 0x1000]);
        assert!(
            frames[0]
                .module
                .as_deref()
                .is_some_and(|m| m.starts_with("libc")),
            "{frames:?}"
        );
        assert!(
            !frames[0].name.contains('+'),
            "named after exit: {frames:?}"
        );
    }
}
