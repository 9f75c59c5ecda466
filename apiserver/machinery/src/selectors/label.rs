//! Label selectors: `app=web,tier!=db,env in (a,b),!legacy,version>2`.
//!
//! A port of the lexer and parser of `apimachinery:pkg/labels/selector.go`, kept close to
//! the original so that the same input gives the same selector or the same error text.

use std::collections::BTreeMap;
use std::fmt;

use battery_types::strconv::quote;
use battery_types::validation::{is_qualified_name, is_valid_label_value};

use crate::status::ApiError;

/// `selection.Operator` as label selectors use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>1` (`gt`): the label parses as an integer greater than the value.
    GreaterThan,
    /// `key<1` (`lt`)
    LessThan,
}

/// One comma-separated term of a selector.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    /// Sorted and without duplicates, as Go's `sets.String.List()` leaves them.
    values: Vec<String>,
}

impl Requirement {
    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted; empty for `Exists` and `DoesNotExist`.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// `Requirement.Matches`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| self.values.contains(v))
            }
            Operator::NotIn | Operator::NotEquals => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(label), [bound]) = (value, self.values.as_slice()) else {
                    return false;
                };
                let (Ok(label), Ok(bound)) = (label.parse::<i64>(), bound.parse::<i64>()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    label > bound
                } else {
                    label < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// `Requirement.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let op = match self.operator {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => " in ",
            Operator::NotIn => " notin ",
            Operator::GreaterThan => ">",
            Operator::LessThan => "<",
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
        };
        f.write_str(op)?;
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        f.write_str(&self.values.join(","))?;
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A parsed label selector: requirements sorted by key, all of which must match. The
/// empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// `labels.Parse`; an error is a 400 BadRequest with Go's message, e.g.
    /// `unable to parse requirement: <nil>: Invalid value: "-a": name part must ...` or
    /// `found ',', expected: !, identifier, or 'end of string'`.
    pub fn parse(selector: &str) -> Result<Self, ApiError> {
        let items = lex(selector);
        let mut requirements = Parser {
            items: &items,
            position: 0,
        }
        .parse()
        .map_err(ApiError::bad_request)?;
        // A stable sort, so that requirements on one key keep their written order.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// True when the selector has no requirements and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True when every requirement matches `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    /// `internalSelector.String()`: the requirements joined by `,`; parses back to an
    /// equal selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Go's `Lexer`. It works on bytes and its `read` returns 0 both at the end and for a NUL
/// byte, so a NUL ends the identifier it is in, and ends the whole input where a token
/// would start; both are kept.
struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    /// The text of `start..end`. Token boundaries are ASCII bytes or the ends of the input,
    /// so the slice always falls on character boundaries.
    fn text(&self, start: usize, end: usize) -> &'a str {
        self.s.get(start..end).unwrap_or_default()
    }

    fn scan_id_or_keyword(&mut self) -> (Token, &'a str) {
        let bytes = self.s.as_bytes();
        let start = self.pos;
        let mut end = start;
        while let Some(&b) = bytes.get(end) {
            if b == 0 || is_special(b) || is_whitespace(b) {
                break;
            }
            end += 1;
        }
        // Go's `read` consumes the NUL that ends an identifier; a special character or
        // a space is put back for the next token.
        self.pos = if bytes.get(end) == Some(&0) {
            end + 1
        } else {
            end
        };
        let lit = self.text(start, end);
        let token = match lit {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier,
        };
        (token, lit)
    }

    /// Go scans the longest run of special characters that is still a token; the only
    /// two-character tokens are `==` and `!=`, so that is one character or those two.
    fn scan_special_symbol(&mut self) -> (Token, &'a str) {
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let (token, len) = match (bytes.get(start), bytes.get(start + 1)) {
            (Some(b'='), Some(b'=')) => (Token::DoubleEquals, 2),
            (Some(b'!'), Some(b'=')) => (Token::NotEquals, 2),
            (Some(b'='), _) => (Token::Equals, 1),
            (Some(b'!'), _) => (Token::DoesNotExist, 1),
            (Some(b'('), _) => (Token::OpenPar, 1),
            (Some(b')'), _) => (Token::ClosedPar, 1),
            (Some(b','), _) => (Token::Comma, 1),
            (Some(b'>'), _) => (Token::GreaterThan, 1),
            // `lex` only calls this on a special character, so this is `<`.
            _ => (Token::LessThan, 1),
        };
        self.pos = start + len;
        (token, self.text(start, self.pos))
    }

    fn lex(&mut self) -> (Token, &'a str) {
        let bytes = self.s.as_bytes();
        while bytes.get(self.pos).is_some_and(|b| is_whitespace(*b)) {
            self.pos += 1;
        }
        match bytes.get(self.pos) {
            None | Some(0) => (Token::EndOfString, ""),
            Some(&b) if is_special(b) => self.scan_special_symbol(),
            Some(_) => self.scan_id_or_keyword(),
        }
    }
}

