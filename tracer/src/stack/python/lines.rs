//! Line numbers of CPython code objects, decoded from their line tables.
//!
//! A code object maps each of its instructions to a source line with a table of bytes
//! whose format changes between versions:
//! - 3.9 has `co_lnotab`: pairs of an unsigned byte offset increment and a signed line
//!   increment.
//! - 3.10 has `co_linetable`: pairs of an unsigned byte length of a range and a signed
//!   line increment, where an increment of -128 says the range has no line.
//! - 3.11 to 3.13 have `co_linetable` as a location table (PEP 626 and PEP 657): entries
//!   of a header byte, which gives the entry's kind and its length in code units, and of
//!   varint-encoded line and column information.
//!
//! Offsets here are byte offsets into the code's instructions (`co_code`, or
//! `co_code_adaptive` from 3.11), the convention of CPython's `PyCode_Addr2Line`.
//! [`instruction_offset`] turns a frame's raw instruction field into such an offset.

use super::layout::Layout;

/// The line of the instruction at byte offset `offset` into the code (`lasti` in bytes).
///
/// `version` is the CPython `(major, minor)` version that made `linetable`.
/// `first_line` is the code object's `co_firstlineno`.
/// The result is `None` where the table gives the offset no line, where the offset lies
/// past the end of a 3.10+ table, where the table is malformed, and for a version
/// without a decoder here.
/// A 3.9 table has no end, so an offset past it gets the last line.
pub(crate) fn line_for_offset(
    version: (u8, u8),
    linetable: &[u8],
    first_line: u32,
    offset: u64,
) -> Option<u32> {
    let first_line = i64::from(first_line);
    let line = match version {
        (3, 9) => lnotab_line(linetable, first_line, offset),
        (3, 10) => linetable_3_10_line(linetable, first_line, offset),
        (3, 11..=13) => location_table_line(linetable, first_line, offset),
        _ => None,
    }?;
    u32::try_from(line).ok()
}

/// The byte offset into the code of the instruction a frame is at, from the raw value of
/// the frame's instruction field ([`Layout::frame_instr`]).
///
/// `frame_instr` is the 8 bytes read at [`Layout::frame_instr`], as a little-endian word.
/// `code_addr` is the address of the frame's code object.
/// `layout` tells where the instructions start in the code object from 3.11.
/// `version` selects how the field counts:
/// - 3.9: `f_lasti`, a C `int` in the low 32 bits, already counts bytes;
/// - 3.10: `f_lasti`, a C `int` in the low 32 bits, counts code units of two bytes;
/// - 3.11 to 3.13: the pointer minus the address of `co_code_adaptive` counts bytes.
///
/// The result is `None` for a frame that has not started its first instruction: a
/// negative `f_lasti` in 3.9 and 3.10, and a pointer before the first instruction in 3.11
/// and 3.12.
/// CPython gives such a frame the line `co_firstlineno`.
/// The result is also `None` for a version without a layout, and from 3.11 when `layout`
/// has no [`Layout::code_adaptive`].
pub(crate) fn instruction_offset(
    version: (u8, u8),
    frame_instr: u64,
    code_addr: u64,
    layout: &Layout,
) -> Option<u64> {
    match version {
        (3, 9 | 10) => {
            let low = u32::try_from(frame_instr & 0xffff_ffff).ok()?;
            let lasti = u64::try_from(low.cast_signed()).ok()?;
            match version {
                (3, 10) => lasti.checked_mul(2),
                _ => Some(lasti),
            }
        }
        (3, 11..=13) => {
            let start = code_addr.checked_add(layout.code_adaptive?)?;
            frame_instr.checked_sub(start)
        }
        _ => None,
    }
}

/// 3.9 `co_lnotab`: for each pair, the offset advances by the first byte, and if the
/// offset is still at or before `offset`, the line moves by the second byte (signed).
fn lnotab_line(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut address = 0_u64;
    for pair in table.as_chunks::<2>().0 {
        address += u64::from(pair[0]);
        if address > offset {
            break;
        }
        line += i64::from(pair[1].cast_signed());
    }
    Some(line)
}

/// 3.10 `co_linetable`: each pair is a range of the given length in bytes, following
/// the previous one, and a line increment applied before the range; an increment of
/// -128 leaves the line alone and gives the range no line.
fn linetable_3_10_line(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut start = 0_u64;
    for pair in table.as_chunks::<2>().0 {
        let end = start + u64::from(pair[0]);
        let range_line = match pair[1].cast_signed() {
            -128 => None,
            delta => {
                line += i64::from(delta);
                Some(line)
            }
        };
        if offset < end {
            return range_line;
        }
        start = end;
    }
    None
}

