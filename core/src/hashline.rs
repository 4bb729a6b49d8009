//! Hashline edit authority (WS-3 to WS-5, decision 0017): what a model may anchor an edit to,
//! and whether an anchor still means what it meant when it was shown.
//!
//! A file read with tags is shown as `LINE:TAG|text` lines, where `TAG` is four hex digits of the
//! xxHash32 of the file's normalized full text: every line of one version carries that version's
//! tag, and an anchor is a tag and a line number. Four hex digits collide (one text in 65,536
//! shares a tag with another), so a tag is never trusted on its own: it is resolved only within
//! the history of that file for that actor and conversation, and the version it names is
//! compared with the file's current text in full. An anchor is refused when its tag names no
//! version, when two versions of the history share it, when the file changed since that version,
//! or when its line was never shown to the model.
//!
//! The [`Authority`] record (the history: normalized full texts, their tags, the lines shown of
//! each; and bounded named registers) is the shell's to store beside the workspace under the same
//! identity, never inside the workspace tar; neither the model nor code ever reads it. Pure:
//! this module judges and edits text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most named registers an authority holds.
pub const REGISTERS_MAX: usize = 26;
/// The longest register name.
pub const REGISTER_NAME_MAX: usize = 32;
/// The most edits one request may make.
pub const EDITS_MAX: usize = 64;
/// The most lines one tagged read shows.
pub const VIEW_LINES_MAX: u32 = 2000;

// ---------------------------------------------------------------------------------------------
// Tags.

/// xxHash32 (seed 0) of `bytes`.
#[must_use]
pub fn xxh32(bytes: &[u8]) -> u32 {
    xxhash_rust::xxh32::xxh32(bytes, 0)
}

/// The tag of a normalized text: the low 16 bits of its xxHash32, as four lowercase hex digits.
#[must_use]
pub fn tag(text: &str) -> String {
    format!("{:04x}", xxh32(text.as_bytes()) & 0xffff)
}

/// Whether `text` is a tag's spelling: four hex digits.
#[must_use]
pub fn is_tag(text: &str) -> bool {
    text.len() == 4 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A file's bytes as the authority keeps them: UTF-8, line endings normalized to `\n`.
///
/// # Errors
/// [`Refusal::NotText`] for bytes that are not UTF-8 or hold a NUL.
pub fn normalize(bytes: &[u8]) -> Result<String, Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|_| Refusal::NotText)?;
    if text.contains('\0') {
        return Err(Refusal::NotText);
    }
    Ok(text.replace("\r\n", "\n"))
}

/// The lines of a normalized text (a final `\n` ends the last line; it does not start another).
fn lines(text: &str) -> Vec<&str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if text.is_empty() {
        Vec::new()
    } else {
        body.split('\n').collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The authority record.

/// One version of a file as shown to the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// Its tag.
    pub tag: String,
    /// Its normalized full text.
    pub text: String,
    /// The line ranges shown (1-based, inclusive), merged.
    pub shown: Vec<(u32, u32)>,
}

impl Version {
    fn was_shown(&self, line: u32) -> bool {
        self.range_shown(line, line)
    }

    /// Whether every line of `first..=last` was shown (the ranges are merged, so one holds it).
    fn range_shown(&self, first: u32, last: u32) -> bool {
        self.shown.iter().any(|(a, b)| *a <= first && last <= *b)
    }

    fn show(&mut self, first: u32, last: u32) {
        self.shown.push((first, last));
        self.shown.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (a, b) in self.shown.drain(..) {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.shown = merged;
    }
}

/// The Hashline authority of one actor-and-conversation workspace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authority {
    /// Each file's versions, oldest first.
    pub files: BTreeMap<String, Vec<Version>>,
    /// Named registers: text yanked by an edit for a later one.
    pub registers: BTreeMap<String, String>,
    /// Per file, the tags of versions dropped to fit the bound: an anchor with one of them stays
    /// ambiguous (a dropped version may have shared it), never resolved to the version kept.
    #[serde(default)]
    pub dropped_tags: BTreeMap<String, Vec<String>>,
}

