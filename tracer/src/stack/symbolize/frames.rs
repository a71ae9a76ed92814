//! Symbolized frames, and the addresses of a stack they are named at.
//!
//! A frame is named by a symbol, with the functions inlined into it, or by where its
//! address lies when no symbol names it. Mangled names are demangled here.

use blazesym::symbolize::Sym;

use super::maps::Location;

/// Name of frames that no mapping or symbol source can place.
pub(crate) const UNKNOWN: &str = "[unknown]";
/// Module of frames named from a JIT perf map.
pub(super) const JIT_MODULE: &str = "[jit]";
pub(super) const VDSO: &str = "[vdso]";

/// One symbolized stack frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled), `module+0xOFFSET`, or [`UNKNOWN`].
    pub name: String,
    /// File name of the object (`libc.so.6`), `[vdso]`, `[jit]`; `None` for the kernel
    /// and for unknown frames.
    pub module: Option<String>,
    /// True for a function inlined into the frame that follows it in the stack.
    pub inlined: bool,
    /// How far the address looked up is into the function, when a symbol named it (not
    /// for inlined functions).
    pub offset: Option<u64>,
}

impl Frame {
    pub(super) fn unknown() -> Self {
        Self {
            name: UNKNOWN.to_string(),
            module: None,
            inlined: false,
            offset: None,
        }
    }

    fn module_offset(module: &str, offset: u64) -> Self {
        Self {
            name: format!("{module}+{offset:#x}"),
            module: Some(module.to_string()),
            inlined: false,
            offset: None,
        }
    }
}

/// The addresses a stack's frames are named at, innermost first: the instruction
/// pointer, then each return address less one (so it lands in its call), up to the
/// first zero.
pub(crate) fn lookup_addresses(addrs: &[u64]) -> impl Iterator<Item = u64> + '_ {
    lookups(addrs).map(|(lookup, _)| lookup)
}

/// The (lookup address, address) of each frame of a stack as the kernel records it
/// (innermost first, zero-padded): return addresses point after the call, so all but the
/// first are looked up one byte earlier, inside the call instruction.
pub(super) fn lookups(addrs: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
    until_zero(addrs).iter().enumerate().map(|(index, &addr)| {
        let lookup = if index == 0 {
            addr
        } else {
            addr.saturating_sub(1)
        };
        (lookup, addr)
    })
}

pub(super) fn until_zero(addrs: &[u64]) -> &[u64] {
    let end = addrs.iter().position(|&a| a == 0).unwrap_or(addrs.len());
    &addrs[..end]
}

/// The frames of one symbolized address, innermost first: blazesym lists inlined
/// calls outermost first, after the function that contains them.
pub(super) fn frames_of(sym: &Sym<'_>, module: Option<&str>) -> Vec<Frame> {
    let frame = |name: &str, inlined, offset| Frame {
        name: demangle(name),
        module: module.map(str::to_string),
        inlined,
        offset,
    };
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, true, None))
        .collect();
    frames.push(frame(&sym.name, false, Some(sym.offset as u64)));
    frames
}

/// `name` demangled when it is a mangled Rust (legacy `_ZN...E` or v0 `_R...`) or C++
/// (`_Z...`) name, without Rust's hash; any other name as it is (a C function `f` is not
/// the type `float`).
pub(crate) fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") && !name.starts_with("_R") && !name.starts_with("__Z") {
        return name.to_string();
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

/// The frame for an address no symbol source could name.
pub(super) fn fallback_frame(location: Location<'_>) -> Frame {
    match location {
        Location::File {
            module,
            file_offset,
            ..
        } => Frame::module_offset(module, file_offset),
        Location::Vdso { offset } => Frame::module_offset(VDSO, offset),
        Location::Anonymous => Frame {
            name: format!("{UNKNOWN} (anonymous memory)"),
            ..Frame::unknown()
        },
        Location::Unmapped => Frame::unknown(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mangled_names_are_demangled() {
        // One-letter C functions are not C++ builtin types.
        for c in ["f", "i", "w", "main", "gc_collect_main", "Z", "R"] {
            assert_eq!(demangle(c), c);
        }
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_Znot_really"), "_Znot_really");
    }
}
