//! A tiny JSON object writer for the decide tool's output and the proxy's log lines.
//!
//! Hand-written so the crate needs no serializer: one flat object of strings, numbers, booleans,
//! nulls and string arrays, keys in the order written. Strings are escaped per RFC 8259, so
//! client-supplied text (a request target, a configured mode) can never break a line.

use std::fmt::Write as _;

/// Builds one JSON object, field by field.
#[derive(Debug)]
pub struct JsonObject {
    text: String,
    empty: bool,
}

impl Default for JsonObject {
    fn default() -> Self {
        JsonObject::new()
    }
}

impl JsonObject {
    /// An empty object.
    #[must_use]
    pub fn new() -> JsonObject {
        JsonObject {
            text: String::from("{"),
            empty: true,
        }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.text.push(',');
        }
        self.empty = false;
        push_string(&mut self.text, key);
        self.text.push(':');
    }

    /// Adds a string field.
    pub fn string(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        push_string(&mut self.text, value);
        self
    }

    /// Adds a string field, or `null` when `value` is `None`.
    pub fn opt_string(&mut self, key: &str, value: Option<&str>) -> &mut Self {
        match value {
            Some(value) => self.string(key, value),
            None => self.null(key),
        }
    }

    /// Adds an unsigned number field.
    pub fn number(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key);
        // Writing to a String cannot fail.
        let _ = write!(self.text, "{value}");
        self
    }

    /// Adds a boolean field.
    pub fn boolean(&mut self, key: &str, value: bool) -> &mut Self {
        self.key(key);
        self.text.push_str(if value { "true" } else { "false" });
        self
    }

    /// Adds a `null` field.
    pub fn null(&mut self, key: &str) -> &mut Self {
        self.key(key);
        self.text.push_str("null");
        self
    }

    /// Adds an array of strings.
    pub fn strings<'a>(
        &mut self,
        key: &str,
        values: impl IntoIterator<Item = &'a str>,
    ) -> &mut Self {
        self.key(key);
        self.text.push('[');
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push(',');
            }
            push_string(&mut self.text, value);
        }
        self.text.push(']');
        self
    }

    /// The finished object text (one line, no trailing newline).
    #[must_use]
    pub fn finish(mut self) -> String {
        self.text.push('}');
        self.text
    }
}

/// Appends `value` as a JSON string literal.
fn push_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_that_could_break_a_line() {
        let mut o = JsonObject::new();
        o.string("a", "x\"y\\z\n\r\t\u{1}\u{7f}é")
            .number("n", 7)
            .boolean("b", true)
            .null("z")
            .opt_string("s", None)
            .strings("l", ["p", "q\""]);
        assert_eq!(
            o.finish(),
            r#"{"a":"x\"y\\z\n\r\t\u0001\u007fé","n":7,"b":true,"z":null,"s":null,"l":["p","q\""]}"#
        );
        assert_eq!(JsonObject::new().finish(), "{}");
    }
}
