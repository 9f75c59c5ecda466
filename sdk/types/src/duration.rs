//! `metav1.Duration`: a signed length of time written as Go's `time.Duration` string
//! (`"10s"`, `"1m30s"`, `"1.5ms"`).
//!
//! Kubernetes encodes `metav1.Duration` with Go's `time.Duration.String` and decodes it with
//! `time.ParseDuration`, so manifests written for Go servers use that grammar. `humantime`
//! and friends speak a different one (`"1m 30s"`, `"1day"`, no `"1h0m0s"` output), so both
//! directions are ported here from Go's `src/time/time.go`, error messages included.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// The magnitude of `i64::MIN` nanoseconds, the largest any parsed component may reach.
const MAX_MAGNITUDE: u64 = 1 << 63;

/// A signed length of time with nanosecond resolution, as Kubernetes' `metav1.Duration`.
///
/// It is signed, like Go's, so that a negative value in a manifest decodes and is then
/// refused by validation with a field error rather than by the decoder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    nanos: i64,
}

impl Duration {
    /// No time at all (`"0s"`).
    pub const ZERO: Self = Self { nanos: 0 };

    /// A duration of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: i64) -> Self {
        Self { nanos }
    }

    /// A duration of `secs` whole seconds. The argument is a `u32` so that the result always
    /// fits: `u32::MAX` seconds is about 136 years, well inside `i64` nanoseconds.
    pub const fn from_secs(secs: u32) -> Self {
        // Lossless: `u32::MAX * 1e9` is below `i64::MAX`.
        Self {
            nanos: secs as i64 * 1_000_000_000,
        }
    }

    /// The length in nanoseconds; negative for a negative duration.
    pub const fn as_nanos(self) -> i64 {
        self.nanos
    }

    /// Whether the duration is longer than zero.
    pub const fn is_positive(self) -> bool {
        self.nanos > 0
    }

    /// The same length as a `std::time::Duration`, or `None` when it is negative.
    pub fn to_std(self) -> Option<std::time::Duration> {
        u64::try_from(self.nanos)
            .ok()
            .map(std::time::Duration::from_nanos)
    }
}

/// A `std::time::Duration` too long for a `Duration` (more than `i64::MAX` nanoseconds,
/// about 292 years).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationOutOfRange;

impl fmt::Display for DurationOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("duration is longer than 2562047h47m16.854775807s")
    }
}

impl std::error::Error for DurationOutOfRange {}

impl TryFrom<std::time::Duration> for Duration {
    type Error = DurationOutOfRange;

    fn try_from(value: std::time::Duration) -> Result<Self, Self::Error> {
        i64::try_from(value.as_nanos())
            .map(Self::from_nanos)
            .map_err(|_| DurationOutOfRange)
    }
}

/// Why a string is not a duration, worded as Go's `time.ParseDuration` words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseDurationError {
    kind: ParseErrorKind,
    input: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ParseErrorKind {
    Invalid,
    MissingUnit,
    UnknownUnit(String),
}

impl ParseDurationError {
    fn new(kind: ParseErrorKind, input: &str) -> Self {
        Self {
            kind,
            input: input.to_owned(),
        }
    }
}

impl fmt::Display for ParseDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let input = go_time_quote(&self.input);
        match &self.kind {
            ParseErrorKind::Invalid => write!(f, "time: invalid duration {input}"),
            ParseErrorKind::MissingUnit => write!(f, "time: missing unit in duration {input}"),
            ParseErrorKind::UnknownUnit(unit) => {
                write!(
                    f,
                    "time: unknown unit {} in duration {input}",
                    go_time_quote(unit)
                )
            }
        }
    }
}

impl std::error::Error for ParseDurationError {}

/// Go's `time.quote`: ASCII as is (with `"` and `\` escaped), every other byte as `\xNN`.
fn go_time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &byte in s.as_bytes() {
        match byte {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(byte));
            }
            b' '..=0x7f => out.push(char::from(byte)),
            _ => out.push_str(&format!("\\x{byte:02x}")),
        }
    }
    out.push('"');
    out
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => NANOSECOND,
        // U+00B5 MICRO SIGN and U+03BC GREEK SMALL LETTER MU are both accepted, as in Go.
        "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
        "ms" => MILLISECOND,
        "s" => SECOND,
        "m" => MINUTE,
        "h" => HOUR,
        _ => return None,
    })
}

