//! Loading the embedded object without aya's `EbpfLoader`: `EbpfLoader::new` always
//! parses the kernel's BTF (megabytes, tens of milliseconds) and `load` verifies every
//! program, used or not. Ours need neither BTF nor CO-RE relocations (the two kernel facts
//! they depend on, task_struct offsets and the sched_switch type id, come from a scan in
//! `crate::btf`), so this creates the maps, relocates, and verifies a program only when it
//! is first attached.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
};

use aya::{
    EbpfError,
    maps::{Map, MapData},
};
use aya_obj::{
    EbpfSectionKind, Object, ProgramSection,
    generated::{bpf_attach_type, bpf_prog_type},
};

use super::{LoaderError, sys};

/// The relocated object, its programs loaded on demand.
pub(super) struct Programs {
    object: Object,
    loaded: HashMap<&'static str, OwnedFd>,
}

/// Creates every map of `data` (sizes from `max_entries`, read-only globals from
/// `globals`) and relocates the programs to them.
pub(super) fn load(
    data: &[u8],
    globals: &[(&'static str, Vec<u8>)],
    max_entries: &HashMap<&'static str, u32>,
) -> Result<(HashMap<String, Map>, Programs), LoaderError> {
    let error = |e: EbpfError| LoaderError::Load(e);
    let mut object = Object::parse(data).map_err(|e| error(e.into()))?;
    object
        .patch_map_data(
            globals
                .iter()
                .map(|(name, bytes)| (*name, (bytes.as_slice(), true)))
                .collect(),
        )
        .map_err(|e| error(e.into()))?;
    let mut definitions: Vec<(String, aya_obj::Map)> = object.maps.drain().collect();
    for (name, map) in &mut definitions {
        if let Some(&entries) = max_entries.get(name.as_str()) {
            map.set_max_entries(entries);
        }
    }
    // The kernel preallocates some maps whole (the stack map: tens of megabytes), which
    // takes milliseconds; the largest is created on a thread of its own meanwhile.
    let largest = definitions
        .iter()
        .enumerate()
        .max_by_key(|(_, (_, map))| {
            u64::from(map.max_entries()) * u64::from(map.key_size() + map.value_size())
        })
        .map(|(i, _)| i);
    let largest = largest.map(|i| definitions.swap_remove(i));
    let created = std::thread::scope(|scope| {
        let largest = largest.map(|(name, map)| scope.spawn(move || create_map(name, map)));
        let mut created = definitions
            .into_iter()
            .map(|(name, map)| create_map(name, map))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(largest) = largest {
            created.push(
                largest
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?,
            );
        }
        Ok::<_, LoaderError>(created)
    })?;
    let text_sections: HashSet<usize> = object.functions.keys().map(|&(s, _)| s).collect();
    object
        .relocate_maps(
            created
                .iter()
                .map(|(name, def, data)| (name.as_str(), data.fd().as_fd().as_raw_fd(), def)),
            &text_sections,
        )
        .map_err(|e| error(e.into()))?;
    object
        .relocate_calls(&text_sections)
        .map_err(|e| error(e.into()))?;
    let maps = created
        .into_iter()
        .map(|(name, _, data)| Ok((name, Map::from_map_data(data)?)))
        .collect::<Result<_, aya::maps::MapError>>()
        .map_err(|e| error(e.into()))?;
    Ok((
        maps,
        Programs {
            object,
            loaded: HashMap::new(),
        },
    ))
}

/// Creates map `name` as `map` defines it, with its initial data for globals.
fn create_map(
    name: String,
    map: aya_obj::Map,
) -> Result<(String, aya_obj::Map, MapData), LoaderError> {
    let definition = map.clone();
    let data = MapData::create(map, &name, None).map_err(|e| LoaderError::Load(e.into()))?;
    let kind = definition.section_kind();
    if matches!(
        kind,
        EbpfSectionKind::Data | EbpfSectionKind::Rodata | EbpfSectionKind::Bss
    ) && !definition.data().is_empty()
    {
        sys::fill_data_map(
            data.fd().as_fd(),
            definition.data(),
            kind == EbpfSectionKind::Rodata,
        )
        .map_err(|e| LoaderError::KernelFeature(format!("global data of {name}: {e}")))?;
    }
    Ok((name, definition, data))
}

impl Programs {
    /// Program `name`, verified by the kernel on first use. BTF tracepoint programs are
    /// verified against the kernel type `attach_btf_id` (the tracepoint's `btf_trace_*`
    /// typedef); the others ignore it.
    pub(super) fn fd(
        &mut self,
        name: &'static str,
        attach_btf_id: Option<u32>,
    ) -> Result<BorrowedFd<'_>, LoaderError> {
        if !self.loaded.contains_key(name) {
            let program = self
                .object
                .programs
                .get(name)
                .ok_or(LoaderError::Missing(name))?;
            let function = self
                .object
                .functions
                .get(&program.function_key())
                .ok_or(LoaderError::Missing(name))?;
            let kind = match program.section {
                ProgramSection::UProbe { .. } => sys::ProgramKind {
                    prog_type: bpf_prog_type::BPF_PROG_TYPE_KPROBE,
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
                _ => return Err(LoaderError::Missing(name)),
            };
            let fd = sys::load_program(&kind, name, &function.instructions, &program.license)
                .map_err(|e| {
                    LoaderError::KernelFeature(format!("loading eBPF program {name}: {e}"))
                })?;
            self.loaded.insert(name, fd);
        }
        Ok(self.loaded[name].as_fd())
    }
}
