//! Limits on a procedure id a client chooses (an idempotency key: `walctl create-table --id`, `"id"` of
//! `POST /v1/tables`), and quoting a client's text in an error without echoing it whole.

use snafu::ensure;

use crate::ddl::error::{InvalidCreateTableSnafu, Result};
use crate::key::table_name::TableName;

/// The longest procedure id a client may choose, in bytes of UTF-8.
pub const MAX_PROCEDURE_ID_BYTES: usize = 128;

/// How many characters of a refused id an error quotes.
const ID_EXCERPT_CHARS: usize = 32;

/// Checks a client-chosen procedure id for the create-table of `table`: not blank, at most
/// [`MAX_PROCEDURE_ID_BYTES`] bytes, and printable — no control character (`\0`, `\n`, …, U+0080–U+009F), no line
/// or paragraph separator, no invisible format character (zero-width, byte-order mark) and no bidirectional
/// control character (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), which would show the id as another
/// text. The error is [`crate::ddl::Error::InvalidCreateTable`]; it quotes the id through [`excerpt`], never whole.
pub fn validate_procedure_id(table: &TableName, id: &str) -> Result<()> {
    let invalid = |reason: String| {
        InvalidCreateTableSnafu {
            table: table.to_string(),
            reason,
        }
        .build()
    };
    ensure!(
        !id.trim().is_empty(),
        InvalidCreateTableSnafu {
            table: table.to_string(),
            reason: "the procedure id is empty",
        }
    );
    if id.len() > MAX_PROCEDURE_ID_BYTES {
        return Err(invalid(format!(
            "the procedure id '{}' is {} bytes long; at most {MAX_PROCEDURE_ID_BYTES} are allowed",
            excerpt(id, ID_EXCERPT_CHARS),
            id.len()
        )));
    }
    if let Some((at, c)) = id.char_indices().find(|&(_, c)| !is_printable(c)) {
        let what = if is_bidi_control(c) {
            "the bidirectional control character"
        } else if c.is_control() {
            "the control character"
        } else {
            "the invisible character"
        };
        return Err(invalid(format!(
            "the procedure id '{}' contains {what} U+{:04X} at byte {at}; an id must be printable text",
            excerpt(id, ID_EXCERPT_CHARS),
            u32::from(c)
        )));
    }
    Ok(())
}

/// Whether `c` may appear in a client-chosen id (see [`validate_procedure_id`]).
fn is_printable(c: char) -> bool {
    !(c.is_control() || is_bidi_control(c) || is_invisible(c))
}

/// Unicode's bidirectional formatting characters: they reorder how the text around them is shown.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// Separators and format characters that show as nothing (or as a line break) but are part of the text.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}' | '\u{200B}'..='\u{200D}' | '\u{2028}' | '\u{2029}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}'
    )
}

/// `text` as an error message may quote it: every character [`validate_procedure_id`] refuses escaped (`\n`,
/// `\u{202e}`), and cut after `max` characters, with `…` and the text's length in bytes, so that a client's value
/// is never echoed whole nor shown reordered.
pub fn excerpt(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push_str(&format!("… ({} bytes in all)", text.len()));
            break;
        }
        if is_printable(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &str) -> std::result::Result<(), String> {
        validate_procedure_id(&TableName::new("greptime", "public", "t"), id)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn an_excerpt_escapes_what_an_id_may_not_hold_and_cuts_long_text() {
        assert_eq!(
            excerpt("a\nb\u{202e}c\u{200b}", 10),
            "a\\nb\\u{202e}c\\u{200b}"
        );
        assert_eq!(excerpt(&"x".repeat(500), 3), "xxx… (500 bytes in all)");
        assert_eq!(excerpt("short", 5), "short");
    }

    #[test]
    fn ids_up_to_128_printable_bytes_pass() {
        for id in [
            "a",
            "client/req-1",
            "é-ünïcode-日本",
            &"x".repeat(MAX_PROCEDURE_ID_BYTES),
        ] {
            assert_eq!(check(id), Ok(()), "{id}");
        }
    }

    #[test]
    fn a_long_id_is_refused_quoting_only_its_start() {
        let long = "y".repeat(900_000);
        let err = check(&long).unwrap_err();
        assert_eq!(
            err,
            format!(
                "invalid create-table request for table greptime.public.t: the procedure id '{}… (900000 bytes in \
                 all)' is 900000 bytes long; at most 128 are allowed",
                "y".repeat(32)
            )
        );
        // 129 bytes: one over.
        assert!(
            check(&"z".repeat(129))
                .unwrap_err()
                .contains("is 129 bytes long")
        );
    }

    #[test]
    fn control_bidi_and_invisible_characters_are_refused_escaped() {
        assert_eq!(
            check("a\nb").unwrap_err(),
            "invalid create-table request for table greptime.public.t: the procedure id 'a\\nb' contains the \
             control character U+000A at byte 1; an id must be printable text"
        );
        assert_eq!(
            check("ab\u{202E}cd").unwrap_err(),
            "invalid create-table request for table greptime.public.t: the procedure id 'ab\\u{202e}cd' contains \
             the bidirectional control character U+202E at byte 2; an id must be printable text"
        );
        for (id, code) in [
            ("\0", "U+0000"),
            ("x\u{7f}", "U+007F"),
            ("x\u{85}", "U+0085"),
            ("\u{2066}x", "U+2066"),
            ("x\u{200F}", "U+200F"),
            ("x\u{200B}y", "U+200B"),
            ("x\u{2028}y", "U+2028"),
            ("\u{FEFF}x", "U+FEFF"),
        ] {
            let err = check(id).unwrap_err();
            assert!(err.contains(code) && !err.contains(id), "{err}");
        }
        assert_eq!(
            check(" ").unwrap_err(),
            "invalid create-table request for table greptime.public.t: the procedure id is empty"
        );
    }
}
