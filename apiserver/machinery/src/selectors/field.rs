//! Field selectors: `metadata.name=x,metadata.namespace!=kube-system`.
//!
//! The syntax of `apimachinery:pkg/fields/selector.go`: terms split on unescaped commas,
//! each `field=value`, `field==value` or `field!=value`, with `\\`, `\,` and `\=` escapes in
//! the value. Which fields exist is the resource's business: the parser accepts any name
//! and [`FieldSelector::check_supported`] rejects the ones a resource does not serve, as
//! Go's `ConvertFieldLabel` does after parsing.

use std::fmt;

use crate::status::ApiError;

/// The comparison of a field term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `=` or `==`.
    Equals,
    /// `!=`.
    NotEquals,
}

/// One `field<op>value` term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldTerm {
    field: String,
    operator: FieldOperator,
    value: String,
}

impl FieldTerm {
    /// The field name, e.g. `metadata.name`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The operator.
    pub fn operator(&self) -> FieldOperator {
        self.operator
    }

    /// The unescaped value.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for FieldTerm {
    /// `hasTerm.String()` / `notHasTerm.String()`: `==` prints as `=`, the value escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_value(&self.value))
    }
}

/// A parsed field selector: all terms must hold. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    /// In the order of their text, since Go sorts the terms before parsing them.
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// `fields.ParseSelector`; an error is a 400 BadRequest with Go's message, e.g.
    /// `invalid selector: 'a'; can't understand 'a'`.
    pub fn parse(selector: &str) -> Result<Self, ApiError> {
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut terms = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            let Some((field, operator, raw)) = split_term(part) else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                )));
            };
            let value = unescape_value(raw).map_err(ApiError::bad_request)?;
            terms.push(FieldTerm {
                field: field.to_owned(),
                operator,
                value,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// True when the selector has no terms and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The terms.
    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// `RequiresExactMatch`: the value `field` must equal for anything to match, if the
    /// selector pins one (`metadata.name=x` does; `metadata.name!=x` does not).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.operator == FieldOperator::Equals)
            .map(|t| t.value.as_str())
    }

    /// Rejects the first field the resource does not serve with Go's 400
    /// `field label not supported: <field>` (the `ConvertFieldLabel` of custom resources,
    /// `apiextensions-apiserver:pkg/apiserver/conversion/converter.go`). Every resource
    /// serves `metadata.name`; namespaced ones also `metadata.namespace`.
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), ApiError> {
        match self
            .terms
            .iter()
            .find(|t| !supported.contains(&t.field.as_str()))
        {
            Some(term) => Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                term.field
            ))),
            None => Ok(()),
        }
    }

    /// True when every term holds; `value_of` gives a field's value, and a field it does
    /// not know reads as the empty string, as Go's `Fields.Get` does.
    pub fn matches<'a>(&self, value_of: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.terms.iter().all(|t| {
            let value = value_of(&t.field).unwrap_or_default();
            (value == t.value) == (t.operator == FieldOperator::Equals)
        })
    }
}

impl fmt::Display for FieldSelector {
    /// `andTerm.String()`: the terms joined by `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, term) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{term}")?;
        }
        Ok(())
    }
}

/// `fields.EscapeValue`.
fn escape_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

/// `fields.UnescapeValue`, with Go's error texts. Go prints the offending rune with `%v`,
/// which for a rune is its code point as a number (`unescaped character in value: 61`).
fn unescape_value(s: &str) -> Result<String, String> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    ));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                ));
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_owned());
    }
    Ok(out)
}

