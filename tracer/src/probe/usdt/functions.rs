//! Functions as probe sites (`uprobe:PATH:FUNC`, `uretprobe:PATH:FUNC`,
//! `uprobe:PATH:FUNC+N`, `uprobe:PATH:0xADDR`): a function becomes a [`ProbeSite`] with
//! no provider and no semaphore, whose arguments are the registers of the System V
//! calling convention (or `%rax`, the return value, at a return probe). The USDT
//! machinery then attaches, counts and decodes it as it does a note's site.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};
use tracer_common::{UsdtArg, arg_kind};
use tracer_usdt::SymbolFile;

use super::{MappedObject, ProbeSite, SiteArg, UsdtError, UsdtNote};
use crate::stack::symbolize::demangle;
use tracer_usdt::Error as FileError;
use tracer_usdt::{FunctionPlace, Layout, ProbeKind, Segment, UsdtSpecifier, validate};

/// Byte offsets in `pt_regs` of the integer argument registers, in order: `%rdi %rsi
/// %rdx %rcx %r8 %r9`.
const ARGUMENT_REGISTERS: [u8; 6] = [112, 104, 96, 88, 72, 64];
/// Byte offset of `%rax` in `pt_regs`: a function's return value at its return.
const RETURN_REGISTER: u8 = 80;
/// Go's internal calling convention's first six integer argument registers: `%rax %rbx
/// %rcx %rdi %rsi %r8`.
const GO_ARGUMENT_REGISTERS: [u8; 6] = [80, 40, 88, 112, 104, 72];

/// A function in an object's symbol tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FunctionSymbol {
    /// As in the symbol table (mangled for C++ and Rust).
    pub name: String,
    /// Link-time address of its first instruction.
    pub address: u64,
    /// Bytes of code; 0 when the symbol table does not say.
    pub size: u64,
}

impl FunctionSymbol {
    /// Demangled, or the name itself when it is not mangled.
    pub(crate) fn demangled(&self) -> String {
        demangle(&self.name)
    }
}

/// What an object offers function probes: its functions and where its code is.
pub(crate) struct Functions {
    pub symbols: Vec<FunctionSymbol>,
    layout: Layout,
    /// The object's code, read on demand to check an offset falls on an instruction.
    path: PathBuf,
    /// A Go program: its stacks move, so no return probe may go in it.
    pub is_go: bool,
}

