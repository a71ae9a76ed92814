//! Loading the object without aya's `EbpfLoader`, for runs that only use the USDT
//! programs (`tracer trace`). `EbpfLoader::new` always parses the kernel's BTF (megabytes,
//! tens of milliseconds) and `load` verifies nothing we could skip; the USDT programs need
//! neither BTF nor CO-RE, so this path creates the maps, relocates, and loads a program
//! only when it is first attached.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
};

use aya::{
    EbpfError,
    maps::{Map, MapData},
};
use aya_obj::{EbpfSectionKind, Object, generated::bpf_prog_type};

use super::{LoaderError, sys};

/// The relocated object, its programs loaded on demand.
pub(super) struct UsdtPrograms {
    object: Object,
    loaded: HashMap<&'static str, OwnedFd>,
}

/// Creates every map of `data` (sizes from `max_entries`, read-only globals from
/// `globals`) and relocates the programs to them.
pub(super) fn load(
    data: &[u8],
    globals: &[(&'static str, Vec<u8>)],
    max_entries: &HashMap<&'static str, u32>,
) -> Result<(HashMap<String, Map>, UsdtPrograms), LoaderError> {
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
    let mut created = Vec::new();
    for (name, mut map) in object.maps.drain() {
        if let Some(&entries) = max_entries.get(name.as_str()) {
            map.set_max_entries(entries);
        }
        let definition = map.clone();
        let data = MapData::create(map, &name, None).map_err(|e| error(e.into()))?;
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
        created.push((name, definition, data));
    }
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
        UsdtPrograms {
            object,
            loaded: HashMap::new(),
        },
    ))
}

impl UsdtPrograms {
    /// Uprobe program `name`, verified by the kernel on first use.
    pub(super) fn fd(&mut self, name: &'static str) -> Result<BorrowedFd<'_>, LoaderError> {
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
            let fd = sys::load_program(
                bpf_prog_type::BPF_PROG_TYPE_KPROBE,
                name,
                &function.instructions,
                &program.license,
            )
            .map_err(|e| LoaderError::KernelFeature(format!("loading eBPF program {name}: {e}")))?;
            self.loaded.insert(name, fd);
        }
        Ok(self.loaded[name].as_fd())
    }
}
