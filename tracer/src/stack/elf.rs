//! What the tracer looks up in a mapped ELF file itself: symbols by name, and where the
//! file is loaded in a process, from one of its mappings.

use std::fs::File;

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

/// The loadable segments of an ELF file and the symbols asked for, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct ElfSymbols {
    /// (name, link-time address, size) of each symbol found, in the order asked.
    pub found: Vec<(&'static str, u64, u64)>,
    /// (file offset, address, size in the file) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl ElfSymbols {
    /// Reads `file`'s symbol table and dynamic symbols for `names` (its segments alone
    /// when there are none); `None` when it is not an ELF file.
    pub(crate) fn read(file: &File, names: &[&'static str]) -> Option<Self> {
        let data = tracer_usdt::SymbolFile::new(file.try_clone().ok()?);
        let elf = object::File::parse(&data).ok()?;
        let mut found = Vec::new();
        let symbols = elf.symbols().chain(elf.dynamic_symbols());
        for symbol in symbols.take_while(|_| !names.is_empty()) {
            let Ok(name) = symbol.name() else {
                continue;
            };
            if let Some(&wanted) = names.iter().find(|&&n| n == name) {
                let entry = (wanted, symbol.address(), symbol.size());
                if !found.contains(&entry) {
                    found.push(entry);
                }
            }
        }
        let segments = elf
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        Some(Self { found, segments })
    }

    /// The link-time address of symbol `name`, if found.
    pub(crate) fn address(&self, name: &str) -> Option<u64> {
        self.found.iter().find(|f| f.0 == name).map(|f| f.1)
    }

    /// Where the file is loaded, from one of its mappings (its start, and the offset in
    /// the file it maps): what to add to a link-time address to find it in the process.
    pub(crate) fn load_bias(&self, start: u64, offset: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        self.segments
            .iter()
            .filter(|(at, _, size)| (at & !(PAGE - 1)..at + size.max(&1)).contains(&offset))
            .max_by_key(|(at, _, _)| *at)
            .map(|(at, address, _)| {
                start.wrapping_sub(address.wrapping_add(offset).wrapping_sub(*at))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function of this test binary, found by name where it is loaded.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn tracer_elf_test_marker() -> u32 {
        std::hint::black_box(7)
    }

    #[test]
    fn finds_our_own_symbols_where_they_are_loaded() {
        let exe = File::open("/proc/self/exe").unwrap();
        let name = "tracer_elf_test_marker";
        let symbols = ElfSymbols::read(&exe, &[name]).unwrap();
        let linked = symbols
            .address(name)
            .expect("the test binary has the marker");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe_path = std::fs::read_link("/proc/self/exe").unwrap();
        let mapping = maps
            .lines()
            .filter_map(crate::system::procfs::parse_maps_line)
            .find(|e| e.path.as_deref() == exe_path.to_str() && e.is_executable())
            .unwrap();
        let bias = symbols.load_bias(mapping.start, mapping.offset).unwrap();
        let marker = tracer_elf_test_marker as extern "C" fn() -> u32;
        assert_eq!(bias.wrapping_add(linked), marker as usize as u64);
        assert_eq!(marker(), 7);
    }
}
