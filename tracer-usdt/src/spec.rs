//! Decoding x86-64 SDT argument specs (`-4@%edi 8@-16(%rbp)`) into [`UsdtArg`]s.
//!
//! Each argument is `SIZE@LOCATION` (or a bare LOCATION, 8 bytes, in old notes), where
//! LOCATION is an AT&T-syntax operand that the compiler chose for the value at the probe
//! site. The eBPF side reads registers out of `struct pt_regs` and memory at
//! register-relative addresses; a global (`-1@4+t1(%rip)`, what gcc -O2 emits) becomes
//! memory relative to the probe's own address once the object's symbol table gives the
//! symbol's address ([`resolve_globals`]). An argument that cannot be read that way (an
//! SSE register, a segment override, a high-byte register) is unavailable with a reason,
//! rather than a silently wrong value, and the others still decode.

use tracer_common::{MAX_USDT_ARGS, UsdtArg, arg_kind};

use crate::Error;

/// Offset of `rip` in `struct pt_regs`: read directly it is the probe's address, and as
/// a base it takes displacements resolved relative to that address.
const RIP: u8 = 128;

/// General-purpose registers: byte offset of the full register in x86-64
/// `struct pt_regs`, then its 64-, 32-, 16- and 8-bit names. Reading a sub-register is
/// reading the full one and truncating to the argument size, which the SIZE field gives.
const REGISTERS: [(u8, [&str; 4]); 16] = [
    (80, ["rax", "eax", "ax", "al"]),
    (40, ["rbx", "ebx", "bx", "bl"]),
    (88, ["rcx", "ecx", "cx", "cl"]),
    (96, ["rdx", "edx", "dx", "dl"]),
    (104, ["rsi", "esi", "si", "sil"]),
    (112, ["rdi", "edi", "di", "dil"]),
    (32, ["rbp", "ebp", "bp", "bpl"]),
    (152, ["rsp", "esp", "sp", "spl"]),
    (72, ["r8", "r8d", "r8w", "r8b"]),
    (64, ["r9", "r9d", "r9w", "r9b"]),
    (56, ["r10", "r10d", "r10w", "r10b"]),
    (48, ["r11", "r11d", "r11w", "r11b"]),
    (24, ["r12", "r12d", "r12w", "r12b"]),
    (16, ["r13", "r13d", "r13w", "r13b"]),
    (8, ["r14", "r14d", "r14w", "r14b"]),
    (0, ["r15", "r15d", "r15w", "r15b"]),
];

/// One argument of a spec, as its text alone decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgSpec {
    /// Ready for the eBPF side.
    Ready(UsdtArg),
    /// Memory at `symbol + addend` (a `%rip`-relative operand): `arg` has the size and
    /// type, and the location once the symbol's address is known ([`resolve_globals`]).
    Global {
        arg: UsdtArg,
        symbol: String,
        addend: i64,
        /// The argument as the note has it, to say which one lacks its symbol.
        text: String,
    },
    /// Cannot be read at the probe: the argument's text and why, e.g.
    /// `"4f@%xmm0": ...`.
    Unavailable(String),
}

/// An argument ready for the eBPF side, or why it is unavailable (the argument's text
/// and the reason).
pub type SiteArg = Result<UsdtArg, String>;

/// Decodes a whole argument spec. Arguments are separated by whitespace; an empty or
/// all-blank spec means the probe has no arguments. Only a spec with more arguments than
/// an event holds fails as a whole; an argument that does not decode is
/// [`ArgSpec::Unavailable`].
pub fn parse_arg_specs(spec: &str) -> Result<Vec<ArgSpec>, Error> {
    let args: Vec<&str> = spec.split_ascii_whitespace().collect();
    if args.len() > MAX_USDT_ARGS {
        return Err(Error::BadArgSpec {
            spec: spec.to_owned(),
            reason: format!(
                "{} arguments, at most {MAX_USDT_ARGS} are supported",
                args.len()
            ),
        });
    }
    Ok(args
        .iter()
        .map(|arg| parse_arg(arg).unwrap_or_else(|reason| unavailable(arg, &reason)))
        .collect())
}

fn unavailable(arg: &str, reason: &str) -> ArgSpec {
    ArgSpec::Unavailable(format!("\"{arg}\": {reason}"))
}

