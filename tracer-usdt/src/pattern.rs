//! Probe name patterns (`python:gc__*`) and bpftrace-style specifiers:
//! `usdt:PATH:PROVIDER:NAME`, and functions as `uprobe:PATH:FUNC[+OFFSET]`,
//! `uprobe:PATH:0xADDR` and `uretprobe:PATH:FUNC`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::Error;

/// A shell-style wildcard pattern: `*` matches any run of characters (including none),
/// `?` exactly one, `[abc]`, `[a-z]` one of those (`[!a-z]` or `[^a-z]` one not among
/// them; a `[` without its `]` is itself); everything else matches itself,
/// case-sensitively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
    tokens: Vec<Token>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Star,
    One,
    Char(char),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Token {
    /// Whether this token, not a `*`, matches the character `c`.
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Star => false,
            Token::One => true,
            Token::Char(x) => *x == c,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
        }
    }
}

fn tokenize(pattern: &str) -> Vec<Token> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => tokens.push(Token::Star),
            '?' => tokens.push(Token::One),
            '[' => {
                if let Some((class, next)) = class_at(&chars, i) {
                    tokens.push(class);
                    i = next;
                    continue;
                }
                tokens.push(Token::Char('['));
            }
            c => tokens.push(Token::Char(c)),
        }
        i += 1;
    }
    tokens
}

/// The class starting with the `[` at `start`, and the index after its `]`; `None` when
/// it is not closed. A `]` right after the `[` (or its `!`) is a member, as in glob(3).
fn class_at(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let first = i;
    let mut ranges = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if c == ']' && i > first {
            return Some((Token::Class { negated, ranges }, i + 1));
        }
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&hi| hi != ']') {
            ranges.push((c, chars[i + 2]));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
    None
}

impl Glob {
    /// A glob from its text; every string is a valid glob.
    pub fn new(pattern: &str) -> Self {
        Glob {
            pattern: pattern.to_owned(),
            tokens: tokenize(pattern),
        }
    }

    /// The glob that matches everything.
    pub fn any() -> Self {
        Glob::new("*")
    }

    /// The pattern text as given.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the glob has no wildcards, i.e. names exactly one thing; lets callers
    /// report "probe X not found" rather than "nothing matched".
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Char(_)))
    }

    /// Whether `text` matches the whole glob.
    pub fn matches(&self, text: &str) -> bool {
        // Greedy scan that, on a mismatch, backtracks to the most recent `*` and lets it
        // swallow one more character: linear space, no recursion, and worst case
        // O(len(pattern) * len(text)) instead of exponential.
        let pat = &self.tokens;
        let txt: Vec<char> = text.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < txt.len() {
            if p < pat.len() && pat[p].matches(txt[t]) {
                p += 1;
                t += 1;
            } else if p < pat.len() && pat[p] == Token::Star {
                star = Some((p, t));
                p += 1;
            } else if let Some((star_p, star_t)) = star {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            } else {
                return false;
            }
        }
        pat[p..].iter().all(|t| *t == Token::Star)
    }
}

/// The existing paths a path pattern names, as glob(3) finds them: a component with
/// wildcards is matched against the entries of each directory reached so far (a
/// wildcard does not match a leading dot unless the component starts with one, as in the
/// shell); other components are taken as they are. Relative patterns stay relative (to
/// the current directory). Sorted within each directory; unreadable directories and
/// names that are not UTF-8 are passed over.
pub fn glob_paths(pattern: &str) -> Vec<PathBuf> {
    let root = if pattern.starts_with('/') { "/" } else { "" };
    let mut reached = vec![PathBuf::from(root)];
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        let glob = Glob::new(component);
        let mut next = Vec::new();
        for dir in &reached {
            if glob.is_literal() {
                next.push(dir.join(component));
                continue;
            }
            let listed = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            let Ok(entries) = std::fs::read_dir(listed) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .filter(|name| glob.matches(name))
                .filter(|name| component.starts_with('.') || !name.starts_with('.'))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|name| dir.join(name)));
        }
        reached = next;
    }
    reached.retain(|path| !path.as_os_str().is_empty() && path.exists());
    reached
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)
    }
}

