//! Cases from `apimachinery:pkg/labels/selector_test.go`, plus Go's error texts.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::status::Reason;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn req(key: &str, operator: Operator, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

#[test]
fn parse_and_print_round_trip() {
    // TestSelectorParse: good strings print back without their spaces.
    for s in [
        "x=a,y=b,z=c",
        "",
        "x!=a,y=b",
        "x=",
        "x= ",
        "x=,z= ",
        "x= ,z= ",
        "!x",
        "x>1",
        "x>1,z<5",
    ] {
        let selector = LabelSelector::parse(s).unwrap();
        assert_eq!(selector.to_string(), s.replace(' ', ""), "{s:?}");
    }
    for s in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
        assert!(LabelSelector::parse(s).is_err(), "{s:?}");
    }
    // TestDeterministicParse.
    assert_eq!(
        LabelSelector::parse("x=a,a=x").unwrap().to_string(),
        LabelSelector::parse("a=x,x=a").unwrap().to_string()
    );
}

#[test]
fn set_selector_parser() {
    use Operator::*;
    let good: &[(&str, Vec<Requirement>)] = &[
        ("", vec![]),
        ("\rx", vec![req("x", Exists, &[])]),
        (
            "this-is-a-dns.domain.com/key-with-dash",
            vec![req("this-is-a-dns.domain.com/key-with-dash", Exists, &[])],
        ),
        (
            "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
            vec![req(
                "0.1.2.domain/99",
                NotIn,
                &["10.10.100.1", "tick.tack.clock"],
            )],
        ),
        ("foo  in\t (abc)", vec![req("foo", In, &["abc"])]),
        ("x notin\n (abc)", vec![req("x", NotIn, &["abc"])]),
        ("x in (abc,)", vec![req("x", In, &["", "abc"])]),
        ("x in (abc,abc)", vec![req("x", In, &["abc"])]),
        ("x in ()", vec![req("x", In, &[""])]),
        ("x in (a,,)", vec![req("x", In, &["", "a"])]),
        ("x in (a,,a,,a,,a,,)", vec![req("x", In, &["", "a"])]),
        (
            "x notin (abc,,def),bar,z in (),w",
            vec![
                req("bar", Exists, &[]),
                req("w", Exists, &[]),
                req("x", NotIn, &["", "abc", "def"]),
                req("z", In, &[""]),
            ],
        ),
        (
            "x,y in (a)",
            vec![req("x", Exists, &[]), req("y", In, &["a"])],
        ),
        ("x>1", vec![req("x", GreaterThan, &["1"])]),
        ("x<7", vec![req("x", LessThan, &["7"])]),
        (
            "x=a,y!=b,z in (h,i,j)",
            vec![
                req("x", Equals, &["a"]),
                req("y", NotEquals, &["b"]),
                req("z", In, &["h", "i", "j"]),
            ],
        ),
        ("x==a", vec![req("x", DoubleEquals, &["a"])]),
        ("x notin ( )", vec![req("x", NotIn, &[""])]),
        ("x notin (, a)", vec![req("x", NotIn, &["", "a"])]),
        ("a ", vec![req("a", Exists, &[])]),
        (
            "a in (x,y,notin, z,in)",
            vec![req("a", In, &["in", "notin", "x", "y", "z"])],
        ),
        ("notin=in", vec![req("notin", Equals, &["in"])]),
        // Requirements on one key keep their written order.
        (
            "z,z!=a",
            vec![req("z", Exists, &[]), req("z", NotEquals, &["a"])],
        ),
        // Go's lexer reads a NUL as the end of the input: it ends the word it is in, and
        // where a token would start, the selector.
        (
            "a=b\0,c",
            vec![req("a", Equals, &["b"]), req("c", Exists, &[])],
        ),
        ("a=b \0,c", vec![req("a", Equals, &["b"])]),
    ];
    for (input, want) in good {
        let selector = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(selector.requirements(), want.as_slice(), "{input:?}");
    }
    for input in [
        "x=a||y=b",
        "x,,y",
        ",x,y",
        "x nott in (y)",
        "a in (xyz),",
        "a in (xyz)b notin ()",
        "a in (xyz abc)",
        "a notin(",
        "a (",
        "(",
    ] {
        assert!(LabelSelector::parse(input).is_err(), "{input:?}");
    }
}

