//! Text that came from the target (probe, process, thread and file names), made safe to
//! print: every output and every frame name goes through here.

use std::{borrow::Cow, fmt::Write as _};

/// `name`, which comes from the target (a probe, process or thread name, a path), as text
/// output shows it: control characters escaped (`\x1b`, `\x0a` for a newline, `\u{9b}`), so a name can
/// neither drive the terminal (move the cursor, clear the screen, change colours) nor
/// forge a line of output. JSON output escapes them its own way.
pub(crate) fn escape_text(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            c if !c.is_control() => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// A size as the command line takes it: `64 KiB`, `8 MiB`, `1.5 MiB`.
pub(crate) fn binary_size(bytes: u64) -> String {
    let (unit, name) = match bytes < 1 << 20 {
        true => (1u64 << 10, "KiB"),
        false => (1 << 20, "MiB"),
    };
    match bytes % unit {
        0 => format!("{} {name}", bytes / unit),
        _ => format!("{:.1} {name}", bytes as f64 / unit as f64),
    }
}

/// Bytes from the target (a string argument) as text output shows them: in double
/// quotes, with `"` and `\` escaped by a backslash, control characters as in
/// [`escape_text`], and bytes that are not UTF-8 as `\xNN`; so the text inside the quotes
/// says which bytes they were.
pub(crate) fn quote_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                c if c.is_control() => out.push_str(&escape_text(c.encode_utf8(&mut [0; 4]))),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_the_command_line_takes_them() {
        assert_eq!(binary_size(64 << 10), "64 KiB");
        assert_eq!(binary_size(8 << 20), "8 MiB");
        assert_eq!(binary_size(3 << 19), "1.5 MiB");
        assert_eq!(binary_size(1536), "1.5 KiB");
    }

    #[test]
    fn bytes_are_quoted_so_each_can_be_told() {
        assert_eq!(quote_bytes(b"SELECT 1"), r#""SELECT 1""#);
        assert_eq!(quote_bytes(b""), r#""""#);
        assert_eq!(quote_bytes(b"a\"b\\c\n\x1b"), r#""a\"b\\c\x0a\x1b""#);
        // Invalid UTF-8 as its bytes; a literal backslash-x stays distinct.
        assert_eq!(quote_bytes(b"\xff\xfe\\xff"), r#""\xff\xfe\\xff""#);
        assert_eq!(quote_bytes("pâté".as_bytes()), r#""pâté""#);
        // A UTF-8 sequence cut short (a string truncated mid-character).
        assert_eq!(quote_bytes(&"é".as_bytes()[..1]), r#""\xc3""#);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape_text("gc-demo"), Cow::Borrowed("gc-demo")));
        assert!(matches!(escape_text("pâté [k] 🦀"), Cow::Borrowed(_)));
        assert_eq!(escape_text("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(
            escape_text("line\nforged\r\t\x00\x7f"),
            "line\\x0aforged\\x0d\\x09\\x00\\x7f"
        );
        // C1 controls: U+009B is a one-character CSI on some terminals.
        assert_eq!(escape_text("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(escape_text("back\\slash"), "back\\slash");
    }
}
