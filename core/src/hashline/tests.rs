use super::*;

const MAX: u64 = 64 << 20;

fn yank(tag: &str, line: u32, end_line: Option<u32>, register: &str) -> Edit {
    Edit::Yank {
        tag: tag.into(),
        line,
        end_line,
        register: register.into(),
    }
}

fn replace(tag: &str, line: u32, end_line: Option<u32>, text: &str) -> Edit {
    Edit::Replace {
        tag: tag.into(),
        line,
        end_line,
        text: Some(text.into()),
        register: None,
    }
}

#[test]
fn xxh32_matches_the_reference_vectors() {
    assert_eq!(xxh32(b""), 0x02CC_5D05);
    assert_eq!(xxh32(b"a"), 0x550D_7456);
    assert_eq!(xxh32(b"abc"), 0x32D1_53FF);
    assert_eq!(
        xxh32(b"Nobody inspects the spammish repetition"),
        0xE229_3B2F
    );
    // Over 16 bytes, through the four lanes.
    assert_eq!(
        xxh32("line one 263\nline two 4471\n".as_bytes()),
        0x1a97_1d84
    );
}

#[test]
fn ws_03_the_two_texts_of_the_issue_share_a_tag() {
    let a = "line one 263\nline two 4471\n";
    let b = "line one 410\nline two 6970\n";
    assert_eq!(tag(a), "1d84");
    assert_eq!(tag(a), tag(b));
    assert_ne!(a, b);
}

#[test]
fn ws_03_an_edit_by_anchors_applies_and_shows_its_lines_with_the_new_tag() {
    let mut authority = Authority::default();
    let text = "alpha\nbeta\ngamma\n";
    let view = authority.show("notes.txt", text, 1, 100, MAX).unwrap();
    assert_eq!(view.total_lines, 3);
    assert_eq!(
        view.text,
        format!("1:{t}|alpha\n2:{t}|beta\n3:{t}|gamma\n", t = tag(text))
    );
    let applied = authority
        .apply(
            "notes.txt",
            text,
            &[
                replace(&view.tag, 2, None, "BETA\nbeta two"),
                Edit::InsertAfter {
                    tag: view.tag.clone(),
                    line: 3,
                    text: Some("delta".into()),
                    register: None,
                },
                Edit::Delete {
                    tag: view.tag.clone(),
                    line: 1,
                    end_line: None,
                },
            ],
            MAX,
        )
        .unwrap();
    assert_eq!(applied.text, "BETA\nbeta two\ngamma\ndelta\n");
    assert_eq!(applied.changed, [(1, 2), (4, 4)]);
    // The edited lines are anchorable in the new version; the untouched one was never shown in it.
    let new_tag = tag(&applied.text);
    let mut next = authority.clone();
    assert!(
        next.apply(
            "notes.txt",
            &applied.text,
            &[replace(&new_tag, 4, None, "DELTA")],
            MAX
        )
        .is_ok()
    );
    let mut next = authority.clone();
    assert_eq!(
        next.apply(
            "notes.txt",
            &applied.text,
            &[replace(&new_tag, 3, None, "x")],
            MAX
        ),
        Err((Refusal::AnchorNotShown, 0))
    );
    // The old tag is stale now.
    let mut next = authority.clone();
    assert_eq!(
        next.apply(
            "notes.txt",
            &applied.text,
            &[replace(&view.tag, 1, None, "x")],
            MAX
        ),
        Err((Refusal::StaleAnchor, 0))
    );
}

