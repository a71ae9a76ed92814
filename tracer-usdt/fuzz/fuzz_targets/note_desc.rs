//! Feeds arbitrary bytes to the `.note.stapsdt` descriptor parser: it must reject
//! malformed descriptors with an error, never panic or read out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_usdt::{parse_arg_specs, parse_note_desc};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the ELF class and byte order, so one corpus covers all four.
    let Some((&mode, desc)) = data.split_first() else {
        return;
    };
    let (is_64, little_endian) = (mode & 1 != 0, mode & 2 != 0);
    if let Ok(note) = parse_note_desc(desc, is_64, little_endian) {
        for s in [&note.provider, &note.name, &note.arg_spec] {
            assert!(!s.contains('\0'), "strings end at their NUL");
        }
        assert!(!note.provider.is_empty() && !note.name.is_empty());
        // A real reader goes on to decode the spec; that must not panic either.
        let _ = parse_arg_specs(&note.arg_spec);
    }
});