impl Functions {
    /// The defined functions of the object at `path` (as this process opens it), from
    /// `.symtab` and `.dynsym` and from a separate debug file when one is installed
    /// (found by build id or `.gnu_debuglink`), each address and name once.
    pub(crate) fn read(path: &Path) -> Result<Self, UsdtError> {
        let file = File::open(path).map_err(|e| UsdtError::io(path, e))?;
        let file_len = file.metadata().map_or(u64::MAX, |m| m.len());
        let symbol_file = SymbolFile::new(file);
        let object = object::File::parse(&symbol_file).map_err(|source| match source {
            _ if !is_elf(path) => UsdtError::from(FileError::NotElf {
                path: path.to_path_buf(),
            }),
            source => UsdtError::from(FileError::BadElf {
                path: path.to_path_buf(),
                source,
            }),
        })?;
        let mut layout = Layout {
            file_len,
            ..Layout::default()
        };
        for segment in object.segments() {
            let (offset, filesz) = segment.file_range();
            let flags = match segment.flags() {
                object::SegmentFlags::Elf { p_flags } => p_flags,
                _ => 0,
            };
            layout.loads.push(Segment {
                vaddr: segment.address(),
                memsz: segment.size(),
                offset,
                filesz,
                flags,
            });
        }
        let is_go = object.section_by_name(".go.buildinfo").is_some()
            || object.section_by_name(".gopclntab").is_some();
        let mut seen = HashSet::new();
        let mut symbols = Vec::new();
        let mut add = |object: &object::File<'_, &SymbolFile>| {
            for symbol in object.symbols().chain(object.dynamic_symbols()) {
                if symbol.kind() != SymbolKind::Text || symbol.is_undefined() {
                    continue;
                }
                let (Ok(name), address) = (symbol.name(), symbol.address()) else {
                    continue;
                };
                if name.is_empty() || address == 0 || !seen.insert((address, name.to_owned())) {
                    continue;
                }
                symbols.push(FunctionSymbol {
                    name: name.to_owned(),
                    address,
                    size: symbol.size(),
                });
            }
        };
        add(&object);
        if let Some(debug_path) = separate_debug_file(path, &object)
            && let Ok(debug_file) = File::open(&debug_path)
        {
            let debug_symbols = SymbolFile::new(debug_file);
            if let Ok(debug_object) = object::File::parse(&debug_symbols) {
                add(&debug_object);
            }
        }
        symbols.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
        Ok(Functions {
            symbols,
            layout,
            path: path.to_path_buf(),
            is_go,
        })
    }

    /// The sites `spec` (a function specifier) selects in this object, `binary`.
    pub(crate) fn sites(
        &self,
        binary: &MappedObject,
        spec: &UsdtSpecifier,
    ) -> Result<Vec<ProbeSite>, UsdtError> {
        if spec.kind == ProbeKind::Uretprobe && self.is_go {
            return Err(UsdtError::from(FileError::BadSpecifier {
                spec: spec.describe(),
                reason: format!(
                    "{} is a Go program: Go moves its goroutines' stacks, and a return \
                     probe there corrupts them; use entry probes (uprobe:) only",
                    binary.path.display()
                ),
            }));
        }
        let mut sites = Vec::new();
        match spec.place {
            FunctionPlace::Address(address) => {
                let function = self.containing(address);
                let name = format!("{address:#x}");
                let offset = function.map_or(0, |f| address - f.address);
                self.check_instruction(spec, address, function, offset)?;
                sites.push(self.site(binary, spec.kind, name, address, function)?);
            }
            place => {
                let offset = match place {
                    FunctionPlace::Offset(n) => n,
                    _ => 0,
                };
                let mut addresses = HashSet::new();
                // Demangling a large C++ program's every symbol takes a while: only for a
                // pattern that can match a demangled name and not its mangled one (a
                // wildcard, or a `::` or parameter list).
                let pattern = &spec.pattern.name;
                let demangled_too = !pattern.is_literal()
                    || pattern.as_str().contains("::")
                    || pattern.as_str().contains('(');
                for function in self.symbols.iter().filter(|f| {
                    pattern.matches(&f.name) || (demangled_too && pattern.matches(&f.demangled()))
                }) {
                    // Aliases (`__libc_malloc` and `malloc`) are one function: one site.
                    if !addresses.insert(function.address) {
                        continue;
                    }
                    if offset > 0 {
                        if function.size > 0 && offset >= function.size {
                            return Err(UsdtError::from(FileError::BadSpecifier {
                                spec: spec.describe(),
                                reason: format!(
                                    "{} is {} bytes long: offset {offset} is past its end",
                                    function.name, function.size
                                ),
                            }));
                        }
                        self.check_instruction(
                            spec,
                            function.address + offset,
                            Some(function),
                            offset,
                        )?;
                    }
                    let name = match offset {
                        0 => function.name.clone(),
                        n => format!("{}+{n}", function.name),
                    };
                    sites.push(self.site(
                        binary,
                        spec.kind,
                        name,
                        function.address + offset,
                        Some(function),
                    )?);
                }
            }
        }
        Ok(sites)
    }

    /// The function whose code holds `address`.
    fn containing(&self, address: u64) -> Option<&FunctionSymbol> {
        self.symbols
            .iter()
            .filter(|f| f.address <= address && address < f.address + f.size.max(1))
            .max_by_key(|f| f.address)
    }

    /// Refuses an address that is not the start of an instruction of `function` (decoded
    /// from the function's start): a breakpoint inside an instruction corrupts it.
    fn check_instruction(
        &self,
        spec: &UsdtSpecifier,
        address: u64,
        function: Option<&FunctionSymbol>,
        offset: u64,
    ) -> Result<(), UsdtError> {
        let refuse = |reason: String| {
            UsdtError::from(FileError::BadSpecifier {
                spec: spec.describe(),
                reason,
            })
        };
        let Some(function) = function else {
            return Err(refuse(format!(
                "no function of the symbol tables holds {address:#x}, so whether an \
                 instruction starts there cannot be checked"
            )));
        };
        if offset == 0 {
            return Ok(());
        }
        let start = validate(&self.layout, function.address, None)
            .map_err(|problem| refuse(problem.to_string()))?
            .probe;
        let mut code = vec![0u8; offset as usize + 16];
        let read =
            read_at(&self.path, start, &mut code).map_err(|e| UsdtError::io(&self.path, e))?;
        code.truncate(read);
        let mut decoder =
            iced_x86::Decoder::with_ip(64, &code, function.address, iced_x86::DecoderOptions::NONE);
        while decoder.can_decode() && decoder.ip() < address {
            let _ = decoder.decode();
        }
        if decoder.ip() == address {
            Ok(())
        } else {
            Err(refuse(format!(
                "{address:#x} ({}+{offset}) is inside an instruction, not at its start: a \
                 breakpoint there would corrupt it",
                function.name
            )))
        }
    }

    fn site(
        &self,
        binary: &MappedObject,
        kind: ProbeKind,
        name: String,
        address: u64,
        function: Option<&FunctionSymbol>,
    ) -> Result<ProbeSite, UsdtError> {
        let location = validate(&self.layout, address, None);
        if let Err(problem) = &location {
            return Err(UsdtError::from(FileError::BadSpecifier {
                spec: format!("{kind}:{}:{name}", binary.path.display()),
                reason: problem.to_string(),
            }));
        }
        Ok(ProbeSite {
            binary: binary.clone(),
            note: UsdtNote {
                provider: String::new(),
                name,
                pc: address,
                semaphore: None,
                arg_spec: String::new(),
                note_offset: 0,
                location,
            },
            args: Ok(function_args(kind, self.is_go)),
            kind,
            function: function.cloned(),
        })
    }
}