/// Which probes to select: a glob on the provider and one on the probe name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePattern {
    /// Matched against the note's provider.
    pub provider: Glob,
    /// Matched against the note's probe name.
    pub name: Glob,
}

impl ProbePattern {
    /// A pattern from the two globs.
    pub fn new(provider: &str, name: &str) -> Self {
        ProbePattern {
            provider: Glob::new(provider),
            name: Glob::new(name),
        }
    }

    /// The pattern that selects every probe (`*:*`), for listing.
    pub fn any() -> Self {
        ProbePattern::new("*", "*")
    }

    /// Whether the probe `provider:name` is selected.
    pub fn matches(&self, provider: &str, name: &str) -> bool {
        self.provider.matches(provider) && self.name.matches(name)
    }
}

impl fmt::Display for ProbePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.provider, self.name)
    }
}

/// Parses `PROVIDER:NAME`, or a bare `NAME` meaning any provider (as bpftrace's
/// `usdt:PATH:NAME` does). An empty provider also means any.
impl FromStr for ProbePattern {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::BadSpecifier {
            spec: s.to_owned(),
            reason: reason.to_owned(),
        };
        let s = s.trim();
        let (provider, name) = match s.split_once(':') {
            Some((provider, name)) => (provider, name),
            None => ("", s),
        };
        if name.contains(':') {
            return Err(bad("expected PROVIDER:NAME"));
        }
        if name.is_empty() {
            return Err(bad("missing probe name"));
        }
        let provider = if provider.is_empty() { "*" } else { provider };
        Ok(ProbePattern::new(provider, name))
    }
}

/// What fires: a USDT probe's site, a function's entry (or an instruction in it), or a
/// function's return.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeKind {
    #[default]
    Usdt,
    Uprobe,
    Uretprobe,
}

impl ProbeKind {
    /// bpftrace's name for the probe type.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Usdt => "usdt",
            ProbeKind::Uprobe => "uprobe",
            ProbeKind::Uretprobe => "uretprobe",
        }
    }

    /// Whether this is a function probe (`uprobe` or `uretprobe`).
    pub fn is_function(self) -> bool {
        self != ProbeKind::Usdt
    }
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in a function a function probe goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FunctionPlace {
    /// This many bytes past the start of each function the name matches (0: its entry).
    #[default]
    Entry,
    Offset(u64),
    /// A link-time address in the file (`uprobe:PATH:0xADDR`).
    Address(u64),
}

/// A bpftrace-style probe specifier: which file(s) and which probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtSpecifier {
    pub kind: ProbeKind,
    /// The binary or library; may contain wildcards or be `*` (every object of the
    /// target process). `None` when left empty (`usdt::gc__start`), which only makes
    /// sense together with a PID.
    pub path: Option<String>,
    /// Which probes in the file(s); for a function probe, the provider is empty and the
    /// name matches the function's symbol, mangled or demangled.
    pub pattern: ProbePattern,
    /// For a function probe, where in the function.
    pub place: FunctionPlace,
}

impl UsdtSpecifier {
    /// The specifier as bpftrace writes it.
    pub fn describe(&self) -> String {
        let path = self.path.as_deref().unwrap_or("");
        match self.kind {
            ProbeKind::Usdt => format!("usdt:{path}:{}", self.pattern),
            kind => format!("{kind}:{path}:{}", self.pattern.name),
        }
    }
}

