//! Tables from Go's `src/time/time_test.go` (`durationTests`, `parseDurationTests`,
//! `parseDurationErrorTests`), so both directions agree with `time.Duration`.

use proptest::prelude::*;

use super::*;

const NS: i64 = 1;
const US: i64 = 1_000 * NS;
const MS: i64 = 1_000 * US;
const S: i64 = 1_000 * MS;
const M: i64 = 60 * S;
const H: i64 = 60 * M;

#[test]
fn formats_like_go() {
    let cases: &[(i64, &str)] = &[
        (0, "0s"),
        (NS, "1ns"),
        (1_100 * NS, "1.1µs"),
        (2_200 * US, "2.2ms"),
        (3_300 * MS, "3.3s"),
        (4 * M + 5 * S, "4m5s"),
        (4 * M + 5_001 * MS, "4m5.001s"),
        (5 * H + 6 * M + 7_001 * MS, "5h6m7.001s"),
        (8 * M + NS, "8m0.000000001s"),
        (H, "1h0m0s"),
        (90 * S, "1m30s"),
        (10 * S, "10s"),
        (-1_500 * US, "-1.5ms"),
        (i64::MAX, "2562047h47m16.854775807s"),
        (i64::MIN, "-2562047h47m16.854775808s"),
    ];
    for &(nanos, text) in cases {
        assert_eq!(Duration::from_nanos(nanos).to_string(), text, "{nanos}ns");
    }
}

#[test]
fn parses_like_go() {
    let cases: &[(&str, i64)] = &[
        ("0", 0),
        ("5s", 5 * S),
        ("30s", 30 * S),
        ("1478s", 1_478 * S),
        ("-5s", -5 * S),
        ("+5s", 5 * S),
        ("-0", 0),
        ("+0", 0),
        ("5.0s", 5 * S),
        ("5.6s", 5 * S + 600 * MS),
        ("5.s", 5 * S),
        (".5s", 500 * MS),
        ("1.0s", S),
        ("1.00s", S),
        ("1.004s", S + 4 * MS),
        ("1.0040s", S + 4 * MS),
        ("100.00100s", 100 * S + MS),
        ("10ns", 10 * NS),
        ("11us", 11 * US),
        ("12\u{b5}s", 12 * US),
        ("12\u{3bc}s", 12 * US),
        ("13ms", 13 * MS),
        ("14s", 14 * S),
        ("15m", 15 * M),
        ("16h", 16 * H),
        ("3h30m", 3 * H + 30 * M),
        ("10.5s4m", 4 * M + 10 * S + 500 * MS),
        ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
        (
            "1h2m3s4ms5us6ns",
            H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS,
        ),
        ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
        ("52763797000ns", 52_763_797_000 * NS),
        ("0.3333333333333333333h", 20 * M),
        ("9007199254740993ns", (1 << 53) + 1),
        ("9223372036854775807ns", i64::MAX),
        ("9223372036854775.807us", i64::MAX),
        ("9223372036s854ms775us807ns", i64::MAX),
        ("-9223372036854775808ns", i64::MIN),
        ("-9223372036854775.808us", i64::MIN),
        ("-9223372036s854ms775us808ns", i64::MIN),
        ("-2562047h47m16.854775808s", i64::MIN),
        ("0.100000000000000000000h", 6 * M),
        (
            "0.830103483285477580700h",
            49 * M + 48 * S + 372_539_827 * NS,
        ),
    ];
    for &(text, nanos) in cases {
        assert_eq!(
            text.parse::<Duration>(),
            Ok(Duration::from_nanos(nanos)),
            "{text}"
        );
    }
}

#[test]
fn refuses_like_go() {
    let cases: &[(&str, &str)] = &[
        ("", r#"time: invalid duration """#),
        ("3", r#"time: missing unit in duration "3""#),
        ("-", r#"time: invalid duration "-""#),
        ("s", r#"time: invalid duration "s""#),
        (".", r#"time: invalid duration ".""#),
        ("-.", r#"time: invalid duration "-.""#),
        (".s", r#"time: invalid duration ".s""#),
        ("+.s", r#"time: invalid duration "+.s""#),
        ("1d", r#"time: unknown unit "d" in duration "1d""#),
        ("1m 30s", r#"time: unknown unit "m " in duration "1m 30s""#),
        ("\u{fffd}", r#"time: invalid duration "\xef\xbf\xbd""#),
        (
            "9223372036854775810ns",
            r#"time: invalid duration "9223372036854775810ns""#,
        ),
        (
            "9223372036854775808ns",
            r#"time: invalid duration "9223372036854775808ns""#,
        ),
        (
            "-9223372036854775809ns",
            r#"time: invalid duration "-9223372036854775809ns""#,
        ),
        (
            "9223372036854776us",
            r#"time: invalid duration "9223372036854776us""#,
        ),
        ("3000000h", r#"time: invalid duration "3000000h""#),
        (
            "9223372036854775.808us",
            r#"time: invalid duration "9223372036854775.808us""#,
        ),
        (
            "9223372036854ms775us808ns",
            r#"time: invalid duration "9223372036854ms775us808ns""#,
        ),
    ];
    for &(text, message) in cases {
        let error = text.parse::<Duration>().expect_err(text);
        assert_eq!(error.to_string(), message, "{text:?}");
    }
}

#[test]
fn serde_uses_the_string_form() {
    let duration: Duration = serde_json::from_str(r#""1m30s""#).unwrap();
    assert_eq!(duration, Duration::from_secs(90));
    assert_eq!(serde_json::to_string(&duration).unwrap(), r#""1m30s""#);

    let error = serde_json::from_str::<Duration>(r#""ten seconds""#).unwrap_err();
    assert!(
        error
            .to_string()
            .contains(r#"time: invalid duration "ten seconds""#),
        "{error}"
    );
    // Go's metav1.Duration refuses a bare number too: it is not a string.
    serde_json::from_str::<Duration>("10").unwrap_err();
}

#[test]
fn converts_to_and_from_std() {
    assert_eq!(
        Duration::from_secs(10).to_std(),
        Some(std::time::Duration::from_secs(10))
    );
    assert_eq!(Duration::from_nanos(-1).to_std(), None);
    assert_eq!(
        Duration::try_from(std::time::Duration::from_millis(1_500)),
        Ok(Duration::from_nanos(1_500 * MS))
    );
    assert_eq!(
        Duration::try_from(std::time::Duration::MAX),
        Err(DurationOutOfRange)
    );
}

proptest! {
    #[test]
    fn every_duration_round_trips(nanos in any::<i64>()) {
        let duration = Duration::from_nanos(nanos);
        prop_assert_eq!(duration.to_string().parse::<Duration>(), Ok(duration));
    }

    #[test]
    fn parsing_never_panics(text in "\\PC{0,24}") {
        let _ = text.parse::<Duration>();
    }

    #[test]
    fn composite_strings_add_up(h in 0_i64..2_000_000, m in 0_i64..60, s in 0_i64..60, frac in 0_i64..1_000_000_000) {
        let text = format!("{h}h{m}m{s}.{frac:09}s");
        let expected = h * H + m * M + s * S + frac;
        prop_assert_eq!(text.parse::<Duration>(), Ok(Duration::from_nanos(expected)));
    }
}