/// What a tagged read shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct View {
    /// The version's tag.
    pub tag: String,
    /// The file's line count.
    pub total_lines: u32,
    /// The first line shown (1-based); 0 for an empty file.
    pub first: u32,
    /// The lines shown, as `LINE:TAG|text`, each ending in `\n`.
    pub text: String,
}

/// Why a read or an edit was refused. Every code is stable; none is a size overflow unless the
/// authority's own bound was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The file is not UTF-8 text.
    NotText,
    /// An anchor's tag is not four hex digits, or an edit is malformed.
    EditInvalid,
    /// No version of this file in the history has the tag.
    UnknownTag,
    /// The file changed since the anchor's version was shown, or two versions share its tag.
    StaleAnchor,
    /// The anchor's line was never shown to the model in that version.
    AnchorNotShown,
    /// The anchor's line is not in the file.
    AnchorOutOfRange,
    /// Two edits of one request touch the same lines.
    EditOverlap,
    /// A register that holds nothing was named.
    RegisterEmpty,
    /// The authority record would exceed `SANDBOX_HASHLINE_STATE_MAX_BYTES`.
    StateTooLarge,
}

impl Refusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::NotText => "file_not_text",
            Self::EditInvalid => "edit_invalid",
            Self::UnknownTag => "unknown_tag",
            Self::StaleAnchor => "stale_anchor",
            Self::AnchorNotShown => "anchor_not_shown",
            Self::AnchorOutOfRange => "anchor_out_of_range",
            Self::EditOverlap => "edit_overlap",
            Self::RegisterEmpty => "register_empty",
            Self::StateTooLarge => "hashline_state_too_large",
        }
    }

    /// The setting whose bound refused it, if one did.
    #[must_use]
    pub fn setting(self) -> Option<&'static str> {
        matches!(self, Self::StateTooLarge).then_some("SANDBOX_HASHLINE_STATE_MAX_BYTES")
    }
}

/// An anchor: a version's tag and a line of it (1-based; 0 is the start of the file, for an
/// insertion after it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    /// The tag shown with the line.
    pub tag: String,
    /// The line number shown with it.
    pub line: u32,
}

/// One edit, by anchors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    /// Replaces lines `line..=end_line` (one line without `end_line`) with `text` or a register.
    Replace {
        /// The version's tag.
        tag: String,
        /// The first line.
        line: u32,
        /// The last line, at least `line`.
        #[serde(default)]
        end_line: Option<u32>,
        /// The new lines.
        #[serde(default)]
        text: Option<String>,
        /// Or the lines a register holds.
        #[serde(default)]
        register: Option<String>,
    },
    /// Inserts `text` (or a register) before `line`.
    InsertBefore {
        /// The version's tag.
        tag: String,
        /// The line.
        line: u32,
        /// The new lines.
        #[serde(default)]
        text: Option<String>,
        /// Or the lines a register holds.
        #[serde(default)]
        register: Option<String>,
    },
    /// Inserts `text` (or a register) after `line` (0: at the start).
    InsertAfter {
        /// The version's tag.
        tag: String,
        /// The line.
        line: u32,
        /// The new lines.
        #[serde(default)]
        text: Option<String>,
        /// Or the lines a register holds.
        #[serde(default)]
        register: Option<String>,
    },
    /// Deletes lines `line..=end_line`.
    Delete {
        /// The version's tag.
        tag: String,
        /// The first line.
        line: u32,
        /// The last line, at least `line`.
        #[serde(default)]
        end_line: Option<u32>,
    },
    /// Copies lines `line..=end_line` into `register`; the file is unchanged by it.
    Yank {
        /// The version's tag.
        tag: String,
        /// The first line.
        line: u32,
        /// The last line.
        #[serde(default)]
        end_line: Option<u32>,
        /// The register's name.
        register: String,
    },
}