/// Parses `uprobe:PATH:FUNC[+OFFSET]`, `uprobe:PATH:0xADDR` and `uretprobe:PATH:FUNC`
/// (the fields after the type, joined by colons: the path, then the function, whose
/// C++ or Rust name may hold colons of its own, as `gc_demo::gc_mark`).
fn parse_function_specifier(
    spec: &str,
    kind: ProbeKind,
    fields: Vec<String>,
) -> Result<UsdtSpecifier, Error> {
    let bad = |reason: String| Error::BadSpecifier {
        spec: spec.to_owned(),
        reason,
    };
    let expected = format!("expected {kind}:PATH:FUNCTION");
    let (path, function) = match fields.as_slice() {
        [path, rest @ ..] if !rest.is_empty() => (path.clone(), rest.join(":")),
        _ => return Err(bad(expected)),
    };
    if path.is_empty() {
        return Err(bad(format!(
            "{expected}: a function probe needs the file that holds the function"
        )));
    }
    if function.is_empty() {
        return Err(bad("missing function name".into()));
    }
    let number = |text: &str| match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse::<u64>().ok(),
    };
    let (name, place) = if function.starts_with("0x") || function.starts_with("0X") {
        let address =
            number(&function).ok_or_else(|| bad(format!("\"{function}\" is not an address")))?;
        (function.clone(), FunctionPlace::Address(address))
    } else {
        match function.rsplit_once('+') {
            Some((name, offset)) if !name.is_empty() && !offset.is_empty() => {
                let offset =
                    number(offset).ok_or_else(|| bad(format!("\"{offset}\" is not an offset")))?;
                let place = match offset {
                    0 => FunctionPlace::Entry,
                    n => FunctionPlace::Offset(n),
                };
                (name.to_owned(), place)
            }
            _ => (function.clone(), FunctionPlace::Entry),
        }
    };
    if kind == ProbeKind::Uretprobe && place != FunctionPlace::Entry {
        return Err(bad(
            "a return probe goes on a function, not an offset or address: it finds the \
             return address where the function's entry left it"
                .into(),
        ));
    }
    Ok(UsdtSpecifier {
        kind,
        path: Some(path),
        pattern: ProbePattern::new("", &name),
        place,
    })
}

/// The function probe type a specifier's first field names, bpftrace's way.
fn function_kind(field: &str) -> Option<ProbeKind> {
    match field {
        "uprobe" | "u" => Some(ProbeKind::Uprobe),
        "uretprobe" | "ur" => Some(ProbeKind::Uretprobe),
        _ => None,
    }
}

/// Parses a specifier as bpftrace does: `usdt:PATH:PROVIDER:NAME`, `usdt:PATH:NAME` (any
/// provider) or `usdt:NAME` (no path: every object of the process, so only with a PID or
/// a command). `U` is accepted for `usdt`, and so is a probe type with wildcards that
/// matches it (`*:PATH:*`, which bpftrace's listing accepts). Fields are split at colons
/// outside double quotes; within quotes a backslash takes the next character as it is, so
/// `test:"\"probe1\""` names the probe `"probe1"` and `"/a:b/bin"` is one path. Quotes do
/// not make wildcards literal (bpftrace's do not either). More than four fields: the
/// leading ones are the path, colons included.
pub fn parse_specifier(spec: &str) -> Result<UsdtSpecifier, Error> {
    let bad = |reason: &str| Error::BadSpecifier {
        spec: spec.to_owned(),
        reason: reason.to_owned(),
    };
    let expected = "expected usdt:PATH:[PROVIDER:]NAME";
    let mut fields = split_fields(spec.trim()).map_err(|reason| bad(&reason))?;
    if fields.len() < 2 {
        return Err(bad(expected));
    }
    let probe_type = fields.remove(0);
    if let Some(kind) = function_kind(&probe_type) {
        return parse_function_specifier(spec, kind, fields);
    }
    if !is_usdt_type(&probe_type) {
        if Glob::new(&probe_type).is_literal() {
            return Err(bad(
                "expected usdt:PATH:[PROVIDER:]NAME, uprobe:PATH:FUNCTION or \
                 uretprobe:PATH:FUNCTION",
            ));
        }
        return Err(bad(&format!(
            "probe type \"{probe_type}\" does not match usdt; wildcards in the probe type \
             select USDT probes only"
        )));
    }
    let (path, provider, name) = match fields.len() {
        1 => (String::new(), String::new(), fields.remove(0)),
        2 => {
            let name = fields.pop().unwrap_or_default();
            (fields.remove(0), String::new(), name)
        }
        _ => {
            let name = fields.pop().unwrap_or_default();
            let provider = fields.pop().unwrap_or_default();
            (fields.join(":"), provider, name)
        }
    };
    if name.is_empty() {
        // `usdt:` names nothing at all; `usdt:/bin/x:` a file and no probe.
        return Err(bad(match path.is_empty() && provider.is_empty() {
            true => expected,
            false => "missing probe name",
        }));
    }
    // `usdt:/usr/bin/app` is a file without a probe, not a probe named like a path.
    if path.is_empty() && provider.is_empty() && name.contains('/') {
        return Err(bad(&format!("{expected} (a path needs a probe after it)")));
    }
    Ok(UsdtSpecifier {
        kind: ProbeKind::Usdt,
        path: (!path.is_empty()).then_some(path),
        pattern: ProbePattern::new(if provider.is_empty() { "*" } else { &provider }, &name),
        place: FunctionPlace::Entry,
    })
}