/// Places the globals of `args` for a probe at link-time address `pc`: memory at
/// `symbol + addend` is read at `ip + (symbol + addend - pc)`, `ip` being the probe's
/// runtime address when its uprobe fires. The object is loaded in one piece, so the
/// difference holds in every process, PIE or not, without knowing where it is loaded.
/// `address_of` gives a symbol's link-time address, or why it cannot.
pub fn resolve_globals(
    args: Vec<ArgSpec>,
    pc: u64,
    address_of: impl Fn(&str) -> Result<u64, String>,
) -> Vec<SiteArg> {
    args.into_iter()
        .map(|arg| match arg {
            ArgSpec::Ready(arg) => Ok(arg),
            ArgSpec::Unavailable(why) => Err(why),
            ArgSpec::Global {
                mut arg,
                symbol,
                addend,
                text,
            } => {
                let address = address_of(&symbol).map_err(|why| format!("\"{text}\": {why}"))?;
                arg.kind = arg_kind::REG_DEREF;
                arg.reg_off = RIP;
                arg.val_off = address.wrapping_add(addend as u64).wrapping_sub(pc) as i64;
                Ok(arg)
            }
        })
        .collect()
}

/// Renders a decoded argument for humans (`tracer list -v`): its C-like type, then the
/// location in AT&T syntax with full register names, e.g. `s32 -16(%rbp)`. A global's
/// location is from the probe's address: `*(pc+0x2ee4)`.
pub fn describe(arg: &UsdtArg) -> String {
    let ty = if arg.float != 0 {
        format!("f{}", u32::from(arg.size) * 8)
    } else {
        format!(
            "{}{}",
            if arg.signed != 0 { 's' } else { 'u' },
            u32::from(arg.size) * 8
        )
    };
    let loc = match arg.kind {
        arg_kind::CONST => format!("${}", arg.val_off),
        arg_kind::REG => format!("%{}", register_name(arg.reg_off)),
        arg_kind::REG_DEREF if arg.reg_off == RIP => {
            let sign = if arg.val_off < 0 { '-' } else { '+' };
            format!("*(pc{sign}{:#x})", arg.val_off.unsigned_abs())
        }
        arg_kind::REG_DEREF => format!(
            "{}(%{})",
            displacement(arg.val_off),
            register_name(arg.reg_off)
        ),
        arg_kind::REG_DEREF_INDEXED => format!(
            "{}(%{},%{},{})",
            displacement(arg.val_off),
            register_name(arg.reg_off),
            register_name(arg.idx_reg_off),
            arg.scale
        ),
        other => format!("<unknown kind {other}>"),
    };
    format!("{ty} {loc}")
}

fn displacement(off: i64) -> String {
    if off == 0 {
        String::new()
    } else {
        off.to_string()
    }
}

fn register_name(reg_off: u8) -> String {
    if reg_off == RIP {
        return "rip".into();
    }
    REGISTERS
        .iter()
        .find(|(off, _)| *off == reg_off)
        .map_or_else(
            || format!("pt_regs+{reg_off}"),
            |(_, names)| names[0].to_owned(),
        )
}

/// The SIZE field: bytes, signedness, float. A 16-byte value keeps its first (low) 8
/// bytes, as bpftrace shows it; a value has no more room in an event.
fn parse_size(size: &str) -> Result<(u8, bool, bool), String> {
    let bad =
        || format!("size {size:?} is not one of 1, 2, 4, 8, 16 (negative: signed; 4f, 8f: float)");
    let (signed, rest) = match size.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, size),
    };
    let (float, digits) = match rest.strip_suffix('f') {
        Some(digits) => (true, digits),
        None => (false, rest),
    };
    let bytes = match digits {
        "1" => 1,
        "2" => 2,
        "4" => 4,
        "8" => 8,
        "16" => 16,
        _ => return Err(bad()),
    };
    if float && !matches!(bytes, 4 | 8) {
        return Err(bad());
    }
    // A float's sign is in its bits: sign-extending them would corrupt it.
    Ok((bytes.min(8), signed && !float, float))
}

