//! Parsers of the values several commands take: durations, ring buffer sizes and PIDs.

use std::{num::NonZeroU32, time::Duration};

use super::ConfigError;

/// Parses the size of ring buffer `--flag` (`65536`, `64K`, `4M`, `1G`), rounded up to a
/// power of two (which the kernel requires) and at least one page.
pub(crate) fn parse_buffer_size(flag: &'static str, text: &str) -> Result<u32, ConfigError> {
    let err = || ConfigError::BufferSize(flag, text.to_string());
    let text = text.trim();
    let (number, multiplier) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&text[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let bytes = number
        .parse::<u64>()
        .map_err(|_| err())?
        .checked_mul(multiplier)
        .ok_or_else(err)?;
    if !(4096..=1 << 30).contains(&bytes) {
        return Err(err());
    }
    Ok(bytes.next_power_of_two() as u32)
}

pub(super) fn nonzero_pid(pid: u32) -> Result<NonZeroU32, ConfigError> {
    NonZeroU32::new(pid).ok_or(ConfigError::ZeroPid)
}

/// Parses `10s`, `1.5s`, `500ms`, `100us`, `250ns`, `2m`, `1h`; a bare number is seconds.
/// `flag` names the option the text came from, for the error.
pub(crate) fn parse_duration(flag: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let err = || ConfigError::Duration(flag, text.to_string());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let seconds_per_unit = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(err()),
    };
    Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("duration", "10s").unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(
            parse_duration("duration", "10").unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(
            parse_duration("duration", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("duration", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_duration("duration", "100us").unwrap(),
            Duration::from_micros(100)
        );
        assert_eq!(
            parse_duration("duration", "2m").unwrap(),
            Duration::from_secs(120)
        );
        for bad in ["", "s", "10x", "-1s", "1.2.3s"] {
            let err = parse_duration("min-block", bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid --min-block "), "{bad}: {err}");
        }
    }

    #[test]
    fn ring_buffer_sizes() {
        assert_eq!(parse_buffer_size("ring-buffer", "4M").unwrap(), 4 << 20);
        assert_eq!(parse_buffer_size("ring-buffer", "65536").unwrap(), 65536);
        assert_eq!(
            parse_buffer_size("ring-buffer", "100K").unwrap(),
            128 << 10,
            "rounded up"
        );
        for bad in ["", "1K", "2G", "M", "-4M", "4X"] {
            assert!(parse_buffer_size("ring-buffer", bad).is_err(), "{bad}");
        }
    }
}