/// Whether a specifier's first field selects USDT probes: `usdt`, its alias `U`, or a
/// wildcard matching `usdt`.
fn is_usdt_type(field: &str) -> bool {
    field == "usdt"
        || field == "U"
        || (!Glob::new(field).is_literal() && Glob::new(field).matches("usdt"))
}

/// Whether `text` is written as a specifier with its probe type (`usdt:...`, `U:...`,
/// `*:FILE:*`) rather than as a bare file or probe pattern, for `list`, which takes both.
/// A wildcard probe type needs three fields, so `p*:gc__*` stays a provider and a name
/// (a probe pattern has two).
pub fn has_probe_type(text: &str) -> bool {
    let Ok(fields) = split_fields(text.trim()) else {
        // Unbalanced quotes: let the specifier parser say so.
        return text.trim_start().starts_with("usdt:") || text.trim_start().starts_with("U:");
    };
    match fields.first() {
        Some(first) if first == "usdt" || first == "U" => fields.len() > 1,
        Some(first) if function_kind(first).is_some() => fields.len() > 1,
        // One that does not match usdt too, for the parser to say so.
        Some(first) => fields.len() > 2 && !Glob::new(first).is_literal(),
        None => false,
    }
}

/// Splits at colons outside double quotes, dropping the quotes and the backslashes that
/// escape a character within them.
fn split_fields(text: &str) -> Result<Vec<String>, String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => match chars.next() {
                Some(next) => fields.last_mut().unwrap().push(next),
                None => return Err("unterminated quote".into()),
            },
            ':' if !quoted => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(p: &str, t: &str) -> bool {
        Glob::new(p).matches(t)
    }

    #[test]
    fn glob_matching() {
        assert!(glob("gc__start", "gc__start"));
        assert!(!glob("gc__start", "gc__star"));
        assert!(!glob("gc__start", "gc__startx"));
        assert!(glob("*", ""));
        assert!(glob("*", "anything"));
        assert!(glob("gc__*", "gc__begin"));
        assert!(glob("gc__*", "gc__"));
        assert!(!glob("gc__*", "gc_"));
        assert!(glob("*__end", "gc__mark__end"));
        assert!(glob("gc*end", "gc__mark__end"));
        assert!(glob("*mark*", "gc__mark__begin"));
        assert!(!glob("*mark*", "gc__sweep__begin"));
        assert!(glob("gc__?ark*", "gc__mark__end"));
        assert!(!glob("?", ""));
        assert!(glob("??", "ab"));
        assert!(!glob("??", "abc"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
        assert!(glob("**", ""));
        assert!(glob("*a", "aaaa"));
        assert!(!glob("", "a"));
        assert!(glob("", ""));
        assert!(!glob("Gc", "gc"), "case-sensitive");
        assert!(glob("é*", "ééé"), "works on characters, not bytes");
        // Pathological for naive backtracking; must finish quickly.
        let text = "a".repeat(200);
        assert!(!glob(&format!("{}b", "*a".repeat(30)), &text));
    }

    #[test]
    fn glob_literal() {
        assert!(Glob::new("gc__start").is_literal());
        assert!(!Glob::new("gc__*").is_literal());
        assert!(!Glob::new("gc__?tart").is_literal());
    }

    #[test]
    fn probe_patterns() {
        let p: ProbePattern = "python:gc__*".parse().unwrap();
        assert!(p.matches("python", "gc__start"));
        assert!(!p.matches("pythonx", "gc__start"));
        assert!(!p.matches("python", "function__entry"));
        assert_eq!(p.to_string(), "python:gc__*");

        let p: ProbePattern = "gc__begin".parse().unwrap();
        assert_eq!(p, ProbePattern::new("*", "gc__begin"));
        assert!(p.matches("hotspot", "gc__begin"));
        assert!(p.matches("julia", "gc__begin"));

        let p: ProbePattern = "*:*".parse().unwrap();
        assert_eq!(p, ProbePattern::any());
        let p: ProbePattern = ":gc__end".parse().unwrap();
        assert_eq!(p, ProbePattern::new("*", "gc__end"));
        let p: ProbePattern = "j?lia:rt__*__task".parse().unwrap();
        assert!(p.matches("julia", "rt__run__task"));
        assert!(p.matches("julia", "rt__new__task"));
        assert!(!p.matches("julia", "rt__taskq__get"));

        for bad in ["", "python:", "a:b:c", "  "] {
            let e = bad.parse::<ProbePattern>().unwrap_err();
            assert!(matches!(e, Error::BadSpecifier { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn specifiers() {
        let s = parse_specifier("usdt:/usr/bin/python3.11:python:gc__start").unwrap();
        assert_eq!(s.path.as_deref(), Some("/usr/bin/python3.11"));
        assert_eq!(s.pattern, ProbePattern::new("python", "gc__start"));

        let s = parse_specifier("usdt:/usr/lib/jvm/libjvm.so:gc__begin").unwrap();
        assert_eq!(s.path.as_deref(), Some("/usr/lib/jvm/libjvm.so"));
        assert_eq!(s.pattern, ProbePattern::new("*", "gc__begin"));

        let s = parse_specifier("U:*:julia:gc__*").unwrap();
        assert_eq!(s.path.as_deref(), Some("*"));
        assert_eq!(s.pattern, ProbePattern::new("julia", "gc__*"));

        let s = parse_specifier("usdt::hotspot:gc__end").unwrap();
        assert_eq!(s.path, None);
        assert_eq!(s.pattern, ProbePattern::new("hotspot", "gc__end"));

        let s = parse_specifier("usdt:/opt/lib*/libjulia-internal.so*::gc__end").unwrap();
        assert_eq!(s.path.as_deref(), Some("/opt/lib*/libjulia-internal.so*"));
        assert_eq!(s.pattern, ProbePattern::new("*", "gc__end"));

        // A colon in the path is fine when the provider is given.
        let s = parse_specifier("usdt:/weird:dir/bin:p:n").unwrap();
        assert_eq!(s.path.as_deref(), Some("/weird:dir/bin"));
        assert_eq!(s.pattern, ProbePattern::new("p", "n"));

        for bad in [
            "",
            "usdt",
            "usdt:",
            "usdt:/bin/x",
            "usdt:/bin/x:",
            "usdt:/bin/x:p:",
            "kprobe:/bin/x:f",
            "python:gc__start",
        ] {
            let e = parse_specifier(bad).unwrap_err();
            assert!(
                e.to_string().starts_with("bad probe specifier"),
                "{bad}: {e}"
            );
        }
    }

    /// bpftrace's forms beyond `usdt:PATH:[PROVIDER:]NAME`: no path, a wildcard probe
    /// type, quoted fields with escapes.
    #[test]
    fn specifiers_as_bpftrace_writes_them() {
        let parsed = |s: &str| {
            let spec = parse_specifier(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            (
                spec.path,
                spec.pattern.provider.to_string(),
                spec.pattern.name.to_string(),
            )
        };
        let some = |p: &str| Some(p.to_string());
        let owned = |path: Option<String>, provider: &str, name: &str| {
            (path, provider.to_string(), name.to_string())
        };
        // One field: every object of the process (`-p PID 'usdt:*'`).
        assert_eq!(parsed("usdt:*"), owned(None, "*", "*"));
        assert_eq!(parsed("usdt:fired"), owned(None, "*", "fired"));
        assert_eq!(parsed("U:gc__*"), owned(None, "*", "gc__*"));
        // Wildcard probe types that match usdt.
        assert_eq!(parsed("*:./bin/app:*"), owned(some("./bin/app"), "*", "*"));
        assert_eq!(
            parsed("u*:./bin/app:p:n"),
            owned(some("./bin/app"), "p", "n")
        );
        assert_eq!(parsed("us?t:/x:n"), owned(some("/x"), "*", "n"));
        // Quotes: kept out of the field, a backslash within them takes the next
        // character as it is, colons within them split nothing.
        assert_eq!(
            parsed(r#"usdt:./testprogs/usdt_quoted_probe:test:"\"probe1\"""#),
            owned(some("./testprogs/usdt_quoted_probe"), "test", "\"probe1\"")
        );
        assert_eq!(parsed(r#"usdt:./app:"\"probe1\"""#).2, "\"probe1\"");
        assert_eq!(
            parsed(r#"usdt:"/weird:dir/bin":n"#),
            owned(some("/weird:dir/bin"), "*", "n")
        );
        assert_eq!(
            parsed(r#"usdt:/x:"p":"a\\b\:c""#),
            owned(some("/x"), "p", r"a\b:c")
        );
        assert_eq!(parsed(r#"usdt:/x:p"ro"v:n"#).1, "prov", "quotes mid-field");
        // Outside quotes a backslash is an ordinary character, as in bpftrace.
        assert_eq!(parsed(r"usdt:/x:p:a\b").2, r"a\b");
        // Quoted wildcards are still wildcards (bpftrace's too).
        assert!(
            !parse_specifier(r#"usdt:/x:p:"gc*""#)
                .unwrap()
                .pattern
                .name
                .is_literal()
        );

        let reason = |s: &str| parse_specifier(s).unwrap_err().to_string();
        assert_eq!(
            reason("k*:/bin/x:f"),
            "bad probe specifier \"k*:/bin/x:f\": probe type \"k*\" does not match usdt; \
             wildcards in the probe type select USDT probes only"
        );
        assert!(reason(r#"usdt:/x:p:"n"#).ends_with("unterminated quote"));
        assert!(reason(r#"usdt:/x:p:"n\"#).ends_with("unterminated quote"));
        assert!(reason("usdt:/bin/x").contains("a path needs a probe after it"));
        assert!(reason(r#"usdt:/x:p:"""#).ends_with("missing probe name"));
        assert!(reason("usdt:").ends_with("expected usdt:PATH:[PROVIDER:]NAME"));
    }

    #[test]
    fn function_specifiers() {
        let parsed = |s: &str| parse_specifier(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let s = parsed("uprobe:/usr/lib/libpython3.12.so.1.0:gc_collect_main");
        assert_eq!(s.kind, ProbeKind::Uprobe);
        assert_eq!(s.path.as_deref(), Some("/usr/lib/libpython3.12.so.1.0"));
        assert_eq!(s.pattern, ProbePattern::new("", "gc_collect_main"));
        assert_eq!(s.place, FunctionPlace::Entry);
        assert_eq!(
            s.describe(),
            "uprobe:/usr/lib/libpython3.12.so.1.0:gc_collect_main"
        );
        // Colons of a C++ or Rust name are the function's.
        let s = parsed("uretprobe:./gc-demo:gc_demo::gc_mark");
        assert_eq!(s.kind, ProbeKind::Uretprobe);
        assert_eq!(s.pattern.name.as_str(), "gc_demo::gc_mark");
        let s = parsed("u:node:*Heap::CollectGarbage*");
        assert_eq!(
            (s.kind, s.path.as_deref()),
            (ProbeKind::Uprobe, Some("node"))
        );
        assert_eq!(parsed("ur:/x:f").kind, ProbeKind::Uretprobe);
        assert_eq!(parsed("uprobe:/x:f+16").place, FunctionPlace::Offset(16));
        assert_eq!(parsed("uprobe:/x:f+0x10").place, FunctionPlace::Offset(16));
        assert_eq!(parsed("uprobe:/x:f+0").place, FunctionPlace::Entry);
        assert_eq!(parsed("uprobe:/x:f+0").pattern.name.as_str(), "f");
        assert_eq!(
            parsed("uprobe:/x:0x4b3a10").place,
            FunctionPlace::Address(0x4b3a10)
        );
        // An operator+ is a name, not an offset.
        assert_eq!(
            parsed("uprobe:/x:operator+").pattern.name.as_str(),
            "operator+"
        );

        let reason = |s: &str| parse_specifier(s).unwrap_err().to_string();
        assert!(reason("uretprobe:/x:f+4").contains("a return probe goes on a function"));
        assert!(reason("uretprobe:/x:0x1000").contains("a return probe goes on a function"));
        assert!(reason("uprobe:/x:f+z").ends_with("\"z\" is not an offset"));
        assert!(reason("uprobe:/x:0xzz").ends_with("\"0xzz\" is not an address"));
        assert!(reason("uprobe::f").contains("needs the file that holds the function"));
        assert!(reason("uprobe:/x").contains("expected uprobe:PATH:FUNCTION"));
        assert!(reason("uprobe:/x:").ends_with("missing function name"));
        assert!(has_probe_type("uprobe:/x:f") && has_probe_type("ur:/x:f"));
    }

    #[test]
    fn written_with_a_probe_type_or_not() {
        for yes in [
            "usdt:x",
            "U:x:y",
            "usdt:*",
            "*:./bin/app:*",
            "u*:/x:p:n",
            r#"usdt:"x"#,
            "k*:/x:n",
        ] {
            assert!(has_probe_type(yes), "{yes}");
        }
        // `list` reads these as a file or a PROVIDER:NAME pattern.
        for no in [
            "usdt",
            "./bin/app",
            "python:gc__*",
            "p*:gc__*",
            "*:*",
            "k:/x:n",
        ] {
            assert!(!has_probe_type(no), "{no}");
        }
    }

    #[test]
    fn glob_classes() {
        assert!(glob("app[0-9]", "app2"));
        assert!(!glob("app[0-9]", "appx"));
        assert!(!glob("app[0-9]", "app"));
        assert!(glob("[ab]*", "bx"));
        assert!(!glob("[ab]*", "cx"));
        assert!(glob("x[!0-9]", "xa") && !glob("x[!0-9]", "x1"));
        assert!(glob("x[^0-9]", "xa") && !glob("x[^0-9]", "x1"));
        assert!(glob("[]]", "]"), "a leading ] is a member");
        assert!(glob("[a-]", "-") && glob("[a-]", "a"));
        assert!(glob("lib[*].so", "lib*.so") && !glob("lib[*].so", "libx.so"));
        // An unclosed [ is literal.
        assert!(glob("a[b", "a[b") && !glob("a[b", "ab"));
        assert!(!Glob::new("a[0-9]").is_literal());
        assert!(Glob::new("a[b").is_literal());
        assert!(glob("*[0-9]", "libc.so.6") && !glob("*[0-9]", "libc.so"));
    }

    #[test]
    fn paths_glob_in_the_filesystem() {
        let dir = std::env::temp_dir().join(format!("tracer-glob-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for file in [
            "bin/app",
            "bin/app2",
            "bin/app.c",
            "bin/.hidden",
            "lib/x/libp.so",
        ] {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"").unwrap();
        }
        let root = dir.to_str().unwrap();
        let names = |pattern: &str| -> Vec<String> {
            glob_paths(pattern)
                .iter()
                .map(|p| p.to_string_lossy().replace(root, "D"))
                .collect()
        };
        assert_eq!(
            names(&format!("{root}/bin/app*")),
            ["D/bin/app", "D/bin/app.c", "D/bin/app2"]
        );
        assert_eq!(names(&format!("{root}/bin/app?")), ["D/bin/app2"]);
        assert_eq!(names(&format!("{root}/bin/app[0-9]")), ["D/bin/app2"]);
        assert_eq!(names(&format!("{root}/*/x/lib*")), ["D/lib/x/libp.so"]);
        assert_eq!(
            names(&format!("{root}/b*/../lib/*/libp.so")),
            ["D/bin/../lib/x/libp.so"]
        );
        assert_eq!(names(&format!("{root}//bin/app")), ["D/bin/app"]);
        // Dot files only for a pattern that starts with a dot.
        assert_eq!(names(&format!("{root}/bin/*")).len(), 3);
        assert_eq!(names(&format!("{root}/bin/.h*")), ["D/bin/.hidden"]);
        assert!(names(&format!("{root}/bin/nothing*")).is_empty());
        assert!(names(&format!("{root}/nodir/*")).is_empty());
        assert!(
            names(&format!("{root}/bin/app/*")).is_empty(),
            "a file is no directory"
        );
        // Relative patterns expand from the current directory and stay relative.
        let cwd = std::env::current_dir().unwrap();
        let here: Vec<PathBuf> = glob_paths("./*");
        assert!(!here.is_empty());
        assert!(
            here.iter()
                .all(|p| p.starts_with(".") && cwd.join(p).exists()),
            "{here:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
