//! `tracer list`, and the specifier grammar it shares with `trace`.

mod specifiers;
