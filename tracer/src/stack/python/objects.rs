//! CPython `str` and `bytes` objects, decoded from the bytes read at an object's start.
//!
//! The names of code objects and files are `str` objects, and line tables are `bytes`
//! objects.
//! The decoders take bytes read from another process, so they check every length against
//! what was read and never trust a field beyond that.

use super::layout::Layout;

/// The `kind` of a `str` whose characters take one byte each (Latin-1).
const KIND_1BYTE: u8 = 1;
/// The `kind` of a `str` whose characters take two bytes each (UCS-2).
const KIND_2BYTE: u8 = 2;
/// The `kind` of a `str` whose characters take four bytes each (UCS-4).
const KIND_4BYTE: u8 = 4;

/// What a compact `str` header says: where its characters start, how many there are, and
/// how many bytes each takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UnicodeHeader {
    data: usize,
    length: usize,
    kind: u8,
}

impl UnicodeHeader {
    fn data_len(self) -> Option<usize> {
        self.length.checked_mul(usize::from(self.kind))
    }
}

fn read_u32(bytes: &[u8], at: u64) -> Option<u32> {
    let at = usize::try_from(at).ok()?;
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(field.try_into().ok()?))
}

fn read_i64(bytes: &[u8], at: u64) -> Option<i64> {
    let at = usize::try_from(at).ok()?;
    let field = bytes.get(at..at.checked_add(8)?)?;
    Some(i64::from_le_bytes(field.try_into().ok()?))
}

/// The header of a compact `str`, or `None` for a string that is not compact (its
/// characters live in a separate buffer) or a header that makes no sense.
fn unicode_header(layout: &Layout, header: &[u8]) -> Option<UnicodeHeader> {
    let state = read_u32(header, layout.unicode_state)?;
    // `state`: interned in bits 0-1, kind in bits 2-4, compact in bit 5, ascii in bit 6.
    let kind = u8::try_from((state >> 2) & 0x7).ok()?;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact {
        return None;
    }
    let length = usize::try_from(read_i64(header, layout.unicode_length)?).ok()?;
    let data = match (ascii, kind) {
        (true, KIND_1BYTE) => layout.ascii_data,
        (false, KIND_1BYTE | KIND_2BYTE | KIND_4BYTE) => layout.compact_data,
        _ => return None,
    };
    Some(UnicodeHeader {
        data: usize::try_from(data).ok()?,
        length,
        kind,
    })
}

/// Where the characters of a `str` object start, from the object's start, given at least
/// its header ([`Layout::compact_data`] bytes).
///
/// The result is `None` for a string that is not compact (whose characters are not
/// stored inline) and for a header that makes no sense.
pub(crate) fn unicode_data_offset(layout: &Layout, header: &[u8]) -> Option<usize> {
    Some(unicode_header(layout, header)?.data)
}

/// How many bytes the characters of a `str` object take, given at least its header
/// ([`Layout::compact_data`] bytes).
///
/// The result is `None` for a string that is not compact (whose characters are not
/// stored inline) and for a header that makes no sense.
pub(crate) fn unicode_data_len(layout: &Layout, header: &[u8]) -> Option<usize> {
    unicode_header(layout, header)?.data_len()
}

/// How many bytes from the start of a `str` object hold its header and all its
/// characters, given at least its header ([`Layout::compact_data`] bytes).
///
/// It is [`unicode_data_offset`] plus [`unicode_data_len`].
#[cfg(test)]
pub(crate) fn unicode_size(layout: &Layout, header: &[u8]) -> Option<usize> {
    let header = unicode_header(layout, header)?;
    header.data.checked_add(header.data_len()?)
}

