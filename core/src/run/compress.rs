//! Optional compression of a run's model-bound output (CMP-1): repeated lines collapsed and long
//! numeric tables shortened, each with a marker saying what was elided. It runs on the output
//! the model would get anyway (already bounded), changes only the model's projection, and only
//! removes: the caller keeps the raw output as canonical, and any result that is not strictly
//! shorter falls back to it.

/// A run of identical lines at least this long is collapsed to its first line.
pub const REPEAT_MIN: usize = 3;
/// A run of numeric lines longer than this is shortened.
pub const TABLE_MIN: usize = 24;
/// Of a shortened numeric run, the first lines kept.
pub const TABLE_HEAD: usize = 8;
/// Of a shortened numeric run, the last lines kept.
pub const TABLE_TAIL: usize = 4;

/// What compression made of one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compressed {
    /// The text the model gets.
    pub text: String,
    /// What was elided, one note per elision.
    pub notes: Vec<String>,
}

/// Whether `line` is a row of numbers: at least one digit, and at least 60% of its non-space
/// characters digits or number punctuation.
fn numeric(line: &str) -> bool {
    let mut digits = 0usize;
    let mut numberish = 0usize;
    let mut total = 0usize;
    for c in line.chars().filter(|c| !c.is_whitespace()) {
        total += 1;
        if c.is_ascii_digit() {
            digits += 1;
            numberish += 1;
        } else if ".,-+eE%:|/".contains(c) {
            numberish += 1;
        }
    }
    digits > 0 && numberish * 10 >= total * 6
}

/// Compresses `text`; `None` when nothing would be shorter (the raw text stands).
#[must_use]
pub fn compress(text: &str) -> Option<Compressed> {
    let ends_with_newline = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut notes = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let same = lines[i..].iter().take_while(|l| **l == lines[i]).count();
        if same >= REPEAT_MIN {
            out.push(lines[i].to_owned());
            out.push(format!(
                "[corral: the line above repeated {} more times]",
                same - 1
            ));
            notes.push(format!("{} repeated lines collapsed", same - 1));
            i += same;
            continue;
        }
        let table = lines[i..].iter().take_while(|l| numeric(l)).count();
        if table > TABLE_MIN {
            out.extend(lines[i..i + TABLE_HEAD].iter().map(|l| (*l).to_owned()));
            let elided = table - TABLE_HEAD - TABLE_TAIL;
            out.push(format!("[corral: {elided} numeric lines elided]"));
            out.extend(
                lines[i + table - TABLE_TAIL..i + table]
                    .iter()
                    .map(|l| (*l).to_owned()),
            );
            notes.push(format!(
                "{elided} lines of a {table}-line numeric table elided"
            ));
            i += table;
            continue;
        }
        out.push(lines[i].to_owned());
        i += 1;
    }
    let mut compressed = out.join("\n");
    if ends_with_newline && !compressed.is_empty() {
        compressed.push('\n');
    }
    (compressed.len() < text.len()).then_some(Compressed {
        text: compressed,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmp_01_repeats_and_numeric_tables_shrink_and_say_what_went() {
        let mut text = String::from("start\n");
        for _ in 0..50 {
            text.push_str("warning: retrying\n");
        }
        for i in 0..100 {
            text.push_str(&format!(
                "{i:>4} {:.3} {:.3}\n",
                f64::from(i) * 0.5,
                f64::from(i).sqrt()
            ));
        }
        text.push_str("done\n");
        let compressed = compress(&text).expect("shorter");
        assert!(compressed.text.len() < text.len() / 4);
        assert!(compressed.text.starts_with(
            "start\nwarning: retrying\n[corral: the line above repeated 49 more times]\n"
        ));
        assert!(
            compressed
                .text
                .contains("[corral: 88 numeric lines elided]")
        );
        assert!(
            compressed.text.contains("  99 49.500 9.950\n"),
            "the table's last rows stay"
        );
        assert!(compressed.text.ends_with("done\n"));
        assert_eq!(compressed.notes.len(), 2);
        // Every line it keeps, other than its markers, is a line of the original, in order.
        let original: Vec<&str> = text.lines().collect();
        let mut at = 0;
        for line in compressed
            .text
            .lines()
            .filter(|l| !l.starts_with("[corral: "))
        {
            at += original[at..]
                .iter()
                .position(|o| *o == line)
                .expect("a line of the original")
                + 1;
        }
    }

    #[test]
    fn cmp_01_text_that_would_not_shrink_stands() {
        assert_eq!(compress(""), None);
        assert_eq!(compress("a\nb\nc\n"), None);
        assert_eq!(compress("x\nx\n"), None, "two repeats are kept as they are");
        let short_table: String = (0..TABLE_MIN).map(|i| format!("{i}\n")).collect();
        assert_eq!(compress(&short_table), None);
    }
}
