//! Probe name patterns (`python:gc__*`) and bpftrace-style `usdt:PATH:PROVIDER:NAME`
//! specifiers.

use std::fmt;
use std::str::FromStr;

use super::UsdtError;

/// A shell-style wildcard pattern: `*` matches any run of characters (including none),
/// `?` exactly one; everything else matches itself, case-sensitively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
}

impl Glob {
    /// A glob from its text; every string is a valid glob.
    pub fn new(pattern: &str) -> Self {
        Glob {
            pattern: pattern.to_owned(),
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
        !self.pattern.contains(['*', '?'])
    }

    /// Whether `text` matches the whole glob.
    pub fn matches(&self, text: &str) -> bool {
        // Greedy scan that, on a mismatch, backtracks to the most recent `*` and lets it
        // swallow one more character: linear space, no recursion, and worst case
        // O(len(pattern) * len(text)) instead of exponential.
        let pat: Vec<char> = self.pattern.chars().collect();
        let txt: Vec<char> = text.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < txt.len() {
            if p < pat.len() && (pat[p] == '?' || (pat[p] != '*' && pat[p] == txt[t])) {
                p += 1;
                t += 1;
            } else if p < pat.len() && pat[p] == '*' {
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
        pat[p..].iter().all(|&c| c == '*')
    }
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
    type Err = UsdtError;

    fn from_str(s: &str) -> Result<Self, UsdtError> {
        let bad = |reason: &str| UsdtError::BadSpecifier {
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

/// A bpftrace-style probe specifier: which file(s) and which probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtSpecifier {
    /// The binary or library; may contain wildcards or be `*` (every object of the
    /// target process). `None` when left empty (`usdt::gc__start`), which only makes
    /// sense together with a PID.
    pub path: Option<String>,
    /// Which probes in the file(s).
    pub pattern: ProbePattern,
}

/// Parses `usdt:PATH:PROVIDER:NAME` or `usdt:PATH:NAME` (any provider); `U:` is accepted
/// for `usdt:` as in bpftrace. Fields are split from the right, so a path may itself
/// contain colons when the provider is given.
pub fn parse_specifier(spec: &str) -> Result<UsdtSpecifier, UsdtError> {
    let bad = |reason: &str| UsdtError::BadSpecifier {
        spec: spec.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = spec.trim();
    let rest = trimmed
        .strip_prefix("usdt:")
        .or_else(|| trimmed.strip_prefix("U:"))
        .ok_or_else(|| bad("expected usdt:PATH:[PROVIDER:]NAME"))?;
    let fields: Vec<&str> = rest.rsplitn(3, ':').collect();
    let (path, provider, name) = match fields[..] {
        [name, provider, path] => (path, provider, name),
        [name, path] => (path, "*", name),
        _ => return Err(bad("expected usdt:PATH:[PROVIDER:]NAME")),
    };
    if name.is_empty() {
        return Err(bad("missing probe name"));
    }
    Ok(UsdtSpecifier {
        path: (!path.is_empty()).then(|| path.to_owned()),
        pattern: ProbePattern::new(if provider.is_empty() { "*" } else { provider }, name),
    })
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
            assert!(matches!(e, UsdtError::BadSpecifier { .. }), "{bad}: {e}");
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
            "uprobe:/bin/x:f",
            "python:gc__start",
        ] {
            let e = parse_specifier(bad).unwrap_err();
            assert!(
                e.to_string().starts_with("bad probe specifier"),
                "{bad}: {e}"
            );
        }
    }
}
