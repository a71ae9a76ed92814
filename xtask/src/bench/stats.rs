//! Reducing the runs of a figure to the numbers it shows.

pub(super) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        f64::midpoint(sorted[mid - 1], sorted[mid])
    }
}

pub(super) fn min_max(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Per-iteration values of each run, e.g. "0.36..0.74".
pub(super) fn spread(runs: &[f64], per: f64) -> String {
    let (lo, hi) = min_max(runs);
    format!("{:.3}..{:.3}", lo / per, hi / per)
}

pub(super) fn list_ms(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    items.join(", ")
}

/// "median (lowest..highest)" of `values` with `decimals` decimals, e.g. "0.97 (0.95..1.01)".
pub(super) fn median_range(values: &[f64], decimals: usize) -> String {
    if values.is_empty() {
        return "n/a".into();
    }
    let (lo, hi) = min_max(values);
    format!(
        "{:.decimals$} ({lo:.decimals$}..{hi:.decimals$})",
        median(values)
    )
}