#[test]
fn go_error_messages() {
    let cases = [
        (
            ",x",
            "found ',', expected: !, identifier, or 'end of string'",
        ),
        ("x,", "found '', expected: identifier after ','"),
        ("x=a==b", "found '==', expected: ',' or 'end of string'"),
        (
            "x nott in (y)",
            "unable to parse requirement: found 'nott', expected: in, notin, =, ==, !=, gt, lt",
        ),
        (
            "x in y",
            "unable to parse requirement: found 'y' expected: '('",
        ),
        (
            "x in (",
            "unable to parse requirement: found '', expected: ',', ')' or identifier",
        ),
        (
            "x in (a b)",
            "unable to parse requirement: found 'b', expected: ',' or ')'",
        ),
        (
            "x in (a,=)",
            "unable to parse requirement: found '=', expected: ',', or identifier",
        ),
        (
            "x=(",
            "unable to parse requirement: found '(', expected: identifier",
        ),
        (
            "!",
            "unable to parse requirement: found '', expected: identifier",
        ),
        ("a,\0b", "found '', expected: identifier after ','"),
        (
            "x<a",
            "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer",
        ),
    ];
    for (input, want) in cases {
        let err = LabelSelector::parse(input).unwrap_err();
        assert_eq!(err.reason(), Reason::BadRequest);
        assert_eq!(err.message(), want, "{input:?}");
    }
    // Invalid keys and values name the field as Go does; the rule's wording is the
    // validators' own.
    let err = LabelSelector::parse("-x").unwrap_err();
    assert!(
        err.message()
            .starts_with("unable to parse requirement: <nil>: Invalid value: \"-x\": name part "),
        "{}",
        err.message()
    );
    let err = LabelSelector::parse("x=-v").unwrap_err();
    assert!(err.message().starts_with("unable to parse requirement: values[0][x]: Invalid value: \"-v\": a valid label must be"), "{}", err.message());
    // Several invalid values are reported together, in brackets.
    let err = LabelSelector::parse("x>-a").unwrap_err();
    assert!(
        err.message().starts_with(
            "unable to parse requirement: [values[0]: Invalid value: \"-a\": for 'Gt'"
        ),
        "{}",
        err.message()
    );
}

/// A selector, a label set, and whether it matches.
type MatchCase = (&'static str, &'static [(&'static str, &'static str)], bool);

#[test]
fn matches() {
    let cases: &[MatchCase] = &[
        ("", &[("x", "y")], true),
        ("x=y", &[("x", "y")], true),
        ("x=y,z=w", &[("x", "y"), ("z", "w")], true),
        ("x!=y,z!=w", &[("x", "z"), ("z", "a")], true),
        ("notin=in", &[("notin", "in")], true),
        ("x", &[("x", "z")], true),
        ("!x", &[("y", "z")], true),
        ("x>1", &[("x", "2")], true),
        ("x<1", &[("x", "0")], true),
        ("x=z", &[], false),
        ("x=y", &[("x", "z")], false),
        ("x=y,z=w", &[("x", "w"), ("z", "w")], false),
        ("x!=y,z!=w", &[("x", "z"), ("z", "w")], false),
        ("x", &[("y", "z")], false),
        ("!x", &[("x", "z")], false),
        ("x>1", &[("x", "0")], false),
        ("x<1", &[("x", "2")], false),
        ("z>1", &[("z", "v2")], false),
        (
            "x in (foo),y notin (alpha)",
            &[("x", "foo"), ("y", "baz")],
            true,
        ),
        (
            "x in (foo),y in (alpha)",
            &[("x", "foo"), ("y", "baz")],
            false,
        ),
        ("x notin (),y", &[("y", "")], true),
        ("!x,y", &[("y", "")], true),
        ("x notin (),!y", &[("y", "")], false),
        ("x in ()", &[("y", "baz")], false),
        ("x=", &[("x", "")], true),
    ];
    for (selector, set, want) in cases {
        let parsed = LabelSelector::parse(selector).unwrap();
        assert_eq!(
            parsed.matches(&labels(set)),
            *want,
            "{selector:?} on {set:?}"
        );
    }
}