fn parse_arg(arg: &str) -> Result<ArgSpec, String> {
    // Version-1 notes (and some hand-written ones) give a bare operand: 8 bytes, unsigned,
    // as libbpf reads them.
    let (size, loc) = match arg.split_once('@') {
        Some((size, loc)) => (parse_size(size)?, loc),
        None => ((8, false, false), arg),
    };
    let (size, signed, float) = size;
    let mut out = UsdtArg {
        size,
        signed: u8::from(signed),
        float: u8::from(float),
        ..UsdtArg::default()
    };

    if let Some(constant) = loc.strip_prefix('$') {
        out.kind = arg_kind::CONST;
        out.val_off = parse_number(constant).ok_or_else(|| {
            if looks_symbolic(constant) {
                format!(
                    "symbolic constant \"{constant}\" (an address in the object) is not supported"
                )
            } else {
                format!("bad constant \"{constant}\"")
            }
        })?;
    } else if let Some(reg) = loc.strip_prefix('%') {
        if reg.contains(':') {
            return Err("segment-relative operands are not supported".into());
        }
        out.kind = arg_kind::REG;
        out.reg_off = if reg == "rip" { RIP } else { register(reg)? };
    } else if let Some(open) = loc.find('(') {
        let inner = loc[open + 1..]
            .strip_suffix(')')
            .ok_or("memory operand must end with ')'")?;
        let disp = &loc[..open];
        if inner == "%rip" {
            return rip_relative(out, disp, arg);
        }
        out.val_off = if disp.is_empty() {
            0
        } else {
            parse_number(disp).ok_or_else(|| {
                if looks_symbolic(disp) {
                    format!("symbolic displacement \"{disp}\" is only supported from %rip")
                } else {
                    format!("bad displacement \"{disp}\"")
                }
            })?
        };
        let mut parts = inner.split(',');
        let base = parts.next().unwrap_or_default();
        let index = parts.next();
        let scale = parts.next();
        if parts.next().is_some() {
            return Err("too many parts in memory operand".into());
        }
        if base.is_empty() {
            return Err("memory operand without a base register is not supported".into());
        }
        out.reg_off = address_register(base)?;
        match index {
            None => out.kind = arg_kind::REG_DEREF,
            Some(index) => {
                out.kind = arg_kind::REG_DEREF_INDEXED;
                out.idx_reg_off = address_register(index)?;
                if out.idx_reg_off == 152 {
                    return Err("%rsp cannot be an index register".into());
                }
                out.scale = match scale {
                    None => 1,
                    Some("1") => 1,
                    Some("2") => 2,
                    Some("4") => 4,
                    Some("8") => 8,
                    Some(s) => return Err(format!("scale \"{s}\" is not 1, 2, 4 or 8")),
                };
            }
        }
    } else if looks_symbolic(loc) {
        return Err(format!(
            "symbolic operand \"{loc}\" (an absolute address) is not supported"
        ));
    } else {
        return Err("unrecognised location (expected $CONST, %REG or DISP(%REG...))".into());
    }
    Ok(ArgSpec::Ready(out))
}

/// `DISP(%rip)`: a symbol plus or minus constants (`t1`, `4+t1`, `t1-8`). A displacement
/// without a symbol is from the end of the instruction that used it, which the note does
/// not locate.
fn rip_relative(arg: UsdtArg, disp: &str, text: &str) -> Result<ArgSpec, String> {
    let numeric = || {
        format!(
            "%rip-relative displacement \"{disp}\" without a symbol: the instruction it is \
             relative to is unknown"
        )
    };
    if disp.is_empty() || parse_number(disp).is_some() {
        return Err(numeric());
    }
    let mut symbol = None;
    let mut addend: i64 = 0;
    // Terms, each with the sign before it.
    let mut rest = disp;
    while !rest.is_empty() {
        let (negative, term_start) = match rest.as_bytes()[0] {
            b'-' => (true, &rest[1..]),
            b'+' => (false, &rest[1..]),
            _ if rest.len() == disp.len() => (false, rest),
            _ => return Err(format!("bad displacement \"{disp}\"")),
        };
        let end = term_start.find(['+', '-']).unwrap_or(term_start.len());
        let term = &term_start[..end];
        rest = &term_start[end..];
        if let Some(n) = parse_number(term) {
            addend = if negative {
                addend.checked_sub(n)
            } else {
                addend.checked_add(n)
            }
            .ok_or_else(|| format!("displacement \"{disp}\" overflows"))?;
        } else if is_symbol(term) && !negative && symbol.is_none() {
            symbol = Some(term);
        } else {
            return Err(format!(
                "displacement \"{disp}\" is not one symbol plus or minus constants"
            ));
        }
    }
    let symbol = symbol.ok_or_else(numeric)?;
    Ok(ArgSpec::Global {
        arg,
        symbol: symbol.to_owned(),
        addend,
        text: text.to_owned(),
    })
}