/// An edit applied: the new text and the lines of it to show back (1-based, inclusive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The new normalized text.
    pub text: String,
    /// The lines of the new text the edits wrote, to show with their new tag.
    pub changed: Vec<(u32, u32)>,
}

impl Authority {
    /// Parses a stored record; a record that does not parse is a fresh one's problem, not the
    /// caller's: the shell refuses to proceed (`Err`) rather than overwrite it.
    ///
    /// # Errors
    /// The record is not valid.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// The record's stored form.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Shows lines `first..first+count` of `path`'s current `text` (normalized), recording the
    /// version and the lines shown. Bounded by `max_bytes` (`SANDBOX_HASHLINE_STATE_MAX_BYTES`).
    ///
    /// # Errors
    /// [`Refusal::StateTooLarge`] when the record cannot hold the version even after the oldest
    /// superseded versions are dropped.
    pub fn show(
        &mut self,
        path: &str,
        text: &str,
        first: u32,
        count: u32,
        max_bytes: u64,
    ) -> Result<View, Refusal> {
        let all = lines(text);
        let total = u32::try_from(all.len()).unwrap_or(u32::MAX);
        let first = first.clamp(1, total.max(1));
        let count = count.clamp(1, VIEW_LINES_MAX);
        let last = first.saturating_add(count - 1).min(total);
        let tag = tag(text);
        let mut shown = String::new();
        if total > 0 {
            for n in first..=last {
                shown.push_str(&format!("{n}:{tag}|{}\n", all[(n - 1) as usize]));
            }
        }
        let mut next = self.clone();
        next.record(path, text, (total > 0).then_some((first, last)));
        next.fit(max_bytes, path)?;
        *self = next;
        Ok(View {
            tag,
            total_lines: total,
            first: if total > 0 { first } else { 0 },
            text: shown,
        })
    }

    /// Records that `range` of `text` was shown for `path` (the version added if new).
    fn record(&mut self, path: &str, text: &str, range: Option<(u32, u32)>) {
        let versions = self.files.entry(path.to_owned()).or_default();
        let at = match versions.iter().position(|v| v.text == text) {
            Some(at) => at,
            None => {
                versions.push(Version {
                    tag: tag(text),
                    text: text.to_owned(),
                    shown: Vec::new(),
                });
                versions.len() - 1
            }
        };
        if let Some((a, b)) = range {
            versions[at].show(a, b);
        }
        // The version just shown is the newest: superseded ones go first when the record is full.
        let version = versions.remove(at);
        versions.push(version);
    }

    /// Drops versions until the record fits: superseded ones first (oldest first), then the
    /// newest versions of files other than `keep` (a file gone from the workspace, or not read
    /// for long); anchors to a dropped version are refused from then on (`unknown_tag`, or
    /// `stale_anchor` where its tag is still in use).
    fn fit(&mut self, max_bytes: u64, keep: &str) -> Result<(), Refusal> {
        let mut size = u64::try_from(self.to_bytes().len()).unwrap_or(u64::MAX);
        while size > max_bytes {
            let superseded = self
                .files
                .iter()
                .find(|(_, versions)| versions.len() > 1)
                .map(|(path, _)| path.clone());
            let victim = superseded.or_else(|| {
                self.files
                    .keys()
                    .find(|path| path.as_str() != keep)
                    .cloned()
            });
            let Some(path) = victim else {
                return Err(Refusal::StateTooLarge);
            };
            let Some(versions) = self.files.get_mut(&path) else {
                return Err(Refusal::StateTooLarge);
            };
            let dropped = versions.remove(0);
            if versions.is_empty() {
                self.files.remove(&path);
            }
            // The serialized size falls by at least the text and tag dropped; measured again
            // only when that estimate says it fits.
            let freed = dropped.text.len() + dropped.tag.len();
            size = size.saturating_sub(u64::try_from(freed).unwrap_or(u64::MAX));
            let tags = self.dropped_tags.entry(path).or_default();
            if !tags.contains(&dropped.tag) {
                tags.push(dropped.tag);
            }
            if size <= max_bytes {
                size = u64::try_from(self.to_bytes().len()).unwrap_or(u64::MAX);
            }
        }
        Ok(())
    }