/// The kinds of entries of a 3.11+ location table (bits 3 to 6 of an entry's header).
mod location {
    /// Kinds up to this one are short forms: same line, one byte of column data.
    pub(super) const SHORT_LAST: u8 = 9;
    /// Kinds from this one to [`ONE_LINE_LAST`] are one-line forms: the line moves by
    /// the kind minus this one, and two bytes of columns follow.
    pub(super) const ONE_LINE_FIRST: u8 = 10;
    pub(super) const ONE_LINE_LAST: u8 = 12;
    /// A signed varint line increment, and no columns.
    pub(super) const NO_COLUMNS: u8 = 13;
    /// A signed varint line increment, then varints for the end line increment and the
    /// start and end columns.
    pub(super) const LONG: u8 = 14;
    /// No location: the range has no line, and the line stays where it is.
    pub(super) const NONE: u8 = 15;
}

/// 3.11+ location table: each entry covers (bits 0 to 2 of its header) + 1 code units
/// after the previous entry, and bit 7 of a byte marks an entry's header.
fn location_table_line(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut start = 0_u64;
    let mut at = 0;
    while let Some(&header) = table.get(at) {
        if header & 0x80 == 0 {
            return None;
        }
        at += 1;
        let end = start + (u64::from(header & 0x07) + 1) * 2;
        let kind = (header >> 3) & 0x0f;
        let entry_line = match kind {
            location::NONE => None,
            location::NO_COLUMNS | location::LONG => {
                line = line.checked_add(read_signed_varint(table, &mut at)?)?;
                Some(line)
            }
            location::ONE_LINE_FIRST..=location::ONE_LINE_LAST => {
                line += i64::from(kind - location::ONE_LINE_FIRST);
                Some(line)
            }
            _ => {
                debug_assert!(kind <= location::SHORT_LAST);
                Some(line)
            }
        };
        // The rest of the entry (columns) has no bit 7 set.
        while table.get(at).is_some_and(|byte| byte & 0x80 == 0) {
            at += 1;
        }
        if offset < end {
            return entry_line;
        }
        start = end;
    }
    None
}

/// The most bits a varint may hold here: CPython reads varints into a C `unsigned int`.
const VARINT_MAX_BITS: u32 = 36;

/// A varint of a location table: 6 bits per byte, least significant first, with bit 6
/// set on every byte but the last.
fn read_varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0_u64;
    let mut shift = 0;
    loop {
        let byte = *table.get(*at)?;
        if byte & 0x80 != 0 || shift >= VARINT_MAX_BITS {
            return None;
        }
        *at += 1;
        value |= u64::from(byte & 0x3f) << shift;
        if byte & 0x40 == 0 {
            return Some(value);
        }
        shift += 6;
    }
}