fn is_symbol(s: &str) -> bool {
    looks_symbolic(s)
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$'))
}

/// The pt_regs offset of a register named in any width.
fn register(name: &str) -> Result<u8, String> {
    if let Some((off, _)) = REGISTERS.iter().find(|(_, names)| names.contains(&name)) {
        return Ok(*off);
    }
    if matches!(name, "ah" | "bh" | "ch" | "dh") {
        // pt_regs has no slot for bits 8-15, and UsdtArg has no shift to extract them.
        return Err(format!("high-byte register %{name} is not supported"));
    }
    if ["xmm", "ymm", "zmm", "st", "mm"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
    {
        // A uprobe's pt_regs holds the general-purpose registers only.
        return Err(format!(
            "floating-point register %{name} is not readable at a uprobe (pt_regs has only \
             the general-purpose registers)"
        ));
    }
    Err(format!("unknown register %{name}"))
}

/// A base or index register of a memory operand: only full 64-bit registers, since a
/// 32-bit address would need truncating the sum, which the eBPF side does not do.
fn address_register(operand: &str) -> Result<u8, String> {
    let name = operand
        .strip_prefix('%')
        .ok_or_else(|| format!("expected a register in memory operand, got \"{operand}\""))?;
    if name == "rip" {
        return Err("%rip can only be a base on its own, as in sym(%rip)".into());
    }
    let off = register(name)?;
    if !REGISTERS
        .iter()
        .any(|(o, names)| *o == off && names[0] == name)
    {
        return Err(format!(
            "%{name} as an address register (32-bit addressing) is not supported"
        ));
    }
    Ok(off)
}

/// Parses an assembler integer: optional sign, then hex (`0x`), octal (leading `0`, as
/// GAS reads it) or decimal. Positive values up to `u64::MAX` are kept as their bit
/// pattern, since constants are truncated to the argument size anyway.
fn parse_number(s: &str) -> Option<i64> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse::<u64>().ok()?
    };
    // from_str_radix accepts its own sign; a second one ("--5", "0x-5") is garbage.
    if !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    if negative {
        if magnitude > 1 << 63 {
            return None;
        }
        Some((magnitude as i64).wrapping_neg())
    } else {
        Some(magnitude as i64)
    }
}

