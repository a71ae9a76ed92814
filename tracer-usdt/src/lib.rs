//! USDT (SystemTap SDT) probes as ELF files describe them: the `.note.stapsdt` notes read
//! and decoded ([`read_notes`]), each note's addresses checked against the file's segments
//! ([`validate`]), the x86-64 argument specs decoded into [`tracer_common::UsdtArg`]s
//! ([`parse_arg_specs`]), probe patterns and `usdt:` specifiers ([`parse_specifier`]), and
//! the symbols argument specs and the dynamic loader name ([`symbol_addresses`]).
//!
//! Everything here is plain parsing of files and text, with no process, eBPF or root
//! involved: it is unit-tested and fuzzed (`fuzz/`, `cargo xtask fuzz`) as it is.

mod notes;
mod pattern;
mod spec;
mod symbol_file;
mod symbols;
#[cfg(any(test, feature = "test-elf"))]
pub mod test_elf;
mod validate;

use std::io;
use std::path::{Path, PathBuf};

pub use notes::{NoteDesc, UsdtNote, parse_note_desc, parse_notes, read_notes};
pub use pattern::{
    FunctionPlace, Glob, ProbeKind, ProbePattern, UsdtSpecifier, glob_paths, has_probe_type,
    parse_specifier,
};
pub use spec::{ArgSpec, SiteArg, describe, parse_arg_specs, resolve_globals};
pub use symbol_file::SymbolFile;
pub use symbols::{dl_debug_state_offset, interpreter, symbol_addresses};
pub use validate::{Layout, Segment, SiteOffsets, SiteProblem, validate};

/// What can be wrong with a file's notes or with a probe's text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file exists but is not an ELF object (a script, a data file, a directory...).
    #[error("not an ELF file: {}", path.display())]
    NotElf {
        /// The file as it was opened.
        path: PathBuf,
    },
    /// The ELF headers themselves are broken, so no note can be trusted.
    #[error("invalid ELF file {}", path.display())]
    BadElf {
        /// The file as it was opened.
        path: PathBuf,
        /// What the ELF reader found wrong.
        source: object::read::Error,
    },
    /// One `stapsdt` note could not be decoded. Fails the whole file, as libbpf does:
    /// a broken note means the file's notes cannot be trusted.
    #[error("malformed note in {} at offset {offset:#x}: {reason}", path.display())]
    MalformedNote {
        /// The file as it was opened.
        path: PathBuf,
        /// File offset of the note's header, for `xxd`/`readelf` follow-up.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A note decodes, but its addresses must not be attached: the probe is not in code,
    /// or the kernel could not count its semaphore.
    #[error(
        "malformed note in {} at offset {note_offset:#x} ({provider}:{name}): {problem}",
        path.display()
    )]
    InvalidSite {
        /// The file as the process sees it (or as the user gave it).
        path: PathBuf,
        /// File offset of the note's header.
        note_offset: u64,
        /// The probe's provider.
        provider: String,
        /// The probe's name.
        name: String,
        /// What is wrong with its addresses (boxed: errors travel in every `Result`).
        problem: Box<SiteProblem>,
    },
    /// An argument spec string from a note could not be decoded.
    #[error("bad argument spec \"{spec}\": {reason}")]
    BadArgSpec {
        /// The whole spec string of the note.
        spec: String,
        /// Which argument failed and why.
        reason: String,
    },
    /// A probe pattern or `usdt:` specifier given by the user is not valid.
    #[error("bad probe specifier \"{spec}\": {reason}")]
    BadSpecifier {
        /// The text as the user gave it.
        spec: String,
        /// What form was expected.
        reason: String,
    },
    /// Reading a file failed for a reason other than the ones above (permissions, I/O).
    #[error("cannot read {}{}", path.display(), proc_permission_hint(path, source))]
    Io {
        /// The file or `/proc` entry that could not be read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

impl Error {
    /// Reading `path` failed with `source`.
    pub fn io(path: &Path, source: io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why /proc refuses a process's files: the kernel's ptrace access check.
fn proc_permission_hint(path: &Path, error: &io::Error) -> &'static str {
    if error.kind() == io::ErrorKind::PermissionDenied && path.starts_with("/proc") {
        " (another user's process, or one with capabilities tracer lacks: run tracer as \
         root or with CAP_SYS_PTRACE)"
    } else {
        ""
    }
}
