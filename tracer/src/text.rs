//! Text that came from the target (probe, process, thread and file names), made safe to
//! print: every output and every frame name goes through here.

use std::{borrow::Cow, fmt::Write as _};

/// `name`, which comes from the target (a probe, process or thread name, a path), as text
/// output shows it: control characters escaped (`\x1b`, `\x0a` for a newline, `\u{9b}`), so a name can
/// neither drive the terminal (move the cursor, clear the screen, change colours) nor
/// forge a line of output. JSON output escapes them its own way.
pub fn escape_text(name: &str) -> Cow<'_, str> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
