//! HTML escaping: every value the page shows goes through [`escape`].

use std::fmt;

/// `text` made safe for HTML text and for a double- or single-quoted attribute value (also inside inline SVG):
/// `&`, `<`, `>`, `"` and `'` become character references, everything else stays as it is.
pub fn escape(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// A value escaped when displayed (no intermediate string).
pub struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_characters_become_references_and_the_rest_is_kept() {
        assert_eq!(
            escape(r#"<script>alert("x&y's")</script> é"#).to_string(),
            "&lt;script&gt;alert(&quot;x&amp;y&#39;s&quot;)&lt;/script&gt; é"
        );
        assert_eq!(escape("plain-id_1/2").to_string(), "plain-id_1/2");
        assert_eq!(escape("").to_string(), "");
    }
}
