//! Rich results (issue 31), as Jupyter gives them: the value of a Python run's last expression
//! and the Matplotlib figures it left open, each as representations (`text/plain`; `text/html`
//! for what has `_repr_html_`, a pandas DataFrame; `image/png` for a figure or what has
//! `_repr_png_`). They are the model's, not downloads: a file to download still goes through
//! validation and the typed download list.
//!
//! The code's interpreter writes one JSON object per result, a line each, to [`FILE`] in the
//! run's `/tmp` (the worker's bootstrap does it after the code, within these bounds); the
//! supervisor reads at most [`FILE_MAX_BYTES`] of it once nothing of the run is alive, and
//! [`accept`] keeps what fits: at most [`RESULTS_MAX`] results, text cut at [`TEXT_MAX_CHARS`],
//! HTML over [`HTML_MAX_BYTES`] and anything that is not a PNG of at most [`PNG_MAX_BYTES`]
//! dropped, each drop noted. The code can write the file itself: what it says is its own result,
//! bounded the same way.

use base64::Engine as _;

/// The file, in the run's `/tmp`, that the interpreter writes the results to.
pub const FILE: &str = ".corral-results.jsonl";
/// The most results one run returns.
pub const RESULTS_MAX: usize = 8;
/// The longest `text/plain`, in characters; longer is cut.
pub const TEXT_MAX_CHARS: usize = 16 * 1024;
/// The largest `text/html`, in bytes; larger is dropped (cut markup would mislead).
pub const HTML_MAX_BYTES: usize = 512 * 1024;
/// The largest `image/png`, decoded, in bytes; larger is dropped.
pub const PNG_MAX_BYTES: usize = 2 * 1024 * 1024;
/// The most of [`FILE`] read: every result at its largest, in base64 where it is, with room.
pub const FILE_MAX_BYTES: u64 =
    (RESULTS_MAX * (TEXT_MAX_CHARS * 4 + HTML_MAX_BYTES + PNG_MAX_BYTES * 4 / 3 + 4096)) as u64;

/// The PNG signature.
const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// One result's representations, by media type.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RichResult {
    /// The value's `repr`.
    #[serde(
        rename = "text/plain",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub text_plain: Option<String>,
    /// The value's `_repr_html_` (a DataFrame's table).
    #[serde(rename = "text/html", default, skip_serializing_if = "Option::is_none")]
    pub text_html: Option<String>,
    /// A PNG, in base64 (a figure, or `_repr_png_`).
    #[serde(rename = "image/png", default, skip_serializing_if = "Option::is_none")]
    pub image_png: Option<String>,
}

impl RichResult {
    fn is_empty(&self) -> bool {
        self.text_plain.is_none() && self.text_html.is_none() && self.image_png.is_none()
    }
}

/// The results in `text` (the interpreter's lines), within the bounds, and a note for each thing
/// left out.
#[must_use]
pub fn accept(text: &str) -> (Vec<RichResult>, Vec<String>) {
    let mut results = Vec::new();
    let mut notes = Vec::new();
    for (index, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if results.len() == RESULTS_MAX {
            notes.push(format!(
                "results: more than {RESULTS_MAX}; the rest left out"
            ));
            break;
        }
        let Ok(mut result) = serde_json::from_str::<RichResult>(line) else {
            notes.push(format!(
                "results: result {index} is not a result object; left out"
            ));
            continue;
        };
        if let Some(plain) = result.text_plain.as_mut()
            && let Some((cut, _)) = plain.char_indices().nth(TEXT_MAX_CHARS)
        {
            plain.truncate(cut);
            plain.push('…');
        }
        if result
            .text_html
            .as_ref()
            .is_some_and(|h| h.len() > HTML_MAX_BYTES)
        {
            result.text_html = None;
            notes.push(format!(
                "results: result {index}'s text/html is over {HTML_MAX_BYTES} bytes; left out"
            ));
        }
        if let Some(png) = &result.image_png {
            let decoded = base64::engine::general_purpose::STANDARD.decode(png);
            let fits = decoded
                .as_ref()
                .is_ok_and(|bytes| bytes.len() <= PNG_MAX_BYTES && bytes.starts_with(PNG_MAGIC));
            if !fits {
                result.image_png = None;
                notes.push(format!(
                    "results: result {index}'s image/png is not a PNG of at most {PNG_MAX_BYTES} bytes in base64; left out"
                ));
            }
        }
        if !result.is_empty() {
            results.push(result);
        }
    }
    (results, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(bytes: usize) -> String {
        let mut data = PNG_MAGIC.to_vec();
        data.resize(bytes, 0);
        base64::engine::general_purpose::STANDARD.encode(data)
    }

    #[test]
    fn representations_within_the_bounds_are_kept_as_written() {
        let line = serde_json::json!({ "text/plain": "   a\n0  1", "text/html": "<table></table>",
                                       "image/png": png(64) })
        .to_string();
        let (results, notes) = accept(&line);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].text_html.as_deref(), Some("<table></table>"));
        assert_eq!(results[0].image_png, Some(png(64)));
    }

    #[test]
    fn what_is_over_a_bound_or_not_what_it_says_is_cut_or_left_out_with_a_note() {
        let long = "é".repeat(TEXT_MAX_CHARS + 10);
        let lines = [
            serde_json::json!({ "text/plain": long }).to_string(),
            serde_json::json!({ "text/html": "x".repeat(HTML_MAX_BYTES + 1) }).to_string(),
            serde_json::json!({ "image/png": png(PNG_MAX_BYTES + 1) }).to_string(),
            serde_json::json!({ "image/png": base64::engine::general_purpose::STANDARD.encode(b"GIF89a") }).to_string(),
            serde_json::json!({ "image/png": "not base64!" }).to_string(),
            serde_json::json!({ "application/x-other": "?" }).to_string(),
            "not json".to_string(),
        ]
        .join("\n");
        let (results, notes) = accept(&lines);
        assert_eq!(results.len(), 1, "{results:?}");
        let plain = results[0].text_plain.as_ref().unwrap();
        assert_eq!(plain.chars().count(), TEXT_MAX_CHARS + 1);
        assert!(plain.ends_with('…'));
        assert_eq!(notes.len(), 6, "{notes:?}");
    }

    #[test]
    fn at_most_the_bound_of_results_are_returned() {
        let line = serde_json::json!({ "text/plain": "1" }).to_string();
        let lines = vec![line; RESULTS_MAX + 3].join("\n");
        let (results, notes) = accept(&lines);
        assert_eq!(results.len(), RESULTS_MAX);
        assert_eq!(notes.len(), 1);
    }
}
