//! Decoding x86-64 SDT argument specs (`-4@%edi 8@-16(%rbp)`) into [`UsdtArg`]s.
//!
//! Each argument is `SIZE@LOCATION`, where LOCATION is an AT&T-syntax operand that the
//! compiler chose for the value at the probe site. The eBPF side can only read registers
//! out of `struct pt_regs` and memory at register-relative addresses, so that is all this
//! accepts; anything else (symbols, segment overrides, high-byte registers) is an error
//! with a reason rather than a silently wrong value.

use tracer_common::{MAX_USDT_ARGS, UsdtArg, arg_kind};

use super::UsdtError;

/// Offset of `rip` in `struct pt_regs`; kept apart because `%rip` may only be read
/// directly, never used as an address base.
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

/// Decodes a whole argument spec. Arguments are separated by whitespace; an empty or
/// all-blank spec means the probe has no arguments.
pub fn parse_arg_specs(spec: &str) -> Result<Vec<UsdtArg>, UsdtError> {
    let bad = |reason: String| UsdtError::BadArgSpec {
        spec: spec.to_owned(),
        reason,
    };
    let args: Vec<&str> = spec.split_ascii_whitespace().collect();
    if args.len() > MAX_USDT_ARGS {
        return Err(bad(format!(
            "{} arguments, at most {MAX_USDT_ARGS} are supported",
            args.len()
        )));
    }
    args.iter()
        .enumerate()
        .map(|(i, arg)| {
            parse_arg(arg).map_err(|reason| bad(format!("argument {} \"{arg}\": {reason}", i + 1)))
        })
        .collect()
}

/// Renders a decoded argument for humans (`tracer list -v`): its C-like type, then the
/// location in AT&T syntax with full register names, e.g. `s32 -16(%rbp)`.
pub fn describe(arg: &UsdtArg) -> String {
    let ty = format!(
        "{}{}",
        if arg.signed != 0 { 's' } else { 'u' },
        u32::from(arg.size) * 8
    );
    let loc = match arg.kind {
        arg_kind::CONST => format!("${}", arg.val_off),
        arg_kind::REG => format!("%{}", register_name(arg.reg_off)),
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
        .map(|(_, names)| names[0].to_owned())
        .unwrap_or_else(|| format!("pt_regs+{reg_off}"))
}

fn parse_arg(arg: &str) -> Result<UsdtArg, String> {
    let (size, loc) = arg
        .split_once('@')
        .ok_or("expected SIZE@LOCATION (sizeless v1 specs are not supported)")?;
    let (size, signed) = match size {
        "1" | "2" | "4" | "8" => (size.as_bytes()[0] - b'0', false),
        "-1" | "-2" | "-4" | "-8" => (size.as_bytes()[1] - b'0', true),
        _ => {
            return Err(format!(
                "size {size:?} is not one of 1, 2, 4, 8 (negative: signed)"
            ));
        }
    };
    let mut out = UsdtArg {
        size,
        signed: u8::from(signed),
        ..UsdtArg::default()
    };

    if let Some(constant) = loc.strip_prefix('$') {
        out.kind = arg_kind::CONST;
        out.val_off = parse_number(constant).ok_or_else(|| {
            if looks_symbolic(constant) {
                format!("symbolic constant \"{constant}\" needs the symbol table; not supported")
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
        out.val_off = if disp.is_empty() {
            0
        } else {
            parse_number(disp).ok_or_else(|| {
                if looks_symbolic(disp) {
                    format!(
                        "symbolic displacement \"{disp}\" needs the symbol table; not supported"
                    )
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
            "symbolic operand \"{loc}\" needs the symbol table; not supported"
        ));
    } else {
        return Err("unrecognised location (expected $CONST, %REG or DISP(%REG...))".into());
    }
    Ok(out)
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
    Err(format!("unknown register %{name}"))
}

/// A base or index register of a memory operand: only full 64-bit registers, since a
/// 32-bit address would need truncating the sum, which the eBPF side does not do.
fn address_register(operand: &str) -> Result<u8, String> {
    let name = operand
        .strip_prefix('%')
        .ok_or_else(|| format!("expected a register in memory operand, got \"{operand}\""))?;
    if name == "rip" {
        // The uprobe sees rip at the probe's nop, not after the instruction that the
        // compiler computed the displacement for, and the displacement is almost always
        // a symbol anyway.
        return Err("%rip-relative operands are not supported".into());
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
/// so the error can say why it cannot be decoded.
fn looks_symbolic(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(spec: &str) -> UsdtArg {
        let args = parse_arg_specs(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(args.len(), 1, "{spec}");
        args[0]
    }

    fn err(spec: &str) -> String {
        match parse_arg_specs(spec) {
            Ok(args) => panic!("{spec} parsed as {args:?}"),
            Err(e) => e.to_string(),
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
        for bad in ["0", "3", "16", "-0", "+4", "", "x", "--4"] {
            let e = err(&format!("{bad}@%rdi"));
            assert!(e.contains("is not one of 1, 2, 4, 8"), "{bad}: {e}");
        }
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
        assert!(err("8@%xmm0").contains("unknown register %xmm0"));
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
        assert!(err("8@foo(%rip)").contains("symbolic displacement \"foo\""));
        assert!(err("8@foo+8(%rip)").contains("symbolic displacement"));
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
            assert!(e.starts_with("bad argument spec \""), "{spec}: {e}");
        }
    }

    #[test]
    fn error_names_the_argument() {
        assert_eq!(
            err("8@%rdi -4@%ah"),
            "bad argument spec \"8@%rdi -4@%ah\": argument 2 \"-4@%ah\": \
             high-byte register %ah is not supported"
        );
    }

    #[test]
    fn twelve_args_ok_thirteen_not() {
        let twelve = ["8@%rdi"; 12].join(" ");
        assert_eq!(parse_arg_specs(&twelve).unwrap().len(), 12);
        let thirteen = ["8@%rdi"; 13].join(" ");
        assert!(err(&thirteen).contains("13 arguments, at most 12 are supported"));
    }

    #[test]
    fn real_world_specs() {
        // python3.11 function__entry, and a mix like libbpf's selftests use.
        let args = parse_arg_specs("8@%rbp 8@%r12 -4@%eax").unwrap();
        assert_eq!(
            args,
            vec![reg(32, 8, false), reg(24, 8, false), reg(80, 4, true)]
        );
        let args = parse_arg_specs("-4@%esi -4@-24(%rbp) -4@%ecx 2@%ax 8@%rdx").unwrap();
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
