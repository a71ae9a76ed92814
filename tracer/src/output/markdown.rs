//! Markdown as GitHub renders it, for the tests that check and generate the docs.

/// GitHub's anchor for a heading: lowercase, spaces to '-', punctuation dropped but '-'
/// and '_'.
pub(crate) fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}
