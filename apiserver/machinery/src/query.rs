//! A serde `Deserializer` over a URL query that decodes values the way Go's apiserver does.
//!
//! Go parses the query into `url.Values` (`net/url.ParseQuery`) and converts each field with
//! the functions of `apimachinery:pkg/runtime/conversion.go`: a scalar takes the *first*
//! value of a repeated key, a slice takes them all, a bool is false only for `0` or
//! (any case) `false`, and integers are `strconv.ParseInt`. serde_urlencoded does none of
//! this (repeated keys are an error, only `true`/`false` are booleans), so clients written
//! against Go — `watch=1`, `dryRun=All&dryRun=All` — would be refused.

use std::collections::BTreeMap;
use std::fmt;

use battery_types::strconv::quote;
use serde::de::value::{SeqDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

/// Why a query could not be decoded; its message becomes a 400 BadRequest as in Go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError(String);

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QueryError {}

impl de::Error for QueryError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        QueryError(msg.to_string())
    }
}

/// `url.Values`: every key with all its values, in the order they came.
///
/// A `BTreeMap` rather than a hash map so that, when several fields are wrong, the same one
/// is reported every time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueryValues(BTreeMap<String, Vec<String>>);

impl QueryValues {
    /// `url.ParseQuery` semantics: pairs split on `&`; a pair containing `;` or a malformed
    /// `%` escape is skipped (Go records an error that the apiserver ignores); `+` is a
    /// space; a key without `=` has the empty value. Bytes that are not UTF-8 after
    /// unescaping become U+FFFD, since Rust strings must be UTF-8.
    pub(crate) fn parse(query: &str) -> Self {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pair in query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(key), Some(value)) = (unescape(key, true), unescape(value, true)) else {
                continue;
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            values
                .entry(key)
                .or_default()
                .push(String::from_utf8_lossy(&value).into_owned());
        }
        QueryValues(values)
    }

    /// The first value of `key`, as Go's `Convert_Slice_string_To_string` takes it.
    pub(crate) fn first(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.first()).map(String::as_str)
    }
}

/// Decodes `%XX` escapes (and `+` as a space when `plus_is_space`, as in a query) into
/// bytes; `None` for a malformed escape, which Go's `url.QueryUnescape`/`PathUnescape`
/// reject.
pub(crate) fn unescape(s: &str, plus_is_space: bool) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|c| (*c as char).to_digit(16))?;
                let lo = bytes.get(i + 2).and_then(|c| (*c as char).to_digit(16))?;
                // Two hex digits are at most 0xff, so the cast cannot truncate.
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Deserializes `T` from a raw query string (without the leading `?`).
pub(crate) fn from_query<T: de::DeserializeOwned>(query: &str) -> Result<T, QueryError> {
    T::deserialize(QueryDeserializer(QueryValues::parse(query)))
}

struct QueryDeserializer(QueryValues);

