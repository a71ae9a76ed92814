//! Link-time addresses of the symbols that `%rip`-relative argument specs name
//! (`-1@4+t1(%rip)`), read from an object's symbol tables.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::Path;

use object::read::ReadCache;
use object::{Object as _, ObjectSymbol as _, SymbolKind};

use crate::{Error, SymbolFile};

/// The addresses of the `wanted` symbols in the object at `path` (as this process opens
/// it), each the address or why there is none. Both `.symtab` and `.dynsym` are read: a
/// stripped object keeps only the latter, which has its exported globals.
pub fn symbol_addresses(
    path: &Path,
    wanted: &HashSet<&str>,
) -> Result<HashMap<String, Result<u64, String>>, Error> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let symbols = SymbolFile::new(file);
    let object = object::File::parse(&symbols).map_err(|source| Error::BadElf {
        path: path.to_path_buf(),
        source,
    })?;
    let mut found: HashMap<&str, (BTreeSet<u64>, bool)> = HashMap::new();
    for symbol in object.symbols().chain(object.dynamic_symbols()) {
        // The wanted spelling of the name, which outlives the symbol's.
        let Some(&name) = symbol.name().ok().and_then(|name| wanted.get(name)) else {
            continue;
        };
        if symbol.is_undefined() {
            continue;
        }
        let entry = found.entry(name).or_default();
        if symbol.kind() == SymbolKind::Tls {
            entry.1 = true;
        } else {
            entry.0.insert(symbol.address());
        }
    }
    Ok(wanted
        .iter()
        .map(|&name| {
            let address = match found.get(name) {
                Some((addresses, _)) if addresses.len() == 1 => {
                    Ok(*addresses.first().expect("one address"))
                }
                Some((addresses, _)) if addresses.len() > 1 => Err(format!(
                    "{} symbols are named {name} (statics of different files?): which one \
                     the probe reads is unknown",
                    addresses.len()
                )),
                Some((_, true)) => Err(format!(
                    "{name} is thread-local: its address differs by thread"
                )),
                _ => Err(format!(
                    "no symbol {name} in the object's symbol tables (stripped?)"
                )),
            };
            (name.to_owned(), address)
        })
        .collect())
}

/// The dynamic loader an executable names (`PT_INTERP`), when it has one.
pub fn interpreter(path: &Path) -> Option<std::path::PathBuf> {
    use object::read::elf::{ElfFile64, ProgramHeader as _};
    let data = std::fs::read(path).ok()?;
    let elf = ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    let endian = elf.endian();
    let header = elf
        .elf_program_headers()
        .iter()
        .find(|h| h.p_type(endian) == object::elf::PT_INTERP)?;
    let bytes = header.data(endian, &*data).ok()?;
    let name = bytes.split(|&b| b == 0).next()?;
    Some(std::path::PathBuf::from(
        std::str::from_utf8(name).ok()?.to_owned(),
    ))
}

/// The file offset of the dynamic loader's `_dl_debug_state` (glibc's, which every
/// `dlopen` and `dlclose` calls once the objects are mapped or unmapped: what debuggers
/// stop at), in the loader at `path`.
pub fn dl_debug_state_offset(path: &Path) -> Option<u64> {
    let wanted = HashSet::from(["_dl_debug_state"]);
    let address = *symbol_addresses(path, &wanted)
        .ok()?
        .get("_dl_debug_state")?
        .as_ref()
        .ok()?;
    let file = File::open(path).ok()?;
    let cache = ReadCache::new(file);
    let object = object::File::parse(&cache).ok()?;
    object.segments().find_map(|segment| {
        use object::ObjectSegment as _;
        let (offset, size) = segment.file_range();
        let start = segment.address();
        (start <= address && address < start + size).then(|| address - start + offset)
    })
}
