use super::*;

fn doc(name: &str, size: u64) -> Document {
    Document {
        reference: format!("ref-{name}"),
        root: format!("root-{name}"),
        version: 1,
        kind: Kind::Document,
        processing: Processing::Ready,
        readable: true,
        digest: "ab".repeat(32),
        media_type: "application/pdf".into(),
        size,
        name: name.into(),
    }
}

fn audience(version: u64, members: &[&str]) -> Audience {
    Audience {
        version,
        members: members.iter().map(|m| (*m).to_owned()).collect(),
    }
}

fn names(projection: &Projection) -> Vec<&str> {
    projection
        .manifest
        .entries
        .iter()
        .map(|e| e.filename.as_str())
        .collect()
}

fn asking<'a>(room: &'a [Document], admitted: &'a Audience) -> Turn<'a> {
    Turn {
        member: "ann",
        room,
        selection: &[],
        admitted,
        live: None,
        asked_for_files: true,
    }
}

#[test]
fn proj_01_twenty_files_and_eight_mib_fit_and_one_more_of_either_is_refused_by_name() {
    let alone = audience(1, &["ann"]);
    let fits: Vec<Document> = (0..20)
        .map(|i| doc(&format!("f{i}.csv"), BYTES_MAX / 20))
        .collect();
    let projection = project(&asking(&fits, &alone)).unwrap();
    assert_eq!(projection.manifest.entries.len(), 20);
    assert!(projection.manifest.bytes() <= BYTES_MAX);
    let mut many = fits.clone();
    many.push(doc("twenty-one.csv", 1));
    assert_eq!(
        project(&asking(&many, &alone)).unwrap_err(),
        Refusal::of(Reason::OverCount, Some("twenty-one.csv"), Some(20))
    );
    let heavy = vec![doc("a.bin", BYTES_MAX - 10), doc("b.bin", 11)];
    assert_eq!(
        project(&asking(&heavy, &alone)).unwrap_err(),
        Refusal::of(Reason::OverBytes, Some("b.bin"), Some(BYTES_MAX))
    );
    let exact = vec![doc("a.bin", BYTES_MAX - 10), doc("b.bin", 10)];
    assert!(project(&asking(&exact, &alone)).is_ok());
}

#[test]
fn proj_08_each_room_file_failure_names_its_file() {
    let alone = audience(1, &["ann"]);
    for (change, reason) in [
        (Processing::Processing, Reason::NotReady),
        (Processing::Failed, Reason::Failed),
    ] {
        let mut room = vec![doc("ok.pdf", 10), doc("bad.pdf", 10)];
        room[1].processing = change;
        let turn = Turn {
            member: "ann",
            room: &room,
            selection: &[],
            admitted: &alone,
            live: None,
            asked_for_files: false,
        };
        assert_eq!(
            project(&turn).unwrap_err(),
            Refusal::of(reason, Some("bad.pdf"), None)
        );
    }
    let mut room = vec![doc("gone.pdf", 10)];
    room[0].readable = false;
    let turn = Turn {
        member: "ann",
        room: &room,
        selection: &[],
        admitted: &alone,
        live: None,
        asked_for_files: false,
    };
    assert_eq!(
        project(&turn).unwrap_err(),
        Refusal::of(Reason::Unavailable, Some("gone.pdf"), None)
    );
}