#[test]
fn to_string() {
    use Operator::*;
    let cases = [
        (
            vec![
                req("x", In, &["abc", "def"]),
                req("y", NotIn, &["jkl"]),
                req("z", Exists, &[]),
            ],
            "x in (abc,def),y notin (jkl),z",
        ),
        (
            vec![
                req("x", NotIn, &["abc", "def"]),
                req("y", NotEquals, &["jkl"]),
                req("z", DoesNotExist, &[]),
            ],
            "x notin (abc,def),y!=jkl,!z",
        ),
        (
            vec![
                req("x", NotIn, &["abc"]),
                req("y", In, &["jkl", "mno"]),
                req("z", NotIn, &[""]),
            ],
            "x notin (abc),y in (jkl,mno),z notin ()",
        ),
        (
            vec![
                req("x", Equals, &["abc"]),
                req("y", DoubleEquals, &["jkl"]),
                req("z", NotEquals, &["a"]),
                req("z", Exists, &[]),
            ],
            "x=abc,y==jkl,z!=a,z",
        ),
        (
            vec![
                req("x", GreaterThan, &["2"]),
                req("y", LessThan, &["8"]),
                req("z", Exists, &[]),
            ],
            "x>2,y<8,z",
        ),
    ];
    for (requirements, want) in cases {
        assert_eq!(LabelSelector { requirements }.to_string(), want);
    }
}

fn label_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,10}[a-zA-Z0-9])?"
}

fn label_key() -> impl Strategy<Value = String> {
    (
        proptest::option::of("[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}"),
        label_name(),
    )
        .prop_map(|(prefix, name)| match prefix {
            Some(prefix) => format!("{prefix}/{name}"),
            None => name,
        })
}

fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), label_name()]
}

fn requirement() -> impl Strategy<Value = Requirement> {
    use Operator::*;
    let op = prop_oneof![
        Just(Equals),
        Just(DoubleEquals),
        Just(NotEquals),
        Just(In),
        Just(NotIn),
        Just(Exists),
        Just(DoesNotExist),
        Just(GreaterThan),
        Just(LessThan),
    ];
    (
        label_key(),
        op,
        proptest::collection::vec(label_value(), 1..4),
        any::<u32>(),
    )
        .prop_map(|(key, operator, mut values, number)| {
            values.sort();
            values.dedup();
            let values = match operator {
                Exists | DoesNotExist => vec![],
                In | NotIn => values,
                GreaterThan | LessThan => vec![number.to_string()],
                Equals | DoubleEquals | NotEquals => values.into_iter().take(1).collect(),
            };
            Requirement {
                key,
                operator,
                values,
            }
        })
}

proptest! {
    /// Printing a valid selector and parsing it back gives the same selector.
    #[test]
    fn print_parse_round_trip(mut requirements in proptest::collection::vec(requirement(), 0..6)) {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        let selector = LabelSelector { requirements };
        let printed = selector.to_string();
        let parsed = LabelSelector::parse(&printed).map_err(|e| TestCaseError::fail(format!("{printed:?}: {e}")))?;
        prop_assert_eq!(parsed, selector);
    }

    /// Whatever parses, prints to a fixed point.
    #[test]
    fn parse_print_fixed_point(input in "[a-z0-9 !=(),<>.\\-/]{0,40}") {
        if let Ok(selector) = LabelSelector::parse(&input) {
            let printed = selector.to_string();
            let again = LabelSelector::parse(&printed).map_err(|e| TestCaseError::fail(format!("{printed:?}: {e}")))?;
            prop_assert_eq!(again.to_string(), printed);
        }
    }

    #[test]
    fn never_panics(input in ".{0,100}", set in proptest::collection::btree_map(".{0,8}", ".{0,8}", 0..4)) {
        if let Ok(selector) = LabelSelector::parse(&input) {
            let _ = selector.matches(&set);
        }
    }
}
