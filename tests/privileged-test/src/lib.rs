//! `#[privileged_test]`: a test that needs root and BPF, so a plain `cargo test` lists it
//! as ignored with the reason, and `cargo xtask test` (which passes `--include-ignored`)
//! runs it.
//!
//! An attribute rather than a `macro_rules!` wrapper keeps the test an ordinary function
//! that rustfmt formats. It adds the attributes only: the test (or a helper it calls)
//! still checks for root with `require_privileged()`, at the moment it chooses.

use proc_macro::TokenStream;

/// Why a privileged test is ignored by default, as `cargo test` prints it.
const REASON: &str =
    "needs root and BPF: run as root with --include-ignored (cargo xtask test does)";

/// Marks a function as a test that is ignored unless `--include-ignored` is given.
#[proc_macro_attribute]
pub fn privileged_test(arguments: TokenStream, item: TokenStream) -> TokenStream {
    if !arguments.is_empty() {
        return "compile_error!(\"#[privileged_test] takes no arguments\");"
            .parse()
            .expect("a compile_error! invocation is valid Rust");
    }
    let mut test: TokenStream = format!("#[test] #[ignore = {REASON:?}]")
        .parse()
        .expect("test attributes are valid Rust");
    test.extend(item);
    test
}