/// A signed varint of a location table: the magnitude shifted left by one, with the sign
/// in bit 0.
fn read_signed_varint(table: &[u8], at: &mut usize) -> Option<i64> {
    let value = read_varint(table, at)?;
    let magnitude = i64::try_from(value >> 1).ok()?;
    Some(if value & 1 == 0 {
        magnitude
    } else {
        -magnitude
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::python::layout::layout;

    /// A fixture written by CPython itself: a `# python X.Y.Z` line, then one line per code
    /// object with `co_firstlineno`, the line table in hex (`-` when empty), the length of
    /// the code in bytes, and the line of every byte offset of the code, as runs of
    /// `LINE*COUNT` (`-` for no line).
    /// The lines come from the interpreter's own `PyCode_Addr2Line`.
    struct Case {
        first_line: u32,
        table: Vec<u8>,
        code_len: u64,
        lines: Vec<Option<u32>>,
    }

    fn parse_hex(hex: &str) -> Vec<u8> {
        if hex == "-" {
            return Vec::new();
        }
        (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
            .collect()
    }

    fn parse_fixture(text: &str) -> ((u8, u8), Vec<Case>) {
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        let full = header.strip_prefix("# python ").unwrap();
        let mut parts = full.split('.');
        let major = parts.next().unwrap().parse().unwrap();
        let minor = parts.next().unwrap().parse().unwrap();
        let cases = lines
            .map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                let mut expected = Vec::new();
                for run in &fields[3..] {
                    let (line, count) = run.split_once('*').unwrap();
                    let line = (line != "-").then(|| line.parse().unwrap());
                    let count: usize = count.parse().unwrap();
                    expected.extend(std::iter::repeat_n(line, count));
                }
                let case = Case {
                    first_line: fields[0].parse().unwrap(),
                    table: parse_hex(fields[1]),
                    code_len: fields[2].parse().unwrap(),
                    lines: expected,
                };
                assert_eq!(case.lines.len() as u64, case.code_len, "{line}");
                case
            })
            .collect();
        ((major, minor), cases)
    }

    fn check_fixture(text: &str, expected_version: (u8, u8)) {
        let (version, cases) = parse_fixture(text);
        assert_eq!(version, expected_version);
        assert!(cases.len() >= 100, "only {} code objects", cases.len());
        let mut checked = 0;
        for case in &cases {
            for (offset, expected) in case.lines.iter().enumerate() {
                let got = line_for_offset(version, &case.table, case.first_line, offset as u64);
                assert_eq!(
                    got, *expected,
                    "{version:?}: offset {offset} of code at line {} with table {:02x?}",
                    case.first_line, case.table
                );
                checked += 1;
            }
            if version.1 >= 10 {
                let past = line_for_offset(version, &case.table, case.first_line, case.code_len);
                assert_eq!(past, None, "past the end of {:02x?}", case.table);
            }
        }
        assert!(checked > 10_000, "only {checked} offsets");
    }

    #[test]
    fn lines_of_3_9() {
        check_fixture(include_str!("testdata/lines_3.9.txt"), (3, 9));
    }

    #[test]
    fn lines_of_3_10() {
        check_fixture(include_str!("testdata/lines_3.10.txt"), (3, 10));
    }

    #[test]
    fn lines_of_3_11() {
        check_fixture(include_str!("testdata/lines_3.11.txt"), (3, 11));
    }

    #[test]
    fn lines_of_3_12() {
        check_fixture(include_str!("testdata/lines_3.12.txt"), (3, 12));
    }

    #[test]
    fn lines_of_3_13() {
        check_fixture(include_str!("testdata/lines_3.13.txt"), (3, 13));
    }

    #[test]
    fn location_table_forms() {
        let v = (3, 11);
        // Short form (kind 0, 2 code units), one-line form +2 (kind 12, 1 unit), no-column
        // form -3 (kind 13), long form +70 (kind 14: 140 is a two-byte varint), none
        // (kind 15).
        let table = [
            0x80 | 1,
            0x05,
            0x80 | (12 << 3),
            4,
            9,
            0x80 | (13 << 3),
            7,
            0x80 | (14 << 3),
            0x40 | 0x0c,
            2,
            0,
            1,
            2,
            0x80 | (15 << 3) | 2,
        ];
        let lines: Vec<_> = (0..24)
            .map(|at| line_for_offset(v, &table, 10, at))
            .collect();
        let expected = [
            [Some(10); 4].as_slice(),
            &[Some(12); 2],
            &[Some(9); 2],
            &[Some(79); 2],
            &[None; 6],
            &[None; 8],
        ]
        .concat();
        assert_eq!(lines, expected);
    }

    #[test]
    fn malformed_location_tables_give_no_line() {
        // A continuation byte where a header should be.
        assert_eq!(line_for_offset((3, 12), &[0x05], 1, 0), None);
        // A varint cut short.
        assert_eq!(
            line_for_offset((3, 12), &[0x80 | (13 << 3), 0x41], 1, 0),
            None
        );
        // A line that would be negative.
        assert_eq!(line_for_offset((3, 12), &[0x80 | (13 << 3), 5], 1, 0), None);
        // A varint longer than any CPython writes.
        let long = [0x80 | (13 << 3), 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x01];
        assert_eq!(line_for_offset((3, 12), &long, 1, 0), None);
        assert_eq!(line_for_offset((3, 8), &[], 1, 0), None);
    }

    #[test]
    fn instruction_offsets() {
        let l39 = layout(3, 9).unwrap();
        let l310 = layout(3, 10).unwrap();
        let l311 = layout(3, 11).unwrap();
        let l313 = layout(3, 13).unwrap();
        // f_lasti is a C int: the upper half of the word read is not part of it.
        assert_eq!(
            instruction_offset((3, 9), 0xdead_beef_0000_0010, 0, &l39),
            Some(16)
        );
        assert_eq!(instruction_offset((3, 9), 0xffff_ffff, 0, &l39), None);
        assert_eq!(
            instruction_offset((3, 10), 0x1234_0000_0010, 0, &l310),
            Some(32)
        );
        assert_eq!(
            instruction_offset((3, 10), 0x0000_0000_ffff_ffff, 0, &l310),
            None
        );
        let code = 0x7f00_0000_1000_u64;
        let first = code + 184;
        assert_eq!(instruction_offset((3, 11), first + 6, code, &l311), Some(6));
        // A frame that has not started points one code unit before the first.
        assert_eq!(instruction_offset((3, 11), first - 2, code, &l311), None);
        assert_eq!(
            instruction_offset((3, 13), code + 200, code, &l313),
            Some(0)
        );
        assert_eq!(instruction_offset((3, 8), 0, 0, &l39), None);
        let mut no_adaptive = l313;
        no_adaptive.code_adaptive = None;
        assert_eq!(
            instruction_offset((3, 13), code + 200, code, &no_adaptive),
            None
        );
    }
}
