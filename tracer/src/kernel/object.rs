//! Loading the embedded object without aya's `EbpfLoader`, measured against it with aya
//! 0.16 (the `attach` settings, fastest of 12 runs on a busy 2-core VM): `EbpfLoader::load`
//! took 45 ms, this 17 ms. aya's load creates every map before it returns, and the
//! preallocated aggregation maps (the stack map alone is tens of megabytes) are 37 ms of
//! that (8.5 ms with every map at one entry); here they are created on a thread while the
//! USDT programs are verified and attached, so the first events do not wait for them. And
//! aya verifies a BTF tracepoint program against a fully parsed kernel BTF (tens of ms),
//! where ours take the one type id they need from a scan in `crate::kernel::btf`. So this creates
//! the maps, relocates with aya-obj, and verifies a program only when it is first attached.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    thread::JoinHandle,
};

use aya::{
    EbpfError,
    maps::{Map, MapData},
};
use aya_obj::{
    EbpfSectionKind, Object, ProgramSection,
    generated::{bpf_attach_type, bpf_insn, bpf_prog_type},
};

use super::{LoaderError, os_error, sys};

/// The object's programs, each relocated and verified when first asked for, and its maps.
pub(super) struct Programs {
    /// As parsed, globals patched; each program is relocated in a copy of it.
    object: Object,
    text_sections: HashSet<usize>,
    /// Every map created so far: its definition and (a duplicate of) its fd.
    created: Vec<(String, aya_obj::Map, OwnedFd)>,
    /// Maps still being created on another thread, and their definitions.
    pending: Option<JoinHandle<Result<Vec<CreatedMap>, LoaderError>>>,
    /// Holds that thread before it starts, while this is kept (see [`load`]'s `hold`).
    hold: Option<std::sync::mpsc::Sender<()>>,
    pending_definitions: Vec<(String, aya_obj::Map)>,
    loaded: HashMap<&'static str, OwnedFd>,
}

type CreatedMap = (String, aya_obj::Map, MapData);

/// The fd relocation gives maps not created yet.
const NOT_CREATED: i32 = -1;
/// `BPF_LD | BPF_IMM | BPF_DW`: the first half of a 64-bit immediate load.
const LOAD_IMM64: u8 = 0x18;
/// Source register value marking a 64-bit immediate load of a map's fd.
const BPF_PSEUDO_MAP_FD: u8 = 1;

/// A thread parsing an object.
pub(super) type Parsing = JoinHandle<Result<Object, aya_obj::ParseError>>;

