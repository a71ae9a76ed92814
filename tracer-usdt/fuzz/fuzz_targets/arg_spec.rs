//! Feeds arbitrary text to the x86-64 argument spec parser. Besides "no panics", checks
//! that whatever decodes is within what the eBPF side handles, and that `describe`'s
//! rendering parses back to the same argument (so `list -v` never shows a lie).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer_usdt::{ArgSpec, describe, parse_arg_specs};
use tracer_common::{MAX_USDT_ARGS, arg_kind};

fuzz_target!(|spec: &str| {
    let Ok(args) = parse_arg_specs(spec) else {
        return;
    };
    assert!(args.len() <= MAX_USDT_ARGS);
    for spec in &args {
        let arg = match spec {
            ArgSpec::Ready(arg) => arg,
            // Located once its symbol's address is known: the size and sign are decoded.
            ArgSpec::Global { arg, .. } => {
                assert!(matches!(arg.size, 1 | 2 | 4 | 8));
                continue;
            }
            ArgSpec::Unavailable(_) => continue,
        };
        assert!(matches!(arg.size, 1 | 2 | 4 | 8));
        assert!(arg.signed <= 1);
        assert!(matches!(
            arg.kind,
            arg_kind::CONST | arg_kind::REG | arg_kind::REG_DEREF | arg_kind::REG_DEREF_INDEXED
        ));
        if arg.kind == arg_kind::REG_DEREF_INDEXED {
            assert!(matches!(arg.scale, 1 | 2 | 4 | 8));
        }
        // `describe` gives "s32 LOCATION"; turn it back into "-4@LOCATION".
        let text = describe(arg);
        let (ty, location) = text.split_once(' ').expect("type, then location");
        let sign = if ty.starts_with('s') { "-" } else { "" };
        let bits: u32 = ty[1..].parse().expect("bit width");
        let again = parse_arg_specs(&format!("{sign}{}@{location}", bits / 8))
            .unwrap_or_else(|e| panic!("{text:?} does not parse back: {e}"));
        assert_eq!(again, vec![ArgSpec::Ready(*arg)], "{text:?}");
    }
});
