//! The GDB JIT interface: a JIT that wants its code named by debuggers keeps a list of
//! in-memory object files, one per piece of code, behind the symbol
//! `__jit_debug_descriptor` (LLVM's ORC and MCJIT, Julia with `ENABLE_GDBLISTENER=1`).
//! The list is walked in the process's memory and each object's function symbols name
//! the code at their (already relocated) addresses.
//!
//! `struct jit_descriptor { u32 version; u32 action_flag; jit_code_entry *relevant_entry;
//! jit_code_entry *first_entry; }` and `struct jit_code_entry { jit_code_entry *next_entry,
//! *prev_entry; const char *symfile_addr; u64 symfile_size; }`.

use std::{fs::File, os::unix::fs::FileExt as _};

use object::{Object as _, ObjectSymbol as _, SymbolKind};

use super::jitdump::JitSymbols;

/// The descriptor's symbol.
pub(crate) const DESCRIPTOR: &str = "__jit_debug_descriptor";

/// Entries walked at most: a corrupt list ends there.
const MAX_ENTRIES: usize = 100_000;
/// The largest in-memory object file read.
const MAX_OBJECT_BYTES: u64 = 64 << 20;

/// The code named by the objects registered behind the descriptor at `descriptor`, read
/// through `mem` (the process's `/proc/PID/mem`).
pub(crate) fn registered_code(mem: &File, descriptor: u64) -> JitSymbols {
    let mut symbols = JitSymbols::default();
    let read_u64 = |addr: u64| {
        let mut word = [0u8; 8];
        mem.read_exact_at(&mut word, addr)
            .ok()
            .map(|()| u64::from_le_bytes(word))
    };
    let mut entry = read_u64(descriptor + 16).unwrap_or(0);
    for _ in 0..MAX_ENTRIES {
        if entry == 0 {
            break;
        }
        let (Some(next), Some(addr), Some(size)) =
            (read_u64(entry), read_u64(entry + 16), read_u64(entry + 24))
        else {
            break;
        };
        if size > 0 && size <= MAX_OBJECT_BYTES {
            let mut bytes = vec![0u8; size as usize];
            if mem.read_exact_at(&mut bytes, addr).is_ok() {
                add_functions(&bytes, &mut symbols);
            }
        }
        entry = next;
    }
    symbols
}

/// The function symbols of an in-memory object file, at their addresses.
fn add_functions(object: &[u8], symbols: &mut JitSymbols) {
    let Ok(file) = object::File::parse(object) else {
        return;
    };
    for symbol in file.symbols() {
        if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
            continue;
        }
        if let Ok(name) = symbol.name() {
            symbols.insert(symbol.address(), symbol.size(), name.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_unreadable_list_names_nothing() {
        let mem = File::open("/proc/self/mem").unwrap();
        // A descriptor whose first entry is null.
        let descriptor = [0u64; 4];
        let at = descriptor.as_ptr() as u64;
        assert!(registered_code(&mem, at).is_empty());
        assert!(registered_code(&mem, 8).is_empty());
    }
}