/// Go's `leadingInt`: the leading digits of `s` and the rest, or `None` on overflow.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        if x > MAX_MAGNITUDE / 10 {
            return None;
        }
        x = x * 10 + u64::from(c - b'0');
        if x > MAX_MAGNITUDE {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Go's `leadingFraction`: the leading digits of `s` as `x / scale`, and the rest. Digits
/// past what a `u64` holds are consumed but add no precision.
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let mut x: u64 = 0;
    let mut scale = 1.0_f64;
    let mut overflow = false;
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        i += 1;
        if overflow {
            continue;
        }
        if x > (MAX_MAGNITUDE - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > MAX_MAGNITUDE {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    /// Parses `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` as Go's `time.ParseDuration` does, e.g.
    /// `"300ms"`, `"-1.5h"`, `"2h45m"`; `"0"` alone needs no unit.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseDurationError::new(ParseErrorKind::Invalid, input);
        let mut s = input.as_bytes();
        let mut negative = false;
        if let Some((&sign @ (b'-' | b'+'), rest)) = s.split_first() {
            negative = sign == b'-';
            s = rest;
        }
        if s == b"0" {
            return Ok(Self::ZERO);
        }
        if s.is_empty() {
            return Err(invalid());
        }
        let mut total: u64 = 0;
        while !s.is_empty() {
            if !(s[0] == b'.' || s[0].is_ascii_digit()) {
                return Err(invalid());
            }
            let before = s.len();
            let (mut value, rest) = leading_int(s).ok_or_else(invalid)?;
            s = rest;
            let had_integer = before != s.len();

            let (mut fraction, mut scale, mut had_fraction) = (0, 1.0, false);
            if let Some((b'.', rest)) = s.split_first() {
                let before = rest.len();
                (fraction, scale, s) = leading_fraction(rest);
                had_fraction = before != s.len();
            }
            if !had_integer && !had_fraction {
                return Err(invalid());
            }

            let unit_len = s
                .iter()
                .position(|&c| c == b'.' || c.is_ascii_digit())
                .unwrap_or(s.len());
            if unit_len == 0 {
                return Err(ParseDurationError::new(ParseErrorKind::MissingUnit, input));
            }
            // The unit ends at an ASCII byte or at the end, so this is a char boundary.
            let offset = input.len() - s.len();
            let unit = &input[offset..offset + unit_len];
            s = &s[unit_len..];
            let unit = unit_nanos(unit).ok_or_else(|| {
                ParseDurationError::new(ParseErrorKind::UnknownUnit(unit.to_owned()), input)
            })?;

            if value > MAX_MAGNITUDE / unit {
                return Err(invalid());
            }
            value *= unit;
            if fraction > 0 {
                // Go computes the fraction in float64 (exact to the nanosecond for up to an
                // hour's worth); the same casts give the same nanoseconds here.
                let fraction_nanos = (fraction as f64 * (unit as f64 / scale)) as u64;
                value += fraction_nanos;
                if value > MAX_MAGNITUDE {
                    return Err(invalid());
                }
            }
            total += value;
            if total > MAX_MAGNITUDE {
                return Err(invalid());
            }
        }
        if negative {
            // `total` is at most 2^63, whose negation is exactly `i64::MIN`.
            return Ok(Self::from_nanos(0_i64.wrapping_sub_unsigned(total)));
        }
        i64::try_from(total)
            .map(Self::from_nanos)
            .map_err(|_| invalid())
    }
}

/// Go's `fmtFrac`: writes `v / 10^prec`'s fraction (".5", no trailing zeros, nothing when
/// zero) to the front of `buf[..end]` and returns the new start and the integer part.
fn fmt_frac(buf: &mut [u8], end: usize, mut v: u64, prec: usize) -> (usize, u64) {
    let mut w = end;
    let mut print = false;
    for _ in 0..prec {
        let digit = v % 10;
        print = print || digit != 0;
        if print {
            w -= 1;
            buf[w] = b'0' + u8::try_from(digit).expect("a decimal digit");
        }
        v /= 10;
    }
    if print {
        w -= 1;
        buf[w] = b'.';
    }
    (w, v)
}

/// Go's `fmtInt`: writes `v` in decimal to the front of `buf[..end]`; returns the new start.
fn fmt_int(buf: &mut [u8], end: usize, mut v: u64) -> usize {
    let mut w = end;
    if v == 0 {
        w -= 1;
        buf[w] = b'0';
    }
    while v > 0 {
        w -= 1;
        buf[w] = b'0' + u8::try_from(v % 10).expect("a decimal digit");
        v /= 10;
    }
    w
}

impl fmt::Display for Duration {
    /// Writes the duration as Go's `time.Duration.String` does: `"72h3m0.5s"`, `"1m30s"`,
    /// `"1h0m0s"`; under a second in the largest unit that keeps an integer part (`"1.5ms"`,
    /// `"2µs"`, `"7ns"`); and `"0s"` for zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The longest output is "-2562047h47m16.854775808s" (25 bytes).
        let mut buf = [0_u8; 32];
        let end = buf.len();
        let mut w = end;
        let mut u = self.nanos.unsigned_abs();

        if u < SECOND {
            if u == 0 {
                return f.write_str("0s");
            }
            w -= 1;
            buf[w] = b's';
            let prec = if u < MICROSECOND {
                w -= 1;
                buf[w] = b'n';
                0
            } else if u < MILLISECOND {
                // Go writes U+00B5 MICRO SIGN, two bytes in UTF-8.
                w -= 2;
                buf[w..w + 2].copy_from_slice("\u{b5}".as_bytes());
                3
            } else {
                w -= 1;
                buf[w] = b'm';
                6
            };
            (w, u) = fmt_frac(&mut buf, w, u, prec);
            w = fmt_int(&mut buf, w, u);
        } else {
            w -= 1;
            buf[w] = b's';
            (w, u) = fmt_frac(&mut buf, w, u, 9);
            // `u` is now whole seconds.
            w = fmt_int(&mut buf, w, u % 60);
            u /= 60;
            if u > 0 {
                w -= 1;
                buf[w] = b'm';
                w = fmt_int(&mut buf, w, u % 60);
                u /= 60;
                // Hours are the largest unit, because days differ in length.
                if u > 0 {
                    w -= 1;
                    buf[w] = b'h';
                    w = fmt_int(&mut buf, w, u);
                }
            }
        }
        if self.nanos < 0 {
            w -= 1;
            buf[w] = b'-';
        }
        f.write_str(std::str::from_utf8(&buf[w..]).expect("ASCII digits, units and µ"))
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    /// Decodes a duration string; anything else fails, as `metav1.Duration.UnmarshalJSON`
    /// does, so a malformed duration is a decoding error (400) rather than a field error.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // As Kubernetes publishes metav1.Duration: a plain string, no format.
        json_schema!({ "type": "string" })
    }
}

#[cfg(test)]
mod tests;