    /// The version of `path` with `tag` (the first: callers resolve first).
    fn version(&self, path: &str, tag: &str) -> Option<&Version> {
        let wanted = tag.to_ascii_lowercase();
        self.files.get(path)?.iter().find(|v| v.tag == wanted)
    }

    /// Resolves `anchor` for `path`, whose current normalized text is `current`: the version
    /// its tag names within this file's history must be the only one with that tag, must be the
    /// current text in full, and must have shown the anchor's line.
    fn resolve(&self, path: &str, current: &str, anchor: &Anchor) -> Result<(), Refusal> {
        if !is_tag(&anchor.tag) {
            return Err(Refusal::EditInvalid);
        }
        let wanted = anchor.tag.to_ascii_lowercase();
        let versions = self.files.get(path).map(Vec::as_slice).unwrap_or_default();
        let mut named = versions.iter().filter(|v| v.tag == wanted);
        let Some(version) = named.next() else {
            return Err(Refusal::UnknownTag);
        };
        let dropped = self
            .dropped_tags
            .get(path)
            .is_some_and(|tags| tags.contains(&wanted));
        if named.next().is_some() || dropped || version.text != current {
            return Err(Refusal::StaleAnchor);
        }
        let total = u32::try_from(lines(current).len()).unwrap_or(u32::MAX);
        if anchor.line > total {
            return Err(Refusal::AnchorOutOfRange);
        }
        // Line 0 (the start) is known to whoever was shown any of the version.
        let shown = if anchor.line == 0 {
            !version.shown.is_empty() || total == 0
        } else {
            version.was_shown(anchor.line)
        };
        if !shown {
            return Err(Refusal::AnchorNotShown);
        }
        Ok(())
    }