/// `splitTerms`: splits on commas that are not escaped by a backslash.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// `splitTerm`: the first position where `!=`, `==` or `=` starts (tried in that order)
/// divides field from value.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ]
        .into_iter()
        .find(|(op, _)| rest.starts_with(op))
        .map(|(op, operator)| (&term[..i], operator, &rest[op.len()..]))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::status::Reason;

    fn term(field: &str, operator: FieldOperator, value: &str) -> FieldTerm {
        FieldTerm {
            field: field.into(),
            operator,
            value: value.into(),
        }
    }

    #[test]
    fn parse() {
        use FieldOperator::*;
        let cases: &[(&str, Vec<FieldTerm>)] = &[
            ("", vec![]),
            (",,", vec![]),
            ("metadata.name=x", vec![term("metadata.name", Equals, "x")]),
            ("metadata.name==x", vec![term("metadata.name", Equals, "x")]),
            ("a!=b", vec![term("a", NotEquals, "b")]),
            ("a=", vec![term("a", Equals, "")]),
            ("=a", vec![term("", Equals, "a")]),
            // Terms are sorted by their text.
            (
                "b=1,a=2",
                vec![term("a", Equals, "2"), term("b", Equals, "1")],
            ),
            // Their raw text: `==` sorts before `=a`, so printed (`a=b,a=a`) and parsed
            // again the same terms come in the other order, as in Go.
            (
                "a==b,a=a",
                vec![term("a", Equals, "b"), term("a", Equals, "a")],
            ),
            (r"a=x\,y\=z\\", vec![term("a", Equals, r"x,y=z\")]),
            ("a=!b", vec![term("a", Equals, "!b")]),
            (
                "a=b\\,c,d=e",
                vec![term("a", Equals, "b,c"), term("d", Equals, "e")],
            ),
        ];
        for (input, want) in cases {
            let selector = FieldSelector::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(selector.terms(), want.as_slice(), "{input:?}");
        }
    }

    #[test]
    fn go_error_messages() {
        let cases = [
            ("a", "invalid selector: 'a'; can't understand 'a'"),
            ("x=1,a", "invalid selector: 'x=1,a'; can't understand 'a'"),
            (
                "a=b=c",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                r"a=b\c",
                r"invalid field selector: invalid escape sequence: \c",
            ),
            (
                r"a=b\",
                r"invalid field selector: invalid escape sequence: \",
            ),
        ];
        for (input, want) in cases {
            let err = FieldSelector::parse(input).unwrap_err();
            assert_eq!(err.reason(), Reason::BadRequest);
            assert_eq!(err.message(), want, "{input:?}");
        }
    }

    #[test]
    fn supported_fields_and_matching() {
        let selector =
            FieldSelector::parse("metadata.name=x,metadata.namespace!=kube-system").unwrap();
        assert!(
            selector
                .check_supported(&["metadata.name", "metadata.namespace"])
                .is_ok()
        );
        let err = selector.check_supported(&["metadata.name"]).unwrap_err();
        assert_eq!(
            err.message(),
            "field label not supported: metadata.namespace"
        );
        assert_eq!(err.code(), http::StatusCode::BAD_REQUEST);
        assert_eq!(selector.requires_exact_match("metadata.name"), Some("x"));
        assert_eq!(selector.requires_exact_match("metadata.namespace"), None);

        let fields = |name: &'static str, ns: &'static str| {
            move |f: &str| match f {
                "metadata.name" => Some(name),
                "metadata.namespace" => Some(ns),
                _ => None,
            }
        };
        assert!(selector.matches(fields("x", "default")));
        assert!(!selector.matches(fields("y", "default")));
        assert!(!selector.matches(fields("x", "kube-system")));
        // An unknown field reads as "".
        assert!(
            FieldSelector::parse("spec.x=")
                .unwrap()
                .matches(fields("x", "d"))
        );
        assert!(FieldSelector::parse("").unwrap().matches(|_| None));
    }

    #[test]
    fn to_string() {
        let selector = FieldSelector::parse(r"b==x\,y,a!=\=").unwrap();
        assert_eq!(selector.to_string(), r"a!=\=,b=x\,y");
    }

    fn field_term() -> impl Strategy<Value = FieldTerm> {
        let operator = prop_oneof![Just(FieldOperator::Equals), Just(FieldOperator::NotEquals)];
        ("[a-zA-Z0-9_.-]{1,12}", operator, ".{0,12}").prop_map(|(field, operator, value)| {
            FieldTerm {
                field,
                operator,
                value,
            }
        })
    }

    proptest! {
        /// Printing a selector and parsing it back gives the same terms.
        #[test]
        fn print_parse_round_trip(terms in proptest::collection::vec(field_term(), 0..5)) {
            let mut terms = terms;
            terms.sort_by_key(|t| t.to_string());
            let selector = FieldSelector { terms };
            let printed = selector.to_string();
            let parsed = FieldSelector::parse(&printed).map_err(|e| TestCaseError::fail(format!("{printed:?}: {e}")))?;
            prop_assert_eq!(parsed, selector);
        }

        #[test]
        fn never_panics(input in ".{0,100}") {
            if let Ok(selector) = FieldSelector::parse(&input) {
                let _ = selector.matches(|_| Some("x"));
                let _ = selector.check_supported(&["metadata.name"]);
                let again = FieldSelector::parse(&selector.to_string());
                prop_assert!(again.is_ok());
            }
        }
    }
}