/// Every way a selection can fail, against whether the run asked for files and whether the room
/// has files of its own (PROJ-3, PROJ-4): fatal with its reason only when asked and the selection
/// was the sole source; otherwise withheld under the right event, and the run proceeds on the
/// room's files.
#[test]
fn proj_03_proj_04_a_selection_is_withheld_unless_it_was_the_asked_for_sole_source() {
    #[derive(Clone, Copy, Debug)]
    enum Failure {
        AudienceGrew,
        AudienceVersion,
        AudienceUnread,
        NotReady,
        Failed,
        Unreadable,
        AloneOverCount,
        AloneOverBytes,
        CombinedOverCount,
        CombinedOverBytes,
    }
    let failures = [
        Failure::AudienceGrew,
        Failure::AudienceVersion,
        Failure::AudienceUnread,
        Failure::NotReady,
        Failure::Failed,
        Failure::Unreadable,
        Failure::AloneOverCount,
        Failure::AloneOverBytes,
        Failure::CombinedOverCount,
        Failure::CombinedOverBytes,
    ];
    let admitted = audience(4, &["ann"]);
    for failure in failures {
        for asked in [false, true] {
            for room_files in [0usize, 1, 15] {
                let room: Vec<Document> = (0..room_files)
                    .map(|i| doc(&format!("room{i}.pdf"), 1000))
                    .collect();
                let mut selection: Vec<Document> =
                    (0..2).map(|i| doc(&format!("sel{i}.xlsx"), 1000)).collect();
                let mut live = admitted.clone();
                let mut live_read = true;
                let (expected_reason, expected_event) = match failure {
                    Failure::AudienceGrew => {
                        live.members.insert("bob".into());
                        (Reason::AudienceChanged, Withheld::BeforeDispatch)
                    }
                    Failure::AudienceVersion => {
                        live.version = 5;
                        (Reason::AudienceChanged, Withheld::BeforeDispatch)
                    }
                    Failure::AudienceUnread => {
                        live_read = false;
                        (Reason::Unavailable, Withheld::BeforeDispatch)
                    }
                    Failure::NotReady => {
                        selection[1].processing = Processing::Processing;
                        (Reason::NotReady, Withheld::BeforeDispatch)
                    }
                    Failure::Failed => {
                        selection[0].processing = Processing::Failed;
                        (Reason::Failed, Withheld::BeforeDispatch)
                    }
                    Failure::Unreadable => {
                        selection[0].readable = false;
                        (Reason::Unavailable, Withheld::BeforeDispatch)
                    }
                    Failure::AloneOverCount => {
                        selection = (0..21).map(|i| doc(&format!("s{i}.txt"), 10)).collect();
                        (Reason::OverCount, Withheld::BeforeDispatch)
                    }
                    Failure::AloneOverBytes => {
                        selection[0].size = BYTES_MAX;
                        (Reason::OverBytes, Withheld::BeforeDispatch)
                    }
                    Failure::CombinedOverCount => {
                        selection = (0..(FILES_MAX - room_files + 1).min(20))
                            .map(|i| doc(&format!("s{i}.txt"), 10))
                            .collect();
                        // With an empty room the selection alone fits: nothing is over.
                        if room_files == 0 {
                            continue;
                        }
                        (Reason::OverCount, Withheld::CombinedBound)
                    }
                    Failure::CombinedOverBytes => {
                        if room_files == 0 {
                            continue;
                        }
                        selection[0].size = BYTES_MAX - 1000 * room_files as u64 - 1000 + 1;
                        (Reason::OverBytes, Withheld::CombinedBound)
                    }
                };
                let turn = Turn {
                    member: "ann",
                    room: &room,
                    selection: &selection,
                    admitted: &admitted,
                    live: live_read.then_some(&live),
                    asked_for_files: asked,
                };
                let case = format!("{failure:?} asked={asked} room={room_files}");
                match project(&turn) {
                    Err(refusal) => {
                        assert!(asked && room_files == 0, "{case}: fatal {refusal:?}");
                        assert_eq!(refusal.reason, expected_reason, "{case}");
                    }
                    Ok(projection) => {
                        assert!(!(asked && room_files == 0), "{case}: not fatal");
                        let (event, refusal) = projection.withheld.clone().expect(&case);
                        assert_eq!(
                            (event, refusal.reason),
                            (expected_event, expected_reason),
                            "{case}"
                        );
                        // The run proceeds on exactly the room's files.
                        assert_eq!(projection.manifest.entries.len(), room_files, "{case}");
                        assert!(
                            projection
                                .manifest
                                .entries
                                .iter()
                                .all(|e| e.source == Source::Room)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn proj_03_a_selection_joins_only_an_exactly_private_room_after_its_files_and_never_twice() {
    let room = vec![doc("linked.pdf", 100)];
    let mut selection = vec![doc("picked.docx", 100), doc("linked.pdf", 100)];
    selection[1].reference = room[0].reference.clone();
    let alone = audience(2, &["ann"]);
    let turn = Turn {
        member: "ann",
        room: &room,
        selection: &selection,
        admitted: &alone,
        live: Some(&alone),
        asked_for_files: true,
    };
    let projection = project(&turn).unwrap();
    assert_eq!(names(&projection), ["linked.pdf", "picked.docx"]);
    assert_eq!(projection.manifest.entries[1].source, Source::Selection);
    assert_eq!(projection.withheld, None);
    // A room admitted with anyone else never considers the selection (no event either).
    let shared = audience(2, &["ann", "bob"]);
    let turn = Turn {
        admitted: &shared,
        live: Some(&shared),
        ..turn
    };
    let projection = project(&turn).unwrap();
    assert_eq!(names(&projection), ["linked.pdf"]);
    assert_eq!(projection.withheld, None);
    // ... and with no room files, a run that asked is told that no file is attached.
    let turn = Turn { room: &[], ..turn };
    assert!(project(&turn).unwrap().no_file_attached);
}

#[test]
fn proj_01_filenames_are_safe_unique_and_versions_are_prefixed() {
    let mut docs = [
        doc("report.pdf", 1),
        doc("../../etc/passwd", 1),
        doc("report.pdf", 1),
        doc(".hidden", 1),
        doc("\u{0}\u{7}", 1),
        doc(&format!("{}.xlsx", "x".repeat(300)), 1),
        doc("REPORT.pdf", 1),
    ];
    // Another version of the first document.
    docs[2].root = docs[0].root.clone();
    docs[2].version = 2;
    let refs: Vec<&Document> = docs.iter().collect();
    let names = filenames(&refs);
    assert_eq!(names[0], "report.pdf");
    assert_eq!(names[1], "passwd");
    assert_eq!(names[2], "v2-report.pdf");
    assert_eq!(names[3], "hidden");
    assert_eq!(names[4], "file");
    assert!(names[5].len() <= FILENAME_MAX_BYTES && names[5].ends_with(".xlsx"));
    assert_eq!(
        names[6], "7-REPORT.pdf",
        "names are unique regardless of case"
    );
    let unique: BTreeSet<String> = names.iter().map(|n| n.to_lowercase()).collect();
    assert_eq!(unique.len(), names.len());
    assert!(
        names
            .iter()
            .all(|n| !n.contains('/') && !n.starts_with('.'))
    );
}

#[test]
fn proj_07_own_links_are_ignored_a_revision_refuses_and_anything_else_stops() {
    let room = vec![doc("a.pdf", 10), doc("b.pdf", 10)];
    let alone = audience(1, &["ann"]);
    let admitted = project(&Turn {
        member: "ann",
        room: &room,
        selection: &[],
        admitted: &alone,
        live: None,
        asked_for_files: false,
    })
    .unwrap()
    .manifest;
    assert_eq!(verify_room(&admitted, &room, &[]), Ok(()));
    // The run's own new link does not stop it.
    let mut with_own = room.clone();
    with_own.push(doc("chart.png", 5));
    assert_eq!(
        verify_room(&admitted, &with_own, &["ref-chart.png".into()]),
        Ok(())
    );
    // Someone else's new link does.
    assert_eq!(
        verify_room(&admitted, &with_own, &[]).unwrap_err().reason,
        Reason::Changed
    );
    // A revision of an admitted file: its root, a newer version, the admitted one still there.
    let mut revised = room.clone();
    let mut v2 = doc("a.pdf", 12);
    v2.reference = "ref-a-v2".into();
    v2.version = 2;
    revised.push(v2.clone());
    assert_eq!(
        verify_room(&admitted, &revised, &[]).unwrap_err(),
        Refusal::of(Reason::Revised, Some("a.pdf"), None)
    );
    // A changed digest, a removed file.
    let mut tampered = room.clone();
    tampered[1].digest = "cd".repeat(32);
    assert_eq!(
        verify_room(&admitted, &tampered, &[]).unwrap_err().reason,
        Reason::Changed
    );
    assert_eq!(
        verify_room(&admitted, &room[..1], &[]).unwrap_err().reason,
        Reason::Changed
    );
    // From the next turn both versions are projected, with distinct names.
    let next = project(&Turn {
        member: "ann",
        room: &revised,
        selection: &[],
        admitted: &alone,
        live: None,
        asked_for_files: false,
    })
    .unwrap();
    assert_eq!(names(&next), ["a.pdf", "b.pdf", "v2-a.pdf"]);
    assert_ne!(next.manifest.digest(), admitted.digest());
}

fn projected(files: &[(&str, &[u8])]) -> Manifest {
    let docs: Vec<Document> = files
        .iter()
        .map(|(name, bytes)| Document {
            digest: crate::ids::sha256_hex(bytes),
            ..doc(name, bytes.len() as u64)
        })
        .collect();
    let alone = audience(1, &["ann"]);
    project(&asking(&docs, &alone)).unwrap().manifest
}

#[test]
fn proj_06_the_worker_verifies_names_manifest_sizes_and_digests_in_that_order() {
    let manifest = projected(&[("report.pdf", b"%PDF-1.4 x"), ("data.csv", b"a,b\n1,2\n")]);
    let digest = manifest.digest();
    let files: Vec<&[u8]> = vec![b"%PDF-1.4 x", b"a,b\n1,2\n"];
    verify_files(&manifest, &digest, &files).unwrap();
    // A tampered byte: the digest check names the file.
    let tampered: Vec<&[u8]> = vec![b"%PDF-1.4 y", b"a,b\n1,2\n"];
    let failed = verify_files(&manifest, &digest, &tampered).unwrap_err();
    assert_eq!(
        (failed.mismatch, failed.file.as_deref()),
        (Mismatch::Digest, Some("report.pdf"))
    );
    assert_eq!(failed.mismatch.not_run().code(), "resource_digest_mismatch");
    // A truncated file: the size check.
    let short: Vec<&[u8]> = vec![b"%PDF-1.4 x", b"a,b\n"];
    assert_eq!(
        verify_files(&manifest, &digest, &short)
            .unwrap_err()
            .mismatch,
        Mismatch::Digest
    );
    // Another manifest's digest, or a file missing: the manifest check.
    let other = projected(&[("report.pdf", b"%PDF-1.4 x")]);
    assert_eq!(
        verify_files(&manifest, &other.digest(), &files)
            .unwrap_err()
            .mismatch,
        Mismatch::Manifest
    );
    assert_eq!(
        verify_files(&manifest, &digest, &files[..1])
            .unwrap_err()
            .mismatch,
        Mismatch::Manifest
    );
    // A path outside the projection, an unsafe name, a duplicate: the path check, first, even
    // when the digest was computed over the bad entries.
    for bad in [
        "../escape.pdf",
        "/etc/passwd",
        ".hidden",
        "a/b.pdf",
        "..",
        "",
        "tab\there.pdf",
    ] {
        let mut evil = manifest.clone();
        evil.entries[0].filename = bad.to_owned();
        let failed = verify_files(&evil, &evil.digest(), &files).unwrap_err();
        assert_eq!(failed.mismatch, Mismatch::Path, "{bad:?}");
        assert_eq!(failed.mismatch.not_run().code(), "resource_path_invalid");
    }
    let mut twice = manifest.clone();
    twice.entries[1].filename = "REPORT.pdf".to_owned();
    assert_eq!(
        verify_files(&twice, &twice.digest(), &files)
            .unwrap_err()
            .file
            .as_deref(),
        Some("REPORT.pdf")
    );
    // Server-assigned prefixes are names the server could have assigned.
    assert!(is_assigned_name("v2-report.pdf") && is_assigned_name("3-data (1).csv"));
}

#[test]
fn proj_05_the_manifest_lists_paths_under_the_mount_and_is_absent_when_empty() {
    assert!(Manifest::default().environment().is_empty());
    let manifest = projected(&[("report.pdf", b"%PDF-1.4 x")]);
    let env = manifest.environment();
    assert_eq!(env[0], (ENV_DIR.to_owned(), MOUNT_DIR.to_owned()));
    assert_eq!(env[1].0, ENV_MANIFEST);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&env[1].1).unwrap();
    let entry = &listed[0];
    assert_eq!(entry["path"], "/mnt/resources/report.pdf");
    for field in [
        "reference",
        "kind",
        "version",
        "digest",
        "filename",
        "media_type",
        "size",
    ] {
        assert!(entry.get(field).is_some(), "{field} missing from {entry}");
    }
    assert_eq!(entry["size"], 10);
    assert!(entry["digest"].as_str().unwrap().starts_with("sha256:"));
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    fn any_doc(prefix: &'static str) -> impl Strategy<Value = Document> {
        (
            0u8..6,
            0u8..3,
            any::<bool>(),
            (0u8..4, 1u64..2_000_000),
            prop::sample::select(vec!["a.pdf", "A.pdf", "../x.csv", ".env", "b c.txt", ""]),
            1u64..3,
        )
            .prop_map(
                move |(id, processing, readable, (size_kind, some), name, version)| Document {
                    reference: format!("{prefix}{id}-v{version}"),
                    root: format!("{prefix}{id}"),
                    version,
                    kind: Kind::Document,
                    processing: match processing {
                        0 => Processing::Ready,
                        1 => Processing::Processing,
                        _ => Processing::Failed,
                    },
                    readable,
                    digest: "cd".repeat(32),
                    media_type: "text/plain".into(),
                    size: match size_kind {
                        0 => 0,
                        1 => BYTES_MAX,
                        _ => some,
                    },
                    name: name.into(),
                },
            )
    }

    proptest! {
        /// Whatever the authority says, a projection holds the bound, names every file safely and
        /// once, puts the room's files first, admits the selection only into an exactly private
        /// room whose audience did not change, and refuses only for a room file or an asked-for
        /// sole-source selection (PROJ-1, PROJ-3, PROJ-4, PROJ-8).
        #[test]
        fn proj_01_proj_03_proj_04_every_projection_keeps_the_rules(
            room in prop::collection::vec(any_doc("r"), 0..24),
            selection in prop::collection::vec(any_doc("s"), 0..24),
            others in any::<bool>(),
            live_kind in 0u8..4,
            asked in any::<bool>(),
        ) {
            let admitted = Audience {
                version: 7,
                members: if others { ["ann", "bob"] } else { ["ann", "ann"] }
                    .iter().map(|m| (*m).to_owned()).collect(),
            };
            let mut live = admitted.clone();
            match live_kind {
                1 => live.version = 8,
                2 => { live.members.insert("cy".into()); }
                _ => {}
            }
            let turn = Turn {
                member: "ann",
                room: &room,
                selection: &selection,
                admitted: &admitted,
                live: (live_kind != 3).then_some(&live),
                asked_for_files: asked,
            };
            let room_ok = room.iter().all(|d| d.readable && d.processing == Processing::Ready)
                && room.len() <= FILES_MAX
                && room.iter().map(|d| d.size).sum::<u64>() <= BYTES_MAX;
            match project(&turn) {
                Err(refusal) => {
                    // Only a room file, or an asked-for selection that was the sole source.
                    prop_assert!(!room_ok || (asked && room.is_empty() && !selection.is_empty()
                        && admitted.is_only("ann")), "{refusal:?}");
                }
                Ok(projection) => {
                    prop_assert!(room_ok);
                    let m = &projection.manifest;
                    prop_assert!(m.entries.len() <= FILES_MAX);
                    prop_assert!(m.bytes() <= BYTES_MAX);
                    let mut seen = std::collections::BTreeSet::new();
                    for e in &m.entries {
                        prop_assert!(is_assigned_name(&e.filename), "{}", e.filename);
                        prop_assert!(seen.insert(e.filename.to_lowercase()), "{}", e.filename);
                    }
                    // The room's files first, all of them, in order.
                    let first: Vec<&str> = m.entries.iter().take(room.len()).map(|e| e.reference.as_str()).collect();
                    let expected: Vec<&str> = room.iter().map(|d| d.reference.as_str()).collect();
                    prop_assert_eq!(first, expected);
                    let joined = m.entries.iter().filter(|e| e.source == Source::Selection).count();
                    if joined > 0 {
                        prop_assert!(admitted.is_only("ann") && live_kind == 0);
                    }
                    // A selection that could not join is withheld, and said so, unless none was
                    // considered.
                    let considered = admitted.is_only("ann") && !selection.is_empty();
                    prop_assert_eq!(considered && joined == 0 && projection.withheld.is_none(),
                        considered && selection.iter().all(|s| room.iter().any(|r| r.reference == s.reference
                            || (r.root == s.root && r.version == s.version))) && live_kind == 0);
                    prop_assert_eq!(projection.no_file_attached, asked && m.entries.is_empty());
                    // What is projected, the worker accepts with the right bytes.
                    let bytes: Vec<Vec<u8>> = m.entries.iter().map(|e| vec![0u8; usize::try_from(e.size).unwrap()]).collect();
                    let mut pinned = m.clone();
                    for (e, b) in pinned.entries.iter_mut().zip(&bytes) {
                        e.digest = crate::ids::sha256_hex(b);
                    }
                    let files: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
                    prop_assert!(verify_files(&pinned, &pinned.digest(), &files).is_ok());
                }
            }
        }
    }
}