/// Creates the maps of `object` (sizes from `max_entries`, read-only globals from what
/// `globals` returns) and returns them and the programs. The maps of the globals are
/// created last: `globals` may wait for kernel types read on another thread, and the other
/// maps are created meanwhile. Maps named in `deferred` are created on a thread of their
/// own (the kernel preallocates some whole, which takes milliseconds): they reach the
/// caller through [`Programs::finish_maps`], and a program that needs one waits for them.
/// With `hold`, that thread starts only then: on two cores it would take a core from the
/// programs verified and attached first (the USDT probes, whose first event a launch
/// waits for).
pub(super) fn load(
    mut object: Object,
    globals: impl FnOnce() -> Result<Vec<(&'static str, Vec<u8>)>, LoaderError>,
    max_entries: &HashMap<&'static str, u32>,
    deferred: &[&str],
    hold: bool,
) -> Result<(HashMap<String, Map>, Programs), LoaderError> {
    let error = |e: EbpfError| LoaderError::Load(e);
    let sized = |(name, mut map): (String, aya_obj::Map)| {
        if let Some(&entries) = max_entries.get(name.as_str()) {
            map.set_max_entries(entries);
        }
        (name, map)
    };
    // The globals' maps stay in the object, to be patched once their values are known.
    let (mut now, mut later) = (Vec::new(), Vec::new());
    for named in object
        .maps
        .extract_if(|_, map| !holds_globals(map))
        .map(sized)
    {
        if deferred.contains(&named.0.as_str()) {
            later.push(named);
        } else {
            now.push(named);
        }
    }
    let pending_definitions = later.clone();
    let (hold, held) = match hold {
        true => {
            let (hold, held) = std::sync::mpsc::channel::<()>();
            (Some(hold), Some(held))
        }
        false => (None, None),
    };
    let pending = (!later.is_empty()).then(|| {
        std::thread::spawn(move || {
            // Released when the sender is dropped.
            if let Some(held) = held {
                let _ = held.recv();
            }
            later
                .into_iter()
                .map(|(name, map)| create_map(name, map))
                .collect()
        })
    });
    let text_sections = object.functions.keys().map(|&(s, _)| s).collect();
    let mut programs = Programs {
        object,
        text_sections,
        created: Vec::new(),
        pending,
        hold,
        pending_definitions,
        loaded: HashMap::new(),
    };
    let create_all = || -> Result<Vec<(String, Map)>, LoaderError> {
        let created = now
            .drain(..)
            .map(|(name, map)| create_map(name, map))
            .collect::<Result<Vec<_>, _>>()?;
        let mut maps = programs.record(created)?;
        let globals = globals()?;
        programs
            .object
            .patch_map_data(
                globals
                    .iter()
                    .map(|(name, bytes)| (*name, (bytes.as_slice(), true)))
                    .collect(),
            )
            .map_err(|e| error(e.into()))?;
        let created = programs
            .object
            .maps
            .drain()
            .map(sized)
            .map(|(name, map)| create_map(name, map))
            .collect::<Result<Vec<_>, _>>()?;
        maps.extend(programs.record(created)?);
        Ok(maps)
    };
    let maps = match create_all() {
        Ok(maps) => maps,
        Err(e) => {
            // Let the thread end before its maps are dropped.
            let _ = programs.finish_maps();
            return Err(e);
        }
    };
    Ok((maps.into_iter().collect(), programs))
}

/// Whether `map` holds global variables (`.rodata`, `.data`, `.bss`), whose initial values
/// it is created with.
fn holds_globals(map: &aya_obj::Map) -> bool {
    matches!(
        map.section_kind(),
        EbpfSectionKind::Data | EbpfSectionKind::Rodata | EbpfSectionKind::Bss
    )
}

/// Creates map `name` as `map` defines it, with its initial data for globals.
fn create_map(
    name: String,
    map: aya_obj::Map,
) -> Result<(String, aya_obj::Map, MapData), LoaderError> {
    let definition = map.clone();
    let data = MapData::create(map, &name, None).map_err(|e| match e {
        aya::maps::MapError::CreateError { io_error, .. }
            if crate::system::oserror::cause(&io_error).is_some() =>
        {
            os_error(format!("creating eBPF map {name}"), io_error)
        }
        e => LoaderError::Load(e.into()),
    })?;
    let kind = definition.section_kind();
    if holds_globals(&definition) && !definition.data().is_empty() {
        sys::fill_data_map(
            data.fd().as_fd(),
            definition.data(),
            kind == EbpfSectionKind::Rodata,
        )
        .map_err(|e| os_error(format!("global data of {name}"), e))?;
    }
    Ok((name, definition, data))
}

impl Programs {
    /// Keeps what relocation needs of `maps` and returns them as aya maps.
    fn record(&mut self, maps: Vec<CreatedMap>) -> Result<Vec<(String, Map)>, LoaderError> {
        maps.into_iter()
            .map(|(name, definition, data)| {
                let fd = data
                    .fd()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| os_error(format!("duplicating the fd of map {name}"), e))?;
                self.created.push((name.clone(), definition, fd));
                let map = Map::from_map_data(data).map_err(|e| LoaderError::Load(e.into()))?;
                Ok((name, map))
            })
            .collect()
    }

    /// Waits for the maps still being created and returns them (once).
    pub(super) fn finish_maps(&mut self) -> Result<Vec<(String, Map)>, LoaderError> {
        self.pending_definitions.clear();
        self.hold.take();
        match self.pending.take() {
            Some(pending) => {
                let created = pending
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                self.record(created)
            }
            None => Ok(Vec::new()),
        }
    }

    /// The instructions of program `name`, relocated against the maps created so far;
    /// `None` when it uses one still being created.
    fn relocated(&self, name: &'static str) -> Result<Option<Vec<bpf_insn>>, LoaderError> {
        let error = |e: EbpfError| LoaderError::Load(e);
        let program = self
            .object
            .programs
            .get(name)
            .ok_or(LoaderError::Missing(name))?;
        let key = program.function_key();
        // Only this program and the shared functions: the others may use maps not created yet.
        let others: HashSet<(usize, u64)> = self
            .object
            .programs
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, p)| p.function_key())
            .collect();
        let mut object = self.object.clone();
        object.programs.retain(|n, _| n == name);
        object.functions.retain(|k, _| !others.contains(k));
        // Maps not created yet are there with an fd no map has, so that a use of one is
        // seen below (leaving them out would not fail: aya-obj would pick another map of
        // the same ELF section).
        let maps = self
            .created
            .iter()
            .map(|(name, def, fd)| (name.as_str(), fd.as_raw_fd(), def))
            .chain(
                self.pending_definitions
                    .iter()
                    .map(|(name, def)| (name.as_str(), NOT_CREATED, def)),
            );
        object
            .relocate_maps(maps, &self.text_sections)
            .map_err(|e| error(e.into()))?;
        object
            .relocate_calls(&self.text_sections)
            .map_err(|e| error(e.into()))?;
        let instructions = object
            .functions
            .remove(&key)
            .ok_or(LoaderError::Missing(name))?
            .instructions;
        let uses_pending_map = instructions.iter().any(|insn| {
            insn.code == LOAD_IMM64
                && insn.src_reg() == BPF_PSEUDO_MAP_FD
                && insn.imm == NOT_CREATED
        });
        Ok((!uses_pending_map).then_some(instructions))
    }

    /// Every program loaded so far.
    pub(super) fn loaded(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.loaded.values().map(|fd| fd.as_fd())
    }

    /// Every program loaded, by name.
    pub(super) fn loaded_by_name(&self) -> impl Iterator<Item = (&'static str, BorrowedFd<'_>)> {
        self.loaded.iter().map(|(name, fd)| (*name, fd.as_fd()))
    }

    /// Program `name` once [`Programs::load`] loaded it.
    pub(super) fn fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, LoaderError> {
        self.loaded
            .get(name)
            .map(|fd| fd.as_fd())
            .ok_or(LoaderError::Missing(name))
    }

    /// Relocates program `name` and has the kernel verify it, unless that was done
    /// already. BTF tracepoint programs are verified against the kernel type
    /// `attach_btf_id` (the tracepoint's `btf_trace_*` typedef), iterators against
    /// theirs (`bpf_iter_task`); the others ignore it.
    /// Returns the maps it had to wait for (see [`Programs::finish_maps`]).
    pub(super) fn load(
        &mut self,
        name: &'static str,
        attach_btf_id: Option<u32>,
    ) -> Result<Vec<(String, Map)>, LoaderError> {
        let mut waited_for = Vec::new();
        if !self.loaded.contains_key(name) {
            let instructions = if let Some(instructions) = self.relocated(name)? {
                instructions
            } else {
                waited_for = self.finish_maps()?;
                self.relocated(name)?.ok_or(LoaderError::Missing(name))?
            };
            let program = &self.object.programs[name];
            let kind = match program.section {
                // USDT sites are attached in groups, by uprobe_multi links.
                ProgramSection::UProbe { .. } => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE,
                    expected_attach_type: Some(bpf_attach_type::BPF_TRACE_UPROBE_MULTI),
                    attach_btf_id: None,
                },
                ProgramSection::TracePoint => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_TRACEPOINT,
                    expected_attach_type: None,
                    attach_btf_id: None,
                },
                ProgramSection::PerfEvent => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_PERF_EVENT,
                    expected_attach_type: None,
                    attach_btf_id: None,
                },
                ProgramSection::BtfTracePoint => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_TRACING,
                    expected_attach_type: Some(bpf_attach_type::BPF_TRACE_RAW_TP),
                    attach_btf_id: Some(attach_btf_id.ok_or_else(|| {
                        LoaderError::KernelFeature(format!(
                            "program {name} needs the kernel's BTF type id of its tracepoint"
                        ))
                    })?),
                },
                // Task iterators are verified against the kernel function
                // `bpf_iter_task` (`attach_btf_id`).
                ProgramSection::Iter { sleepable: false } => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_TRACING,
                    expected_attach_type: Some(bpf_attach_type::BPF_TRACE_ITER),
                    attach_btf_id: Some(attach_btf_id.ok_or_else(|| {
                        LoaderError::KernelFeature(format!(
                            "program {name} needs the kernel's BTF type id of bpf_iter_task"
                        ))
                    })?),
                },
                _ => return Err(LoaderError::Missing(name)),
            };
            let fd = sys::load_program(&kind, name, &instructions, &program.license)
                .map_err(|e| os_error(format!("loading eBPF program {name}"), e))?;
            self.loaded.insert(name, fd);
        }
        Ok(waited_for)
    }
}
