//! Rich results through `corral up` (issue 31, `corral_core::run::results`): a pandas
//! DataFrame's HTML and a Matplotlib figure's PNG as the results of an ephemeral run and of a
//! persistent cell, a long value's text cut at its bound, and none of them a download. Needs root,
//! Valkey and the baked stack (pandas, Matplotlib); without them it skips through
//! `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;

use base64::Engine as _;
use common::stack::{Stack, python};
use corral_testkit::{Need, skip};
use serde_json::{Value, json};

fn results(answer: &Value) -> Vec<Value> {
    answer["model"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataframe_and_a_figure_are_rich_results_in_runs_and_kernels_and_never_downloads() {
    let test = "a_dataframe_and_a_figure_are_rich_results_in_runs_and_kernels_and_never_downloads";
    if !Path::new("/opt/corral/python/corral-stack.tsv").exists() {
        skip(
            test,
            Need::Tools,
            "no baked stack: run scripts/build-python-stack",
        );
        return;
    }
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let (status, frame) = stack
        .run(python(
            "rae",
            "rich",
            "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})\n",
        ))
        .await;
    assert_eq!(status, 200, "{frame}");
    let shown = results(&frame);
    assert_eq!(shown.len(), 1, "{frame}");
    assert!(
        shown[0]["text/html"].as_str().unwrap().contains("<table"),
        "{frame}"
    );
    assert!(
        shown[0]["text/plain"].as_str().unwrap().contains("a  b"),
        "{frame}"
    );
    // A figure the code shows rather than saves: a PNG, and no file to download.
    let (status, figure) = stack
        .run(python(
            "rae",
            "rich",
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('shown')\nplt.show()\n",
        ))
        .await;
    assert_eq!(status, 200, "{figure}");
    let pngs: Vec<Vec<u8>> = results(&figure)
        .iter()
        .filter_map(|r| r["image/png"].as_str())
        .map(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        })
        .collect();
    assert_eq!(pngs.len(), 1, "{figure}");
    assert_eq!(&pngs[0][..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(figure["member"]["references"], json!([]), "{figure}");
    // A long value's text is cut at the bound; a script whose last statement is no expression has
    // no result.
    let (_, long) = stack.run(python("rae", "rich", "'x' * 100000\n")).await;
    let text = results(&long)[0]["text/plain"].as_str().unwrap().to_owned();
    assert_eq!(
        text.chars().count(),
        corral_core::run::results::TEXT_MAX_CHARS + 1,
        "{}",
        &text[..40]
    );
    let (_, none) = stack.run(python("rae", "rich", "x = 1\n")).await;
    assert_eq!(results(&none), Vec::<Value>::new(), "{none}");
    // A persistent cell: the value of its last expression, with the kernel's state.
    let cell = |code: &str| {
        let mut body = python("rae", "kernel", code);
        body["kernel"] = json!("persistent");
        body
    };
    let (status, _) = stack
        .run(cell(
            "import pandas as pd\nframe = pd.DataFrame({'x': [7, 8]})\n",
        ))
        .await;
    assert_eq!(status, 200);
    let (status, kept) = stack.run(cell("frame\n")).await;
    assert_eq!(status, 200, "{kept}");
    assert!(
        results(&kept)[0]["text/html"]
            .as_str()
            .unwrap()
            .contains("<table"),
        "{kept}"
    );
}