#[test]
fn ws_03_a_stale_anchor_an_unshown_line_and_an_unknown_tag_are_refused() {
    let mut authority = Authority::default();
    let text = "one\ntwo\nthree\nfour\n";
    let view = authority.show("f.py", text, 2, 2, MAX).unwrap();
    assert_eq!(view.first, 2);
    assert_eq!(view.text.lines().count(), 2);
    let before = authority.clone();
    let refused = |authority: &mut Authority, current: &str, edit: Edit| {
        authority
            .apply("f.py", current, &[edit], MAX)
            .unwrap_err()
            .0
    };
    assert_eq!(
        refused(&mut authority, text, replace(&view.tag, 1, None, "x")),
        Refusal::AnchorNotShown
    );
    assert_eq!(
        refused(&mut authority, text, replace(&view.tag, 2, Some(4), "x")),
        Refusal::AnchorNotShown
    );
    assert_eq!(
        refused(
            &mut authority,
            "one\nTWO\nthree\nfour\n",
            replace(&view.tag, 2, None, "x")
        ),
        Refusal::StaleAnchor
    );
    let other = if view.tag == "0000" { "0001" } else { "0000" };
    assert_eq!(
        refused(&mut authority, text, replace(other, 2, None, "x")),
        Refusal::UnknownTag
    );
    assert_eq!(
        refused(&mut authority, text, replace("zz", 2, None, "x")),
        Refusal::EditInvalid
    );
    assert_eq!(
        refused(&mut authority, text, replace(&view.tag, 9, None, "x")),
        Refusal::AnchorOutOfRange
    );
    // Another file's history does not resolve this one's tag.
    assert_eq!(
        authority
            .apply("g.py", text, &[replace(&view.tag, 2, None, "x")], MAX)
            .unwrap_err()
            .0,
        Refusal::UnknownTag
    );
    // Nothing refused changed the record.
    assert_eq!(authority, before);
}

#[test]
fn ws_03_two_texts_with_one_tag_are_never_confused() {
    let a = "line one 263\nline two 4471\n";
    let b = "line one 410\nline two 6970\n";
    // The model was shown a; the file is now b, with the same tag: the full text differs.
    let mut authority = Authority::default();
    let view = authority.show("t.txt", a, 1, 10, MAX).unwrap();
    assert_eq!(
        authority.apply("t.txt", b, &[replace(&view.tag, 1, None, "x")], MAX),
        Err((Refusal::StaleAnchor, 0))
    );
    // Shown both: the tag names two versions, and neither is assumed.
    let again = authority.show("t.txt", b, 1, 10, MAX).unwrap();
    assert_eq!(again.tag, view.tag);
    for current in [a, b] {
        assert_eq!(
            authority
                .clone()
                .apply("t.txt", current, &[replace(&view.tag, 1, None, "x")], MAX),
            Err((Refusal::StaleAnchor, 0))
        );
    }
}

#[test]
fn ws_05_a_refused_edit_changes_nothing_even_after_a_valid_one_in_the_same_request() {
    let mut authority = Authority::default();
    let text = "a\nb\nc\n";
    let view = authority.show("x", text, 1, 10, MAX).unwrap();
    let before = authority.clone();
    let result = authority.apply(
        "x",
        text,
        &[
            yank(&view.tag, 1, Some(2), "r"),
            replace(&view.tag, 1, None, "A"),
            replace(&view.tag, 1, Some(2), "overlaps"),
        ],
        MAX,
    );
    assert_eq!(result, Err((Refusal::EditOverlap, 2)));
    assert_eq!(authority, before, "no register yanked, no version recorded");
}

#[test]
fn ws_03_registers_carry_lines_from_one_edit_to_another() {
    let mut authority = Authority::default();
    let text = "head\nbody\ntail\n";
    let view = authority.show("x", text, 1, 10, MAX).unwrap();
    let applied = authority
        .apply("x", text, &[yank(&view.tag, 1, None, "top")], MAX)
        .unwrap();
    assert_eq!(applied.text, text, "a yank changes no line");
    let applied = authority
        .apply(
            "x",
            text,
            &[Edit::InsertAfter {
                tag: view.tag.clone(),
                line: 3,
                text: None,
                register: Some("top".into()),
            }],
            MAX,
        )
        .unwrap();
    assert_eq!(applied.text, "head\nbody\ntail\nhead\n");
    assert_eq!(
        authority.clone().apply(
            "x",
            &applied.text,
            &[Edit::InsertAfter {
                tag: tag(&applied.text),
                line: 4,
                text: None,
                register: Some("none".into())
            }],
            MAX
        ),
        Err((Refusal::RegisterEmpty, 0))
    );
}

