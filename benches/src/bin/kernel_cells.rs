//! The persistent-kernel benchmark (KER-1, KER-2): through `POST /v1/run_code` of a `corral up`
//! it starts, the cell-to-cell overhead of a persistent kernel holding a 1 MiB DataFrame and 100
//! small variables (each cell restores them in a fresh interpreter, runs, and checkpoints them),
//! against the same cell run ephemerally, measured in the same run. Also the same for a kernel
//! holding nothing, to separate the kernel's fixed cost from the state's.
//!
//! Runs are sequential (concurrency 1), `--pause-ms` apart (the time an agent thinks).
//! `scripts/bench-kernels` builds and runs it.
//!
//! `kernel_cells --corral PATH [--runs N] [--pause-ms MS]`

use std::time::Duration;

use corral_benches::up::{Up, ms, p50, through_api};
use corral_testkit::registries::TempDir;
use serde_json::json;

fn main() {
    corral_benches::up::run_main(
        20,
        Duration::from_millis(500),
        |corral, runs, pause| async move {
            measure(&corral, runs, pause).await;
        },
    );
}

async fn measure(corral: &str, runs: usize, pause: Duration) {
    let state = TempDir::new("bench-kernels");
    let up = Up::start(corral, state.path(), &[]);
    let client = &up.client;
    let request = |conversation: &str, code: &str, kernel: &str| {
        json!({ "actor": "bench", "conversation": conversation, "member": "bench",
                "language": "python", "code": code, "kernel": kernel })
    };
    // The state: a DataFrame of 1 MiB (131,072 float64s) and 100 small variables.
    let setup = "import numpy as np, pandas as pd\n\
                 df = pd.DataFrame({'x': np.arange(131072, dtype='float64')})\n\
                 for i in range(100):\n    globals()['v%d' % i] = {'i': i, 'name': 'v%d' % i}\n";
    let (_, _, model) =
        through_api(client, &request("loaded", setup, "persistent"), 1, pause).await;
    let kept = model["kernel"]["kept"].as_array().map_or(0, Vec::len);
    println!(
        "runs: {runs}, pause between runs: {} ms; kernel state: {kept} names, checkpoint {} bytes",
        pause.as_millis(),
        model["kernel"]["checkpoint_bytes"]
    );
    let cell = "print(1)";
    let (ephemeral, warm, _) = through_api(
        client,
        &request("ephemeral", cell, "ephemeral"),
        runs,
        pause,
    )
    .await;
    let ephemeral = p50(ephemeral);
    println!(
        "ephemeral cell: p50 {:.1} ms ({warm}/{runs} warm)",
        ms(ephemeral)
    );
    let (empty, warm, _) =
        through_api(client, &request("empty", cell, "persistent"), runs, pause).await;
    let empty = p50(empty);
    println!(
        "persistent cell, empty kernel: p50 {:.1} ms ({warm}/{runs} warm): overhead {:.1} ms, ratio {:.2}",
        ms(empty),
        ms(empty) - ms(ephemeral),
        ms(empty) / ms(ephemeral)
    );
    let (loaded, warm, model) =
        through_api(client, &request("loaded", cell, "persistent"), runs, pause).await;
    assert_eq!(
        model["kernel"]["restored"].as_array().map_or(0, Vec::len),
        kept
    );
    let loaded = p50(loaded);
    println!(
        "persistent cell, 1 MiB DataFrame and 100 variables: p50 {:.1} ms ({warm}/{runs} warm): overhead {:.1} ms, ratio {:.2}",
        ms(loaded),
        ms(loaded) - ms(ephemeral),
        ms(loaded) / ms(ephemeral)
    );
}