impl<'de> de::Deserializer<'de> for QueryDeserializer {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_map(Entries {
            iter: self.0.0.into_iter(),
            value: None,
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

struct Entries {
    iter: std::collections::btree_map::IntoIter<String, Vec<String>>,
    value: Option<Vec<String>>,
}

impl<'de> MapAccess<'de> for Entries {
    type Error = QueryError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, QueryError> {
        match self.iter.next() {
            Some((key, values)) => {
                self.value = Some(values);
                let key: StringDeserializer<QueryError> = key.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, QueryError> {
        // serde calls this exactly once after each key; an empty list stands in should a
        // caller ever break that contract, rather than a panic.
        seed.deserialize(Values(self.value.take().unwrap_or_default()))
    }
}

/// All the values of one key. Scalars read the first; sequences read them all.
struct Values(Vec<String>);

impl Values {
    fn first(self) -> String {
        self.0.into_iter().next().unwrap_or_default()
    }
}

/// `strconv.ParseInt(s, 10, 64)` with Go's error text, e.g.
/// `strconv.ParseInt: parsing "abc": invalid syntax`.
fn parse_int<T: std::str::FromStr>(s: &str) -> Result<T, QueryError> {
    s.parse::<T>().map_err(|_| {
        let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
        let why = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            "value out of range"
        } else {
            "invalid syntax"
        };
        QueryError(format!("strconv.ParseInt: parsing {}: {why}", quote(s)))
    })
}

/// Go's `strconv.ParseBool`, stricter than the query conversion: used for `?pretty=`.
pub(crate) fn go_parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `Convert_Slice_string_To_bool`: false only for `0` and `false` in any case.
pub(crate) fn go_bool(s: &str) -> bool {
    !(s == "0" || s.eq_ignore_ascii_case("false"))
}

macro_rules! deserialize_int {
    ($($method:ident => $visit:ident: $ty:ty),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
            visitor.$visit(parse_int::<$ty>(&self.first())?)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Values {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_string(self.first())
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_bool(go_bool(&self.first()))
    }

    deserialize_int! {
        deserialize_i8 => visit_i8: i8, deserialize_i16 => visit_i16: i16,
        deserialize_i32 => visit_i32: i32, deserialize_i64 => visit_i64: i64,
        deserialize_u8 => visit_u8: u8, deserialize_u16 => visit_u16: u16,
        deserialize_u32 => visit_u32: u32, deserialize_u64 => visit_u64: u64,
    }

    /// A key that is present is `Some`, even with an empty value, as Go's pointer
    /// conversions do.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        let items = self.0.into_iter().map(|v| Values(vec![v]));
        visitor.visit_seq(SeqDeserializer::new(items))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        let value: StringDeserializer<QueryError> = self.first().into_deserializer();
        visitor.visit_enum(value)
    }

    forward_to_deserialize_any! {
        i128 u128 f32 f64 char str string bytes byte_buf unit unit_struct tuple
        tuple_struct map struct identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, QueryError> for Values {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Sample {
        watch: bool,
        limit: i64,
        timeout_seconds: Option<i64>,
        send_initial_events: Option<bool>,
        dry_run: Vec<String>,
        label_selector: Option<String>,
    }

    #[test]
    fn go_conversions() {
        let cases: &[(&str, Sample)] = &[
            ("", Sample::default()),
            (
                "watch=1",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            (
                "watch=true",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            (
                "watch=TRUE",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            // Go: anything but "0" and "false" is true, the empty value included.
            (
                "watch=",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            (
                "watch",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            (
                "watch=yes",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            ("watch=0", Sample::default()),
            ("watch=False", Sample::default()),
            // The first of repeated values wins.
            ("watch=0&watch=1", Sample::default()),
            (
                "limit=500&limit=abc",
                Sample {
                    limit: 500,
                    ..Default::default()
                },
            ),
            // `+` is a space in a query; an escaped one is a sign.
            (
                "limit=%2B7",
                Sample {
                    limit: 7,
                    ..Default::default()
                },
            ),
            (
                "timeoutSeconds=-1",
                Sample {
                    timeout_seconds: Some(-1),
                    ..Default::default()
                },
            ),
            (
                "sendInitialEvents=",
                Sample {
                    send_initial_events: Some(true),
                    ..Default::default()
                },
            ),
            (
                "sendInitialEvents=false",
                Sample {
                    send_initial_events: Some(false),
                    ..Default::default()
                },
            ),
            (
                "dryRun=All&dryRun=x",
                Sample {
                    dry_run: vec!["All".into(), "x".into()],
                    ..Default::default()
                },
            ),
            (
                "labelSelector=a%3Db+c%2Cd&labelSelector=ignored",
                Sample {
                    label_selector: Some("a=b c,d".into()),
                    ..Default::default()
                },
            ),
            // Pairs Go's ParseQuery drops: a semicolon, a malformed escape.
            (
                "watch=1;x&limit=3",
                Sample {
                    limit: 3,
                    ..Default::default()
                },
            ),
            (
                "limit=%zz&watch=1",
                Sample {
                    watch: true,
                    ..Default::default()
                },
            ),
            ("&&unknown=1&&", Sample::default()),
        ];
        for (query, want) in cases {
            assert_eq!(
                &from_query::<Sample>(query).unwrap(),
                want,
                "query {query:?}"
            );
        }
    }

    #[test]
    fn go_int_errors() {
        let cases = [
            (
                "limit=abc",
                r#"strconv.ParseInt: parsing "abc": invalid syntax"#,
            ),
            ("limit=", r#"strconv.ParseInt: parsing "": invalid syntax"#),
            (
                "limit=+7",
                r#"strconv.ParseInt: parsing " 7": invalid syntax"#,
            ),
            (
                "limit=1.5",
                r#"strconv.ParseInt: parsing "1.5": invalid syntax"#,
            ),
            (
                "timeoutSeconds=%20",
                r#"strconv.ParseInt: parsing " ": invalid syntax"#,
            ),
            (
                "limit=99999999999999999999",
                r#"strconv.ParseInt: parsing "99999999999999999999": value out of range"#,
            ),
        ];
        for (query, want) in cases {
            assert_eq!(
                from_query::<Sample>(query).unwrap_err().to_string(),
                want,
                "query {query:?}"
            );
        }
    }

    #[test]
    fn unescape_rules() {
        assert_eq!(unescape("a+b", true).as_deref(), Some(&b"a b"[..]));
        assert_eq!(unescape("a+b", false).as_deref(), Some(&b"a+b"[..]));
        assert_eq!(unescape("%2F%2f", false).as_deref(), Some(&b"//"[..]));
        assert_eq!(unescape("%", false), None);
        assert_eq!(unescape("%4", false), None);
        assert_eq!(unescape("%g0", false), None);
        assert_eq!(unescape("%ff", false).as_deref(), Some(&[0xff_u8][..]));
        // Not UTF-8 after decoding: the query keeps a replacement character.
        assert_eq!(QueryValues::parse("a=%ff").first("a"), Some("\u{fffd}"));
    }

    proptest! {
        #[test]
        fn never_panics(query in ".{0,200}") {
            let _ = from_query::<Sample>(&query);
            let _ = QueryValues::parse(&query);
        }

        #[test]
        fn never_panics_on_query_alphabet(query in "[a-zA-Z=&%+;0-9]{0,100}") {
            let _ = from_query::<Sample>(&query);
        }
    }
}