fn lex(s: &str) -> Vec<(Token, &str)> {
    let mut lexer = Lexer { s, pos: 0 };
    let mut items = Vec::new();
    loop {
        let item = lexer.lex();
        items.push(item);
        if item.0 == Token::EndOfString {
            return items;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser<'a, 'b> {
    items: &'b [(Token, &'a str)],
    position: usize,
}

impl<'a> Parser<'a, '_> {
    fn lookahead(&self, context: Context) -> (Token, &'a str) {
        let (token, lit) = self
            .items
            .get(self.position)
            .copied()
            .unwrap_or((Token::EndOfString, ""));
        // Inside values, `in` and `notin` are plain words.
        match (context, token) {
            (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, lit),
            _ => (token, lit),
        }
    }

    fn consume(&mut self, context: Context) -> (Token, &'a str) {
        let item = self.lookahead(context);
        self.position += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, lit) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, lit) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, lit) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{lit}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!("found '{lit}', expected: ',' or 'end of string'"));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        let (operator, values) = match inferred {
            Some(operator) => (operator, Vec::new()),
            None => {
                let operator = self.parse_operator()?;
                let values = match operator {
                    Operator::In | Operator::NotIn => self.parse_values()?,
                    _ => self.parse_exact_value()?,
                };
                (operator, values)
            }
        };
        new_requirement(key, operator, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let (mut token, mut lit) = self.consume(Context::Values);
        let does_not_exist = token == Token::DoesNotExist;
        if does_not_exist {
            (token, lit) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let errors = is_qualified_name(lit);
        if !errors.is_empty() {
            // Go validates against a nil field path here, which prints as `<nil>`.
            return Err(invalid_value("<nil>", lit, &errors.join("; ")));
        }
        let operator = if does_not_exist {
            Some(Operator::DoesNotExist)
        } else if matches!(
            self.lookahead(Context::Values).0,
            Token::EndOfString | Token::Comma
        ) {
            Some(Operator::Exists)
        } else {
            None
        };
        Ok((lit.to_owned(), operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (token, lit) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<Vec<String>, String> {
        let (token, lit) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (token, lit) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// The values between the parentheses; an empty place (`(,a)`, `(a,)`, `(a,,b)`)
    /// stands for the empty string.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, String> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (token, lit) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.push(lit.to_owned());
                    let (next, lit) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{lit}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    if matches!(
                        self.lookahead(Context::Values).0,
                        Token::ClosedPar | Token::Comma
                    ) {
                        values.push(String::new());
                    }
                    if self.lookahead(Context::Values).0 == Token::ClosedPar {
                        return Ok(values);
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<Vec<String>, String> {
        if matches!(
            self.lookahead(Context::Values).0,
            Token::EndOfString | Token::Comma
        ) {
            return Ok(vec![String::new()]);
        }
        let (token, lit) = self.consume(Context::Values);
        if token == Token::Identifier {
            Ok(vec![lit.to_owned()])
        } else {
            Err(format!("found '{lit}', expected: identifier"))
        }
    }
}

/// `NewRequirement` as the parser calls it: the key is already valid; values are made a
/// sorted set and checked as label values (and as integers for `gt`/`lt`).
fn new_requirement(
    key: String,
    operator: Operator,
    mut values: Vec<String>,
) -> Result<Requirement, String> {
    values.sort();
    values.dedup();
    let mut errors: Vec<String> = Vec::new();
    if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
        for (i, v) in values.iter().enumerate() {
            if v.parse::<i64>().is_err() {
                errors.push(invalid_value(
                    &format!("values[{i}]"),
                    v,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                ));
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let value_errors = is_valid_label_value(v);
        if !value_errors.is_empty() {
            errors.push(invalid_value(
                &format!("values[{i}][{key}]"),
                v,
                &value_errors.join("; "),
            ));
        }
    }
    // `utilerrors.NewAggregate(...).Error()`: one message bare, several in brackets (each
    // names its own index, so there are no duplicates to drop).
    match errors.as_slice() {
        [] => Ok(Requirement {
            key,
            operator,
            values,
        }),
        [one] => Err(one.clone()),
        many => Err(format!("[{}]", many.join(", "))),
    }
}

/// `field.Invalid(path, value, detail).Error()` for a string value.
fn invalid_value(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {}: {detail}", quote(value))
}

#[cfg(test)]
mod tests;