    /// Applies `edits` to `path`, whose current normalized text is `current`. All or nothing:
    /// every anchor is resolved and every range checked before anything changes; `self` changes
    /// (registers yanked, the new version recorded with its edited lines shown) only on success.
    ///
    /// # Errors
    /// The first refusal, and the index of the edit it refused.
    pub fn apply(
        &mut self,
        path: &str,
        current: &str,
        edits: &[Edit],
        max_bytes: u64,
    ) -> Result<Applied, (Refusal, usize)> {
        if edits.is_empty() || edits.len() > EDITS_MAX {
            return Err((Refusal::EditInvalid, 0));
        }
        let old = lines(current);
        let mut registers = self.registers.clone();
        // (first line replaced, lines replaced, new lines), by position.
        let mut splices: Vec<(u32, u32, Vec<String>, usize)> = Vec::new();
        for (i, edit) in edits.iter().enumerate() {
            let at = |e: Refusal| (e, i);
            let (anchor, end) = match edit {
                Edit::Replace {
                    tag,
                    line,
                    end_line,
                    ..
                }
                | Edit::Delete {
                    tag,
                    line,
                    end_line,
                }
                | Edit::Yank {
                    tag,
                    line,
                    end_line,
                    ..
                } => (
                    Anchor {
                        tag: tag.clone(),
                        line: *line,
                    },
                    end_line.unwrap_or(*line),
                ),
                Edit::InsertBefore { tag, line, .. } | Edit::InsertAfter { tag, line, .. } => (
                    Anchor {
                        tag: tag.clone(),
                        line: *line,
                    },
                    *line,
                ),
            };
            self.resolve(path, current, &anchor).map_err(at)?;
            let ranged = matches!(
                edit,
                Edit::Replace { .. } | Edit::Delete { .. } | Edit::Yank { .. }
            );
            if ranged {
                if anchor.line == 0 || end < anchor.line {
                    return Err(at(Refusal::EditInvalid));
                }
                // Every line of the range must have been shown in the same version, not just
                // its ends.
                self.resolve(
                    path,
                    current,
                    &Anchor {
                        tag: anchor.tag.clone(),
                        line: end,
                    },
                )
                .map_err(at)?;
                if !self
                    .version(path, &anchor.tag)
                    .is_some_and(|v| v.range_shown(anchor.line, end))
                {
                    return Err(at(Refusal::AnchorNotShown));
                }
            }
            let content = |text: &Option<String>,
                           register: &Option<String>|
             -> Result<Vec<String>, (Refusal, usize)> {
                match (text, register) {
                    (Some(text), None) => Ok(lines(&normalize(text.as_bytes()).map_err(at)?)
                        .into_iter()
                        .map(str::to_owned)
                        .collect()),
                    (None, Some(name)) => registers
                        .get(name)
                        .map(|held| lines(held).into_iter().map(str::to_owned).collect())
                        .ok_or(at(Refusal::RegisterEmpty)),
                    _ => Err(at(Refusal::EditInvalid)),
                }
            };
            match edit {
                Edit::Replace { text, register, .. } => {
                    splices.push((
                        anchor.line,
                        end - anchor.line + 1,
                        content(text, register)?,
                        i,
                    ));
                }
                Edit::Delete { .. } => {
                    splices.push((anchor.line, end - anchor.line + 1, Vec::new(), i))
                }
                Edit::InsertBefore { text, register, .. } => {
                    if anchor.line == 0 {
                        return Err(at(Refusal::EditInvalid));
                    }
                    splices.push((anchor.line, 0, content(text, register)?, i));
                }
                Edit::InsertAfter { text, register, .. } => {
                    splices.push((anchor.line + 1, 0, content(text, register)?, i));
                }
                Edit::Yank { register, .. } => {
                    if register.is_empty()
                        || register.len() > REGISTER_NAME_MAX
                        || (!registers.contains_key(register) && registers.len() >= REGISTERS_MAX)
                    {
                        return Err(at(Refusal::EditInvalid));
                    }
                    let mut held = old[(anchor.line - 1) as usize..end as usize].join("\n");
                    held.push('\n');
                    registers.insert(register.clone(), held);
                }
            }
        }
        // Splices apply to the original numbering; two that touch the same lines are refused.
        splices.sort_by_key(|(first, count, _, i)| (*first, *count, *i));
        for pair in splices.windows(2) {
            let (a_first, a_count, _, _) = &pair[0];
            let (b_first, _, _, b_index) = &pair[1];
            if a_first + a_count > *b_first || (a_first == b_first && *a_count > 0) {
                return Err((Refusal::EditOverlap, *b_index));
            }
        }
        let mut out: Vec<String> = Vec::with_capacity(old.len());
        let mut changed = Vec::new();
        let mut next = 1u32;
        for (first, count, new, _) in &splices {
            while next < *first {
                out.push(old[(next - 1) as usize].to_owned());
                next += 1;
            }
            if !new.is_empty() {
                let start = u32::try_from(out.len()).unwrap_or(u32::MAX) + 1;
                changed.push((
                    start,
                    start + u32::try_from(new.len()).unwrap_or(u32::MAX) - 1,
                ));
            }
            out.extend(new.iter().cloned());
            next += count;
        }
        while (next as usize) <= old.len() {
            out.push(old[(next - 1) as usize].to_owned());
            next += 1;
        }
        let mut text = out.join("\n");
        if !out.is_empty() && (current.ends_with('\n') || current.is_empty()) {
            text.push('\n');
        }
        let mut after = self.clone();
        after.registers = registers;
        after.record(path, &text, None);
        for (a, b) in &changed {
            after.record(path, &text, Some((*a, *b)));
        }
        after.fit(max_bytes, path).map_err(|e| (e, 0))?;
        *self = after;
        Ok(Applied { text, changed })
    }
}

#[cfg(test)]
mod tests;