#[test]
fn bound_01_the_authority_is_bounded_by_its_setting() {
    let mut authority = Authority::default();
    let big = "x".repeat(4000) + "\n";
    assert_eq!(
        authority.show("big", &big, 1, 1, 1000).unwrap_err(),
        Refusal::StateTooLarge
    );
    assert_eq!(
        Refusal::StateTooLarge.setting(),
        Some("SANDBOX_HASHLINE_STATE_MAX_BYTES")
    );
    assert_eq!(authority, Authority::default());
    // Superseded versions are dropped to make room; a file's newest never is.
    let mut authority = Authority::default();
    for i in 0..50 {
        let text = format!("{}\n", i.to_string().repeat(200));
        authority.show("f", &text, 1, 1, 4000).unwrap();
    }
    assert!(authority.to_bytes().len() <= 4000);
    assert!(authority.files["f"].last().unwrap().text.starts_with("49"));
}

#[test]
fn ws_04_text_is_normalized_and_binary_is_refused() {
    assert_eq!(normalize(b"a\r\nb\r\n").unwrap(), "a\nb\n");
    assert_eq!(normalize(b"\xff\xfe"), Err(Refusal::NotText));
    assert_eq!(normalize(b"a\0b"), Err(Refusal::NotText));
    let mut authority = Authority::default();
    let view = authority.show("empty", "", 1, 10, MAX).unwrap();
    assert_eq!(
        (view.total_lines, view.first, view.text.as_str()),
        (0, 0, "")
    );
    let applied = authority
        .apply(
            "empty",
            "",
            &[Edit::InsertAfter {
                tag: view.tag,
                line: 0,
                text: Some("first".into()),
                register: None,
            }],
            MAX,
        )
        .unwrap();
    assert_eq!(applied.text, "first\n");
}

#[test]
fn ws_03_a_range_is_anchored_only_when_every_line_of_it_was_shown() {
    let mut authority = Authority::default();
    let text: String = (1..=20).map(|n| format!("line {n}\n")).collect();
    let view = authority.show("r", &text, 1, 5, MAX).unwrap();
    authority.show("r", &text, 15, 6, MAX).unwrap();
    // Both ends were shown, the lines between were not.
    assert_eq!(
        authority.clone().apply(
            "r",
            &text,
            &[Edit::Delete {
                tag: view.tag.clone(),
                line: 5,
                end_line: Some(15)
            }],
            MAX
        ),
        Err((Refusal::AnchorNotShown, 0))
    );
    assert!(
        authority
            .apply(
                "r",
                &text,
                &[Edit::Delete {
                    tag: view.tag,
                    line: 2,
                    end_line: Some(4)
                }],
                MAX
            )
            .is_ok()
    );
}

#[test]
fn ws_03_a_tag_of_a_version_dropped_to_fit_stays_ambiguous() {
    let mut authority = Authority::default();
    let a = "line one 263\nline two 4471\n";
    let b = "line one 410\nline two 6970\n";
    authority.show("t", a, 1, 10, MAX).unwrap();
    // The record is made to fit by dropping a (superseded once b is shown).
    let bound = u64::try_from(authority.to_bytes().len()).unwrap() + 60;
    authority.show("t", b, 1, 10, bound).unwrap();
    assert_eq!(authority.files["t"].len(), 1, "a was dropped");
    assert_eq!(
        authority.apply("t", b, &[replace("1d84", 1, None, "x")], MAX),
        Err((Refusal::StaleAnchor, 0)),
        "a model shown a may hold 1d84 for a: never resolved to b"
    );
}
