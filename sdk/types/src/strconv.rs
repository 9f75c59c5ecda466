//! Go's `strconv` quoting, which Kubernetes' messages use (`%q`) wherever they name an
//! object or echo a value: apimachinery's Status messages and `field.Error` bodies quote
//! alike, so both are written from this one function.

/// Go's `strconv.Quote`, which `%q` uses in every message that names an object: printable
/// characters stay, the rest become `\n`, `\x07`, `\u200b`, ... escapes. Names come from
/// URLs, so this also keeps control and bidi characters out of the message.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols and the ASCII space.
///
/// Without Unicode category tables this approximates the non-ASCII part: control
/// characters, every space but U+0020, the format characters (zero-width and bidi
/// controls among them) and private-use code points are not printable; unassigned code
/// points count as printable, where Go escapes them. Only exotic input notices.
pub fn is_print(c: char) -> bool {
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c as u32,
        0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
        | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
        | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F
        | 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD
        | 0xFDD0..=0xFDEF)
        && (c as u32) & 0xFFFE != 0xFFFE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_matches_go() {
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote("plain name-1.x"), "\"plain name-1.x\"");
        assert_eq!(
            quote("\t\r\u{b}\u{c}\u{8}\u{0}\u{7f}"),
            "\"\\t\\r\\v\\f\\b\\x00\\x7f\""
        );
        assert_eq!(
            quote("\u{85}\u{a0}\u{200b}\u{feff}\u{e000}"),
            "\"\\u0085\\u00a0\\u200b\\ufeff\\ue000\""
        );
        assert_eq!(quote("\u{10ffff}"), "\"\\U0010ffff\"");
        assert_eq!(quote("日本 ✓ Ω"), "\"日本 ✓ Ω\"");
    }
}
