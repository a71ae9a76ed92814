//! [`SymbolFile`]: an ELF file read for its symbols. `object`'s [`ReadCache`] reads each
//! string with a system call of its own, so that walking a symbol table of tens of
//! thousands of names made as many calls; here the string tables are read whole, once.

use std::fs::File;
use std::ops::Range;

use object::read::{ReadCache, ReadRef};
use object::{Object as _, ObjectSection as _};

/// An ELF file whose string tables are held in memory; the rest is read as asked. Parse
/// it with `object::File::parse(&symbol_file)`.
pub struct SymbolFile {
    cache: ReadCache<File>,
    /// The string tables (`.strtab`, `.dynstr`): their ranges in the file, and bytes.
    strings: Vec<(Range<u64>, Box<[u8]>)>,
}

impl SymbolFile {
    /// Reads `file`'s section headers and string tables; a file that is not ELF is read
    /// as asked, for `object` to tell why.
    pub fn new(file: File) -> Self {
        let cache = ReadCache::new(file);
        let strings = Self::string_tables(&cache);
        SymbolFile { cache, strings }
    }

    fn string_tables(cache: &ReadCache<File>) -> Vec<(Range<u64>, Box<[u8]>)> {
        let Ok(object) = object::File::parse(cache) else {
            return Vec::new();
        };
        [".strtab", ".dynstr"]
            .into_iter()
            .filter_map(|name| {
                let (offset, size) = object.section_by_name(name)?.file_range()?;
                let bytes = cache.read_bytes_at(offset, size).ok()?;
                Some((offset..offset + size, Box::from(bytes)))
            })
            .collect()
    }
}

impl<'a> ReadRef<'a> for &'a SymbolFile {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let held = self
            .strings
            .iter()
            .find(|(at, _)| at.contains(&range.start) && range.end <= at.end);
        let Some((at, bytes)) = held else {
            return (&self.cache).read_bytes_at_until(range, delimiter);
        };
        let start = usize::try_from(range.start - at.start).map_err(|_| ())?;
        let end = usize::try_from(range.end - at.start).map_err(|_| ())?;
        let tail = bytes.get(start..end).ok_or(())?;
        let len = tail.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&tail[..len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::ObjectSymbol as _;

    /// This test's own executable: its symbols, read both ways, are the same.
    #[test]
    fn names_read_from_the_held_tables_are_those_read_one_by_one() {
        let path = std::env::current_exe().unwrap();
        let held = SymbolFile::new(File::open(&path).unwrap());
        assert!(!held.strings.is_empty());
        let cache = ReadCache::new(File::open(&path).unwrap());
        fn names<'a, R: ReadRef<'a>>(object: &object::File<'a, R>) -> Vec<(String, u64)> {
            object
                .symbols()
                .chain(object.dynamic_symbols())
                .map(|s| (s.name().unwrap_or("?").to_string(), s.address()))
                .collect()
        }
        let fast = names(&object::File::parse(&held).unwrap());
        let slow = names(&object::File::parse(&cache).unwrap());
        assert!(fast.len() > 100);
        assert_eq!(fast, slow);
    }
}
