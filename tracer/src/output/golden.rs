//! Golden files: outputs rendered from fixed inputs, compared byte for byte with
//! `tracer/tests/data/NAME`. `TRACER_BLESS=1 cargo test -p tracer` rewrites them (as
//! inferno's `INFERNO_BLESS_TESTS` does); review the diff before committing it.

use std::path::{Path, PathBuf};

/// Asserts `actual` is the content of the golden file `name`, or writes it under
/// `TRACER_BLESS=1`.
pub(crate) fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    assert_golden_file(&path, actual);
}

/// Asserts `actual` is the content of the file at `path`, or writes it under
/// `TRACER_BLESS=1`.
pub(crate) fn assert_golden_file(path: &Path, actual: &str) {
    if std::env::var_os("TRACER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (TRACER_BLESS=1 cargo test -p tracer writes it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs; if the change is meant, run with TRACER_BLESS=1 and review the diff.\n\
         --- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