/// The arguments a function probe shows: the six integer argument registers at an entry
/// (what they hold past the entry is up to the code; Go's own for a Go program), the
/// return value at a return.
pub(crate) fn function_args(kind: ProbeKind, go: bool) -> Vec<SiteArg> {
    let register = |reg_off| {
        Ok(UsdtArg {
            kind: arg_kind::REG,
            reg_off,
            size: 8,
            ..Default::default()
        })
    };
    match kind {
        ProbeKind::Uretprobe => vec![register(RETURN_REGISTER)],
        _ if go => GO_ARGUMENT_REGISTERS.into_iter().map(register).collect(),
        _ => ARGUMENT_REGISTERS.into_iter().map(register).collect(),
    }
}

/// Reads up to `buf.len()` bytes of `path` at `offset`; how many it read.
fn read_at(path: &Path, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt as _;
    let file = File::open(path)?;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Whether the ELF file at `path` is a Go program (it has Go's build information or
/// line table); reads its section headers only.
pub(crate) fn is_go_program(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let cache = ReadCache::new(file);
    object::File::parse(&cache).is_ok_and(|object| {
        object.section_by_name(".go.buildinfo").is_some()
            || object.section_by_name(".gopclntab").is_some()
    })
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    read_at(path, 0, &mut magic).is_ok_and(|n| n == 4) && magic == *b"\x7fELF"
}

/// Where a separate debug file for the object would be installed (Debian's `-dbgsym`
/// packages, or a `.debug` file next to it), the first that exists: by build id under
/// `/usr/lib/debug/.build-id/`, then by `.gnu_debuglink` name next to the object, in its
/// `.debug` directory, or under `/usr/lib/debug` plus its directory.
fn separate_debug_file<'data, R: object::ReadRef<'data>>(
    path: &Path,
    object: &object::File<'data, R>,
) -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(Some(id)) = object.build_id()
        && id.len() > 1
    {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        candidates.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        )));
    }
    if let Ok(Some((name, _crc))) = object.gnu_debuglink() {
        let name = Path::new(std::str::from_utf8(name).ok()?);
        let dir = path.parent()?;
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        let relative = dir.strip_prefix("/").unwrap_or(dir);
        candidates.push(Path::new("/usr/lib/debug").join(relative).join(name));
    }
    candidates
        .into_iter()
        .find(|candidate| candidate != path && candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::super::parse_specifier;
    use super::*;

    /// This test binary: its symbol table has the test functions.
    fn own_functions() -> (Functions, MappedObject) {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        (
            Functions::read(&exe).unwrap(),
            MappedObject::from_path(&exe),
        )
    }

    #[inline(never)]
    #[unsafe(no_mangle)]
    pub(crate) extern "C" fn tracer_functions_test_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3).wrapping_add(1)
    }

    /// A Rust function kept as a function of its own (called through a pointer).
    #[inline(never)]
    fn rust_named_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_add(7)
    }

    #[test]
    fn functions_are_found_by_name_mangled_or_not() {
        std::hint::black_box(tracer_functions_test_target(1));
        let pointer: fn(u64) -> u64 = std::hint::black_box(rust_named_target);
        std::hint::black_box(pointer(1));
        let (functions, exe) = own_functions();
        let path = exe.path.display();
        let spec = parse_specifier(&format!("uprobe:{path}:tracer_functions_test_target")).unwrap();
        let sites = functions.sites(&exe, &spec).unwrap();
        assert_eq!(sites.len(), 1);
        let site = &sites[0];
        assert_eq!(site.kind, ProbeKind::Uprobe);
        assert_eq!(site.note.provider, "");
        assert_eq!(site.note.name, "tracer_functions_test_target");
        assert!(site.offsets().is_ok());
        assert_eq!(site.args.as_ref().unwrap().len(), 6);
        // A Rust function by its demangled path, with wildcards.
        let spec = parse_specifier(&format!(
            "uprobe:{path}:*usdt::functions::tests::rust_named_target"
        ))
        .unwrap();
        let sites = functions.sites(&exe, &spec).unwrap();
        assert_eq!(sites.len(), 1, "{sites:?}");
        assert!(sites[0].note.name.starts_with("_R") || sites[0].note.name.starts_with("_ZN"));
        // The return value only, at a return.
        let spec =
            parse_specifier(&format!("uretprobe:{path}:tracer_functions_test_target")).unwrap();
        let sites = functions.sites(&exe, &spec).unwrap();
        assert_eq!(sites[0].args.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn offsets_must_start_an_instruction() {
        let (functions, exe) = own_functions();
        let path = exe.path.display();
        let function = functions
            .symbols
            .iter()
            .find(|f| f.name == "tracer_functions_test_target")
            .unwrap()
            .clone();
        // Find the second instruction with the decoder, and a byte within the first
        // instruction when it is longer than one byte.
        let start = validate(&functions.layout, function.address, None)
            .unwrap()
            .probe;
        let mut code = [0u8; 32];
        read_at(&exe.host_path, start, &mut code).unwrap();
        let mut decoder = iced_x86::Decoder::with_ip(64, &code, 0, iced_x86::DecoderOptions::NONE);
        let first_len = decoder.decode().len() as u64;
        let at = |offset: u64| {
            let spec = parse_specifier(&format!(
                "uprobe:{path}:tracer_functions_test_target+{offset}"
            ))
            .unwrap();
            functions.sites(&exe, &spec)
        };
        let site = &at(first_len).unwrap()[0];
        assert_eq!(site.note.pc, function.address + first_len);
        assert_eq!(
            site.note.name,
            format!("tracer_functions_test_target+{first_len}")
        );
        if first_len > 1 {
            let err = at(1).unwrap_err().to_string();
            assert!(err.contains("is inside an instruction"), "{err}");
        }
        let err = at(function.size + 4).unwrap_err().to_string();
        assert!(err.contains("past its end"), "{err}");
        // By address: the function's start, and no function at all.
        let spec = parse_specifier(&format!("uprobe:{path}:{:#x}", function.address)).unwrap();
        assert_eq!(
            functions.sites(&exe, &spec).unwrap()[0].note.pc,
            function.address
        );
        let spec = parse_specifier(&format!("uprobe:{path}:0x1")).unwrap();
        let err = functions.sites(&exe, &spec).unwrap_err().to_string();
        assert!(
            err.contains("no function of the symbol tables holds 0x1"),
            "{err}"
        );
    }
}