/// Whether an operand names a symbol (`foo`, `foo+8`, `.LC0`) rather than being garbage,
/// so the reason can say why it cannot be decoded.
fn looks_symbolic(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(spec: &str) -> ArgSpec {
        let mut args = parse_arg_specs(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(args.len(), 1, "{spec}");
        args.remove(0)
    }

    fn one(spec: &str) -> UsdtArg {
        match parsed(spec) {
            ArgSpec::Ready(arg) => arg,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// Why the one argument of `spec` is unavailable.
    fn err(spec: &str) -> String {
        match parsed(spec) {
            ArgSpec::Unavailable(why) => why,
            other => panic!("{spec} parsed as {other:?}"),
        }
    }

    fn global(spec: &str) -> (UsdtArg, String, i64) {
        match parsed(spec) {
            ArgSpec::Global {
                arg,
                symbol,
                addend,
                text,
            } => {
                assert_eq!(text, spec, "the argument's own text");
                (arg, symbol, addend)
            }
            other => panic!("{spec}: {other:?}"),
        }
    }

    fn reg(reg_off: u8, size: u8, signed: bool) -> UsdtArg {
        UsdtArg {
            kind: arg_kind::REG,
            reg_off,
            size,
            signed: signed.into(),
            ..Default::default()
        }
    }

    #[test]
    fn empty_spec_has_no_args() {
        assert_eq!(parse_arg_specs("").unwrap(), vec![]);
        assert_eq!(parse_arg_specs("  \t ").unwrap(), vec![]);
    }

    #[test]
    fn sizes_and_signedness() {
        for (size, expect) in [
            ("1", (1, 0)),
            ("2", (2, 0)),
            ("4", (4, 0)),
            ("8", (8, 0)),
            ("-1", (1, 1)),
            ("-2", (2, 1)),
            ("-4", (4, 1)),
            ("-8", (8, 1)),
        ] {
            let a = one(&format!("{size}@%rdi"));
            assert_eq!((a.size, a.signed), expect, "{size}");
        }
        for bad in [
            "0", "3", "32", "-0", "+4", "", "x", "--4", "f", "1f", "2f", "16f", "4ff", "f4",
        ] {
            let e = err(&format!("{bad}@%rdi"));
            assert!(e.contains("is not one of 1, 2, 4, 8, 16"), "{bad}: {e}");
            assert!(e.starts_with(&format!("\"{bad}@%rdi\": size")), "{e}");
        }
    }

    #[test]
    fn sixteen_bytes_keep_the_first_eight() {
        // The low half, in %rax or first in memory (little-endian), as bpftrace shows it.
        assert_eq!(one("-16@%rax"), reg(80, 8, true));
        assert_eq!(one("16@%rax"), reg(80, 8, false));
        let m = one("-16@-48(%rbp)");
        assert_eq!(
            (m.kind, m.val_off, m.reg_off, m.size),
            (arg_kind::REG_DEREF, -48, 32, 8)
        );
    }

    #[test]
    fn sizeless_operands_are_eight_unsigned_bytes() {
        assert_eq!(one("%rdi"), reg(112, 8, false));
        assert_eq!(
            one("%esi"),
            reg(104, 8, false),
            "as libbpf: 8 bytes whatever the name"
        );
        let m = one("-8(%rbp)");
        assert_eq!(
            (m.kind, m.val_off, m.size, m.signed),
            (arg_kind::REG_DEREF, -8, 8, 0)
        );
        assert_eq!(one("$7").val_off, 7);
        assert_eq!(global("t1(%rip)").0.size, 8);
        let args = parse_arg_specs("%rdi 4@%esi").unwrap();
        assert_eq!(
            args,
            vec![
                ArgSpec::Ready(reg(112, 8, false)),
                ArgSpec::Ready(reg(104, 4, false))
            ]
        );
    }

    #[test]
    fn floats_are_read_as_their_bits_unless_in_sse_registers() {
        let f = |reg_off: u8, size: u8| UsdtArg {
            float: 1,
            ..reg(reg_off, size, false)
        };
        // gcc passes floats through general-purpose registers and memory ("nor").
        assert_eq!(one("8f@%rcx"), f(88, 8));
        assert_eq!(one("4f@%esi"), f(104, 4));
        assert_eq!(one("-4f@%esi"), f(104, 4), "a float's sign is in its bits");
        let m = one("8f@-24(%rbp)");
        assert_eq!(
            (m.kind, m.float, m.size, m.signed),
            (arg_kind::REG_DEREF, 1, 8, 0)
        );
        assert_eq!(global("4f@g_float(%rip)").0.float, 1);
        for r in ["xmm0", "xmm15", "ymm1", "st", "mm0"] {
            let e = err(&format!("4f@%{r}"));
            assert!(
                e.contains(&format!(
                    "floating-point register %{r} is not readable at a uprobe"
                )),
                "{e}"
            );
        }
        assert!(err("8f@(%xmm0)").contains("floating-point register"));
    }

    #[test]
    fn rip_relative_globals_name_a_symbol_and_an_addend() {
        let s8 = UsdtArg {
            size: 1,
            signed: 1,
            ..Default::default()
        };
        assert_eq!(global("-1@4+t1(%rip)"), (s8, "t1".into(), 4));
        assert_eq!(global("-1@t1+4(%rip)"), (s8, "t1".into(), 4));
        assert_eq!(global("-1@t1-4(%rip)"), (s8, "t1".into(), -4));
        assert_eq!(global("-1@t1(%rip)"), (s8, "t1".into(), 0));
        assert_eq!(global("-1@0x10+t1+2(%rip)"), (s8, "t1".into(), 18));
        assert_eq!(global("-1@-8+t1(%rip)"), (s8, "t1".into(), -8));
        assert_eq!(global("-1@s_short.0(%rip)").1, "s_short.0");
        assert_eq!(global("8@_ZN3foo3barE+8(%rip)").1, "_ZN3foo3barE");
        assert_eq!(global("4@g_uint(%rip)").0.signed, 0);
        for bad in ["t1+t2", "-t1", "t1+", "4+", "t1+x!", "t1++4", "t1*2"] {
            let e = err(&format!("8@{bad}(%rip)"));
            assert!(
                e.contains("is not one symbol plus or minus constants")
                    || e.contains("bad displacement")
                    || e.contains("without a symbol"),
                "{bad}: {e}"
            );
        }
        assert!(err("8@16(%rip)").contains("\"16\" without a symbol"));
        assert!(err("8@(%rip)").contains("without a symbol"));
        assert!(err("8@-0x7fffffffffffffff+t1-0x7fffffffffffffff(%rip)").contains("overflows"));
        assert!(err("8@t1(%rax)").contains("only supported from %rip"));
        assert!(err("8@8(%rip,%rax)").contains("%rip can only be a base on its own"));
        assert!(err("8@(%rax,%rip)").contains("%rip can only be a base on its own"));
    }

    #[test]
    fn globals_resolve_relative_to_the_probe() {
        let args = parse_arg_specs("-1@4+t1(%rip) 8@g(%rip) 4@%edi 8@gone(%rip) 4f@%xmm0").unwrap();
        let symbols = |name: &str| match name {
            "t1" => Ok(0x4010),
            "g" => Ok(0x1000),
            _ => Err("no symbol gone in the object's symbol tables (stripped?)".to_string()),
        };
        let resolved = resolve_globals(args, 0x1139, symbols);
        let deref = |val_off: i64, size: u8, signed: u8| UsdtArg {
            kind: arg_kind::REG_DEREF,
            reg_off: RIP,
            val_off,
            size,
            signed,
            ..Default::default()
        };
        assert_eq!(resolved[0], Ok(deref(0x4014 - 0x1139, 1, 1)));
        assert_eq!(
            resolved[1],
            Ok(deref(0x1000 - 0x1139, 8, 0)),
            "before the probe"
        );
        assert_eq!(resolved[2], Ok(reg(112, 4, false)));
        assert_eq!(
            resolved[3],
            Err(
                "\"8@gone(%rip)\": no symbol gone in the object's symbol tables (stripped?)".into()
            )
        );
        assert!(
            resolved[4]
                .as_ref()
                .unwrap_err()
                .starts_with("\"4f@%xmm0\": ")
        );
        assert_eq!(describe(resolved[0].as_ref().unwrap()), "s8 *(pc+0x2edb)");
        assert_eq!(describe(resolved[1].as_ref().unwrap()), "u64 *(pc-0x139)");
    }

    #[test]
    fn every_register_name() {
        for (off, names) in REGISTERS {
            for (width, name) in names.into_iter().enumerate() {
                // The SIZE field governs, whatever width the register name has.
                let size = [8u8, 4, 2, 1][width];
                let a = one(&format!("-{size}@%{name}"));
                assert_eq!(a, reg(off, size, true), "{name}");
            }
        }
        // Spot-check offsets against struct pt_regs.
        assert_eq!(one("8@%r15").reg_off, 0);
        assert_eq!(one("8@%rbp").reg_off, 32);
        assert_eq!(one("4@%ebx").reg_off, 40);
        assert_eq!(one("8@%rax").reg_off, 80);
        assert_eq!(one("1@%dil").reg_off, 112);
        assert_eq!(one("8@%rsp").reg_off, 152);
        assert_eq!(one("8@%rip").reg_off, 128);
        assert_eq!(one("2@%r9w").reg_off, 64);
        assert_eq!(one("1@%r12b").reg_off, 24);
        assert_eq!(one("4@%r12d").reg_off, 24);
        assert_eq!(one("8@%eax").size, 8, "size field governs");
    }

    #[test]
    fn unsupported_registers() {
        for r in ["ah", "bh", "ch", "dh"] {
            let e = err(&format!("1@%{r}"));
            assert!(
                e.contains(&format!("high-byte register %{r} is not supported")),
                "{e}"
            );
        }
        assert!(err("8@%r16").contains("unknown register"));
        assert!(err("8@%").contains("unknown register"));
        assert!(err("8@%fs:8").contains("segment-relative"));
        assert!(err("8@%fs:(%rax)").contains("segment-relative"));
    }

    #[test]
    fn constants() {
        let c = |v: i64, size: u8, signed: u8| UsdtArg {
            kind: arg_kind::CONST,
            val_off: v,
            size,
            signed,
            ..Default::default()
        };
        assert_eq!(one("4@$5"), c(5, 4, 0));
        assert_eq!(one("-4@$-1"), c(-1, 4, 1));
        assert_eq!(one("8@$0x10"), c(16, 8, 0));
        assert_eq!(one("-8@$-0x10"), c(-16, 8, 1));
        assert_eq!(one("1@$0"), c(0, 1, 0));
        assert_eq!(one("4@$010"), c(8, 4, 0), "GAS reads a leading 0 as octal");
        assert_eq!(one("8@$18446744073709551615"), c(-1, 8, 0));
        assert_eq!(one("-8@$-9223372036854775808"), c(i64::MIN, 8, 1));
        assert!(err("8@$-9223372036854775809").contains("bad constant"));
        assert!(err("8@$18446744073709551616").contains("bad constant"));
        assert!(err("4@$").contains("bad constant"));
        assert!(err("4@$--1").contains("bad constant"));
        assert!(err("4@$0x").contains("bad constant"));
        assert!(err("4@$0x-5").contains("bad constant"));
        assert!(err("4@$09").contains("bad constant"));
        assert!(err("8@$foo").contains("symbolic constant \"foo\""));
        assert_eq!(
            parse_arg_specs("8@$foo").unwrap(),
            vec![ArgSpec::Unavailable(
                "\"8@$foo\": symbolic constant \"foo\" (an address in the object) is not supported"
                    .into()
            )]
        );
    }

    #[test]
    fn memory_operands() {
        let m = |disp: i64, reg_off: u8, size: u8, signed: u8| UsdtArg {
            kind: arg_kind::REG_DEREF,
            val_off: disp,
            reg_off,
            size,
            signed,
            ..Default::default()
        };
        assert_eq!(one("-4@-16(%rbp)"), m(-16, 32, 4, 1));
        assert_eq!(one("8@8(%rsp)"), m(8, 152, 8, 0));
        assert_eq!(one("8@(%rax)"), m(0, 80, 8, 0));
        assert_eq!(one("2@0x10(%rax)"), m(16, 80, 2, 0));
        assert_eq!(one("-1@-0x10(%r12)"), m(-16, 24, 1, 1));
        assert_eq!(one("-4@112(%rsp)"), m(112, 152, 4, 1));
        assert_eq!(one("8@+8(%rdi)"), m(8, 112, 8, 0));
    }

    #[test]
    fn indexed_memory_operands() {
        let x = |disp: i64, base: u8, idx: u8, scale: u8| UsdtArg {
            kind: arg_kind::REG_DEREF_INDEXED,
            val_off: disp,
            reg_off: base,
            idx_reg_off: idx,
            scale,
            size: 8,
            signed: 0,
            ..Default::default()
        };
        assert_eq!(one("8@-96(%rbp,%rax,8)"), x(-96, 32, 80, 8));
        assert_eq!(one("8@(%rax,%rdx)"), x(0, 80, 96, 1));
        assert_eq!(one("8@(%rax,%rdx,1)"), x(0, 80, 96, 1));
        assert_eq!(one("8@0x20(%r8,%r15,2)"), x(32, 72, 0, 2));
        assert_eq!(one("8@4(%rsp,%rbx,4)"), x(4, 152, 40, 4));
        assert!(err("8@(%rax,%rdx,3)").contains("scale \"3\" is not 1, 2, 4 or 8"));
        assert!(err("8@(%rax,%rdx,)").contains("scale"));
        assert!(err("8@(%rax,%rsp,2)").contains("%rsp cannot be an index"));
        assert!(err("8@(,%rax,8)").contains("without a base register"));
        assert!(err("8@(%rax,%rdx,8,1)").contains("too many parts"));
        assert!(err("8@(%rax,rdx)").contains("expected a register"));
    }

    #[test]
    fn unsupported_memory_operands() {
        assert!(err("8@foo(%rbp)").contains("symbolic displacement \"foo\""));
        assert!(err("8@16(%rip)").contains("%rip-relative"));
        assert!(err("8@(%eax)").contains("32-bit addressing"));
        assert!(err("8@(%rax,%edx)").contains("32-bit addressing"));
        assert!(err("8@(%ah)").contains("high-byte"));
        assert!(err("8@-16(%rbp").contains("must end with ')'"));
        assert!(err("8@-16(%rbp)x").contains("must end with ')'"));
        assert!(err("8@1z(%rbp)").contains("bad displacement"));
        assert!(err("8@()").contains("without a base register"));
        assert!(err("8@global_var").contains("symbolic operand"));
        assert!(err("8@1234").contains("unrecognised location"));
    }

    #[test]
    fn garbage() {
        for spec in ["garbage", "@", "8@", "@%rdi", "8%rdi", "8@@%rdi", "8@%rdi,"] {
            let e = err(spec);
            assert!(e.starts_with(&format!("\"{spec}\": ")), "{spec}: {e}");
        }
    }

    #[test]
    fn one_bad_argument_leaves_the_others() {
        assert_eq!(
            parse_arg_specs("8@%rdi -4@%ah 4@$1").unwrap(),
            vec![
                ArgSpec::Ready(reg(112, 8, false)),
                ArgSpec::Unavailable("\"-4@%ah\": high-byte register %ah is not supported".into()),
                ArgSpec::Ready(UsdtArg {
                    kind: arg_kind::CONST,
                    val_off: 1,
                    size: 4,
                    ..Default::default()
                }),
            ]
        );
    }

    #[test]
    fn twelve_args_ok_thirteen_not() {
        let twelve = ["8@%rdi"; 12].join(" ");
        assert_eq!(parse_arg_specs(&twelve).unwrap().len(), 12);
        let thirteen = ["8@%rdi"; 13].join(" ");
        let e = parse_arg_specs(&thirteen).unwrap_err().to_string();
        assert!(e.contains("13 arguments, at most 12 are supported"), "{e}");
    }

    #[test]
    fn real_world_specs() {
        // python3.11 function__entry, and a mix like libbpf's selftests use.
        let ready = |spec: &str| -> Vec<UsdtArg> {
            parse_arg_specs(spec)
                .unwrap()
                .into_iter()
                .map(|a| match a {
                    ArgSpec::Ready(a) => a,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let args = ready("8@%rbp 8@%r12 -4@%eax");
        assert_eq!(
            args,
            vec![reg(32, 8, false), reg(24, 8, false), reg(80, 4, true)]
        );
        let args = ready("-4@%esi -4@-24(%rbp) -4@%ecx 2@%ax 8@%rdx");
        assert_eq!(args.len(), 5);
        assert_eq!(args[1].kind, arg_kind::REG_DEREF);
        assert_eq!(args[3], reg(80, 2, false));
        // Tabs and repeated spaces separate too.
        assert_eq!(parse_arg_specs(" 8@%rdi\t\t4@$1  ").unwrap().len(), 2);
    }

    #[test]
    fn describe_parses_back() {
        // `describe` prints the type then an AT&T location; as a spec it must decode to
        // the same argument, so what `list -v` shows is what the eBPF side reads.
        let specs = "-1@%dil 2@%r9w -4@%r12d 8@%rip 8@$18446744073709551615 -2@$-0x8000 \
                     4@(%rsp) -8@-0x7fffffff(%rsp,%r15,8) 1@(%rax,%rbx) 8@8(%rbp,%r8,2)";
        for arg in parse_arg_specs(specs).unwrap() {
            let ArgSpec::Ready(arg) = arg else {
                panic!("{arg:?}")
            };
            let text = describe(&arg);
            let (ty, location) = text.split_once(' ').unwrap();
            let sign = if ty.starts_with('s') { "-" } else { "" };
            let bytes = ty[1..].parse::<u32>().unwrap() / 8;
            assert_eq!(one(&format!("{sign}{bytes}@{location}")), arg, "{text}");
        }
    }

    #[test]
    fn describe_round_trips_readably() {
        let cases = [
            ("-4@%edi", "s32 %rdi"),
            ("8@%rip", "u64 %rip"),
            ("1@$5", "u8 $5"),
            ("-8@$-1", "s64 $-1"),
            ("-4@-16(%rbp)", "s32 -16(%rbp)"),
            ("8@(%rax)", "u64 (%rax)"),
            ("2@0x10(%rsp)", "u16 16(%rsp)"),
            ("8@-96(%rbp,%rax,8)", "u64 -96(%rbp,%rax,8)"),
            ("8@(%rax,%rdx)", "u64 (%rax,%rdx,1)"),
            ("8f@%rcx", "f64 %rcx"),
            ("4f@-4(%rbp)", "f32 -4(%rbp)"),
            ("-16@%rax", "s64 %rax"),
            ("%rdi", "u64 %rdi"),
        ];
        for (spec, text) in cases {
            assert_eq!(describe(&one(spec)), text, "{spec}");
        }
        let odd = UsdtArg {
            kind: 99,
            size: 4,
            ..Default::default()
        };
        assert_eq!(describe(&odd), "u32 <unknown kind 99>");
        let odd = UsdtArg {
            kind: arg_kind::REG,
            reg_off: 136,
            size: 8,
            ..Default::default()
        };
        assert_eq!(describe(&odd), "u64 %pt_regs+136");
    }
}
