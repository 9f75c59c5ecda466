//! Just enough of apimachinery's `resource.Quantity` (`apimachinery:pkg/api/resource/
//! quantity.go`) to compare a ResourceQuota's `hard` with what claims use, and to write
//! what they use the way kube-apiserver prints a quantity.

/// Binary suffixes, largest first, as `BinarySI` prints them.
const BINARY: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];
/// More digits than any quantity kube-apiserver accepts: past it, arithmetic could
/// overflow.
const MAX_DIGITS: usize = 30;

/// A quantity in thousandths of its unit, rounded up as `Quantity.MilliValue` rounds.
/// `None` for what kube-apiserver would not have accepted (and negative amounts, which no
/// quota's `hard` holds).
pub fn parse_milli(quantity: &str) -> Option<i128> {
    let unsigned = quantity.strip_prefix('+').unwrap_or(quantity);
    let end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.len() + fraction.len() == 0
        || fraction.contains('.')
        || whole.len() + fraction.len() > MAX_DIGITS
    {
        return None;
    }
    let (power_of_two, power_of_ten) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => match BINARY.iter().find(|(s, _)| *s == suffix) {
            Some((_, bits)) => (*bits, 0),
            None => (0, exponent(suffix)?),
        },
    };
    let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
    let scaled = digits.checked_mul(1i128.checked_shl(power_of_two)?)?;
    let scale = power_of_ten + 3 - i32::try_from(fraction.len()).ok()?;
    if scale >= 0 {
        scaled.checked_mul(10i128.checked_pow(scale.unsigned_abs())?)
    } else {
        let divisor = 10i128.checked_pow(scale.unsigned_abs())?;
        Some((scaled + divisor - 1) / divisor)
    }
}

/// The `e3` / `E-2` of a decimal exponent suffix.
fn exponent(suffix: &str) -> Option<i32> {
    let digits = suffix.strip_prefix(['e', 'E'])?;
    let value: i32 = digits.parse().ok()?;
    (value.abs() <= 18).then_some(value)
}

/// A whole count as `DecimalSI` prints it.
pub fn decimal(units: i64) -> String {
    units.to_string()
}

/// Bytes as `BinarySI` prints them: the largest binary suffix that divides them.
pub fn binary(bytes: i64) -> String {
    if bytes != 0 {
        for (suffix, bits) in BINARY {
            if bytes % (1i64 << bits) == 0 {
                return format!("{}{suffix}", bytes >> bits);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_thousandths_rounded_up() {
        let cases = [
            ("10", Some(10_000)),
            ("+3", Some(3_000)),
            ("500m", Some(500)),
            ("1.5", Some(1_500)),
            ("0.0001", Some(1)),
            ("2k", Some(2_000_000)),
            ("1Ki", Some(1_024_000)),
            ("1Gi", Some(1_073_741_824_000)),
            ("1.5Gi", Some(1_610_612_736_000)),
            ("2G", Some(2_000_000_000_000)),
            ("1e3", Some(1_000_000)),
            ("5E-3", Some(5)),
            ("1E", Some(1_000_000_000_000_000_000_000)),
            ("", None),
            (".", None),
            ("1.2.3", None),
            ("-1", None),
            ("1Xi", None),
            ("1e99", None),
            ("12345678901234567890123456789012", None),
        ];
        for (quantity, want) in cases {
            assert_eq!(parse_milli(quantity), want, "{quantity:?}");
        }
    }

    #[test]
    fn bytes_print_with_the_largest_binary_suffix_that_divides_them() {
        assert_eq!(binary(0), "0");
        assert_eq!(binary(1000), "1000");
        assert_eq!(binary(1 << 30), "1Gi");
        assert_eq!(binary(3 << 29), "1536Mi");
        assert_eq!(binary(10 << 30), "10Gi");
        assert_eq!(decimal(10), "10");
    }
}
