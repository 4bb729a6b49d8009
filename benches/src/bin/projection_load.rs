//! The projection benchmark (PROJ-1, PROJ-6): through `POST /v1/run_code` of a `corral up` it
//! starts, a run whose turn projects 20 files totalling 8 MiB (admission's authority reads, the
//! live re-checks, the bytes read by digest, the worker's verification, the read-only mount)
//! against the same 20 files copied into the run's workspace (restored from the object store,
//! packed back), each as time added to a trivial run measured in the same process. The code of
//! both reads every byte.
//!
//! Runs are sequential (concurrency 1), `--pause-ms` apart. `scripts/bench-projection` builds
//! and runs it.
//!
//! `projection_load --corral PATH [--runs N] [--pause-ms MS]`

use std::time::Duration;

use bytes::Bytes;
use corral_api::resources::sqlite::{Embedded, NewDocument};
use corral_api::workspaces::Workspaces;
use corral_benches::up::{Up, ms, p50, through_api};
use corral_core::projection::{BYTES_MAX, FILES_MAX, Kind, Processing};
use corral_testkit::registries::TempDir;
use serde_json::json;

fn main() {
    corral_benches::up::run_main(
        20,
        Duration::from_millis(300),
        |corral, runs, pause| async move {
            measure(&corral, runs, pause).await;
        },
    );
}

/// 20 files of pseudo-random bytes, 8 MiB in all.
fn files() -> Vec<(String, Vec<u8>)> {
    let each = usize::try_from(BYTES_MAX).expect("fits") / FILES_MAX;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..FILES_MAX)
        .map(|i| {
            let bytes = (0..each)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()[0]
                })
                .collect();
            (format!("f{i:02}.bin"), bytes)
        })
        .collect()
}

async fn measure(corral: &str, runs: usize, pause: Duration) {
    let state = TempDir::new("bench-projection");
    // A workspace that holds the same 8 MiB (the default bound is 8 MiB, tar headers and all).
    let up = Up::start(
        corral,
        state.path(),
        &[("SANDBOX_WORKSPACE_MAX_BYTES", "32 MiB")],
    );
    let client = &up.client;
    let files = files();
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    // The room and its documents, as a platform keeps them; the bytes under their digests.
    let authority = Embedded::open(&state.path().join("resources.db")).expect("authority");
    let store = Workspaces::open(&format!(
        "file://{}",
        state.path().join("workspaces").display()
    ))
    .expect("store");
    authority
        .create_room("projected", None, &["bench"])
        .expect("room");
    for (name, bytes) in &files {
        let digest = corral_core::ids::sha256_hex(bytes);
        store
            .put_resource(&digest, Bytes::from(bytes.clone()))
            .await
            .expect("bytes");
        let (reference, _, _) = authority
            .add_document(&NewDocument {
                owner: "bench".into(),
                name: name.clone(),
                media_type: "application/octet-stream".into(),
                kind: Kind::Document,
                digest,
                size: bytes.len() as u64,
                processing: Processing::Ready,
                revises: None,
            })
            .expect("document");
        authority
            .link_document("projected", &reference, None, None)
            .expect("link");
    }
    let request = |conversation: &str, code: &str| {
        json!({ "actor": "bench", "conversation": conversation, "member": "bench",
                "language": "python", "code": code })
    };
    // The same files in a workspace: written once, then restored and packed by every run.
    let writer = format!(
        "import random\nrandom.seed(7)\nfor i in range({FILES_MAX}):\n    open('f%02d.bin' % i, 'wb').write(random.randbytes({}))\n",
        total / FILES_MAX
    );
    through_api(client, &request("copied", &writer), 1, pause).await;
    let read_projected = "import json, os\nt = 0\nfor e in json.loads(os.environ['KAIZEN_SHARED_RESOURCES_MANIFEST']):\n    t += len(open(e['path'], 'rb').read())\nprint(t)\n";
    let read_workspace = "import os\nt = 0\nfor f in sorted(os.listdir('.')):\n    if f.endswith('.bin'):\n        t += len(open(f, 'rb').read())\nprint(t)\n";
    println!(
        "runs: {runs}, pause between runs: {} ms; {FILES_MAX} files, {total} bytes",
        pause.as_millis()
    );
    let (plain, warm, _) = through_api(client, &request("plain", "print(0)\n"), runs, pause).await;
    let plain = p50(plain);
    println!("trivial run: p50 {:.1} ms ({warm}/{runs} warm)", ms(plain));
    let (copied, warm, model) =
        through_api(client, &request("copied", read_workspace), runs, pause).await;
    assert_eq!(
        model["stdout"]["text"].as_str().map(str::trim),
        Some(total.to_string().as_str())
    );
    let copied = p50(copied);
    println!(
        "the files copied into the workspace: p50 {:.1} ms ({warm}/{runs} warm): added {:.1} ms",
        ms(copied),
        ms(copied) - ms(plain)
    );
    let (projected, warm, model) =
        through_api(client, &request("projected", read_projected), runs, pause).await;
    assert_eq!(
        model["stdout"]["text"].as_str().map(str::trim),
        Some(total.to_string().as_str())
    );
    assert_eq!(
        model["resources"]["files"].as_array().map_or(0, Vec::len),
        FILES_MAX
    );
    let projected = p50(projected);
    println!(
        "the files projected read-only: p50 {:.1} ms ({warm}/{runs} warm): added {:.1} ms; projection/copy of the added time {:.2}",
        ms(projected),
        ms(projected) - ms(plain),
        (ms(projected) - ms(plain)) / (ms(copied) - ms(plain))
    );
    println!(
        "API phase of the last projected run: {}",
        model["durations"]["api"]
    );
}