/// The text of a compact `str` object, given bytes read from the object's start (header
/// and characters).
///
/// It handles compact ASCII strings and compact strings of kind 1 (Latin-1), 2 (UCS-2)
/// and 4 (UCS-4).
/// The result is `None` for a string that is not compact and for a header that makes no
/// sense.
/// When `header_and_data` ends before the last character, the result holds the whole
/// characters it covers ([`unicode_size`] tells how many bytes all of them take).
/// A code point that is no Unicode scalar value (a lone surrogate, which a Python string
/// may hold) becomes U+FFFD.
pub(crate) fn decode_unicode(layout: &Layout, header_and_data: &[u8]) -> Option<String> {
    let header = unicode_header(layout, header_and_data)?;
    let data = header_and_data.get(header.data..)?;
    let data = &data[..data.len().min(header.data_len()?)];
    let text = match header.kind {
        KIND_1BYTE => data.iter().copied().map(char::from).collect(),
        KIND_2BYTE => data
            .as_chunks::<2>()
            .0
            .iter()
            .map(|unit| u32::from(u16::from_le_bytes(*unit)))
            .map(|point| char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => data
            .as_chunks::<4>()
            .0
            .iter()
            .map(|unit| u32::from_le_bytes(*unit))
            .map(|point| char::from_u32(point).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
    };
    Some(text)
}

/// The length of a `bytes` object (its `ob_size`), given at least its header
/// ([`Layout::bytes_data`] bytes).
///
/// The result is `None` when `header` is too short or the length is negative.
pub(crate) fn bytes_len(layout: &Layout, header: &[u8]) -> Option<usize> {
    usize::try_from(read_i64(header, layout.bytes_size)?).ok()
}

/// The contents of a `bytes` object, given bytes read from the object's start (header and
/// contents).
///
/// The result is `None` when `header_and_data` ends before the last byte of the contents.
#[cfg(test)]
pub(crate) fn bytes_data<'a>(layout: &Layout, header_and_data: &'a [u8]) -> Option<&'a [u8]> {
    let len = bytes_len(layout, header_and_data)?;
    let start = usize::try_from(layout.bytes_data).ok()?;
    header_and_data.get(start..start.checked_add(len)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::python::layout::layout;

    /// Objects dumped from a live interpreter: a `# python X.Y.Z` line, then one line per
    /// object with its type, its value (the UTF-8 of a `str`) in hex (`-` when empty), and the
    /// bytes from the object's start in hex.
    /// The type is `bytes`, `str` for a string of nothing but header and characters, or
    /// `str+` for a string that may also hold more (such as a UTF-8 copy) after its
    /// characters.
    fn check_fixture(text: &str) {
        let mut lines = text.lines();
        let version = lines.next().unwrap().strip_prefix("# python ").unwrap();
        let mut parts = version.split('.').map(|part| part.parse::<u8>().unwrap());
        let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
        let layout = layout(major, minor).unwrap();
        let hex = |text: &str| -> Vec<u8> {
            let text = if text == "-" { "" } else { text };
            (0..text.len())
                .step_by(2)
                .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
                .collect()
        };
        let mut checked = 0;
        for line in lines {
            let fields: Vec<&str> = line.split(' ').collect();
            let value = hex(fields[1]);
            let object = hex(fields[2]);
            match fields[0] {
                kind @ ("str" | "str+") => {
                    let expected = String::from_utf8(value).unwrap();
                    let size = unicode_size(&layout, &object).unwrap();
                    if kind == "str" {
                        assert_eq!(size, object.len(), "{line}");
                    } else {
                        assert!(size <= object.len(), "{line}");
                    }
                    let data_at = unicode_data_offset(&layout, &object).unwrap();
                    let data_len = unicode_data_len(&layout, &object).unwrap();
                    assert_eq!(data_at + data_len, size);
                    assert_eq!(decode_unicode(&layout, &object), Some(expected.clone()));
                    // Cut short, the result holds whole characters only.
                    let count = expected.chars().count();
                    if let Some(width) = data_len.checked_div(count) {
                        let mut shorter = expected;
                        shorter.pop();
                        let cut = &object[..size - 1];
                        assert_eq!(decode_unicode(&layout, cut), Some(shorter.clone()));
                        let cut = &object[..size - width];
                        assert_eq!(decode_unicode(&layout, cut), Some(shorter));
                    }
                    assert_eq!(
                        decode_unicode(&layout, &object[..data_at]).as_deref(),
                        Some("")
                    );
                }
                "bytes" => {
                    assert_eq!(bytes_len(&layout, &object), Some(value.len()), "{line}");
                    assert_eq!(bytes_data(&layout, &object), Some(value.as_slice()));
                    assert_eq!(bytes_data(&layout, &object[..object.len() - 1]), None);
                }
                other => panic!("unknown object type {other}"),
            }
            checked += 1;
        }
        assert!(checked >= 10);
    }

    #[test]
    fn objects_of_3_9() {
        check_fixture(include_str!("testdata/objects_3.9.txt"));
    }

    #[test]
    fn objects_of_3_10() {
        check_fixture(include_str!("testdata/objects_3.10.txt"));
    }

    #[test]
    fn objects_of_3_11() {
        check_fixture(include_str!("testdata/objects_3.11.txt"));
    }

    #[test]
    fn objects_of_3_12() {
        check_fixture(include_str!("testdata/objects_3.12.txt"));
    }

    #[test]
    fn objects_of_3_13() {
        check_fixture(include_str!("testdata/objects_3.13.txt"));
    }

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        let layout = layout(3, 12).unwrap();
        let mut object = vec![0_u8; 56];
        object[16..24].copy_from_slice(&2_i64.to_le_bytes());
        // Kind 2, compact, not ASCII.
        object[32..36].copy_from_slice(&((2 << 2) | (1 << 5) as u32).to_le_bytes());
        object.extend_from_slice(&[0x00, 0xd8, 0x41, 0x00]);
        assert_eq!(
            decode_unicode(&layout, &object).as_deref(),
            Some("\u{fffd}A")
        );
    }

    #[test]
    fn strings_that_are_not_compact_or_make_no_sense_are_refused() {
        let layout = layout(3, 12).unwrap();
        let mut object = vec![0_u8; 64];
        object[16..24].copy_from_slice(&1_i64.to_le_bytes());
        // Kind 1, not compact.
        object[32..36].copy_from_slice(&(1_u32 << 2).to_le_bytes());
        assert_eq!(decode_unicode(&layout, &object), None);
        // Kind 3 does not exist.
        object[32..36].copy_from_slice(&((3 << 2) | (1 << 5) as u32).to_le_bytes());
        assert_eq!(decode_unicode(&layout, &object), None);
        // ASCII must be kind 1.
        object[32..36].copy_from_slice(&((2 << 2) | (1 << 5) | (1 << 6) as u32).to_le_bytes());
        assert_eq!(decode_unicode(&layout, &object), None);
        // A negative length.
        object[32..36].copy_from_slice(&((1 << 2) | (1 << 5) | (1 << 6) as u32).to_le_bytes());
        object[16..24].copy_from_slice(&(-1_i64).to_le_bytes());
        assert_eq!(decode_unicode(&layout, &object), None);
        assert_eq!(unicode_size(&layout, &object), None);
        // A header cut short.
        assert_eq!(decode_unicode(&layout, &object[..20]), None);
        assert_eq!(bytes_len(&layout, &object), None);
    }
}
