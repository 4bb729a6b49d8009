//! Persistent kernels at the worker (KER-1 to KER-3, decision 0016): a real `corral-worker
//! serve`, cells whose workspace archive is carried from one execute to the next as the API
//! carries it, with the seal key the API would send. Each cell is a fresh interpreter.

mod common;

use std::io::Read as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::api::Server;
use common::{root_or_skip, serial};
use corral_contract::messages::KernelOrder;
use serde_json::{Value, json};

fn order(workspace: &str) -> Value {
    serde_json::to_value(KernelOrder::new(&[9; 32], workspace)).unwrap()
}

/// Runs one cell of `language` with `archive` as its workspace; the reply and the workspace after.
fn cell(
    server: &Server,
    language: &str,
    code: &str,
    archive: Option<&str>,
    kernel: Option<Value>,
) -> (Value, Option<String>) {
    let mut body = json!({ "language": language, "code": code });
    if let Some(archive) = archive {
        body["workspace"] = json!(archive);
    }
    if let Some(kernel) = kernel {
        body["kernel"] = kernel;
    }
    let (status, reply) = server.execute(&body);
    assert_eq!(status, 200, "{reply}");
    let after = reply["workspace"]["archive"].as_str().map(str::to_owned);
    (reply, after)
}

/// The files of a base64 tar, by path.
fn files(archive: &str) -> Vec<(String, Vec<u8>)> {
    let bytes = BASE64.decode(archive).unwrap();
    let mut tar = tar::Archive::new(&bytes[..]);
    let mut out = Vec::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.push((path, data));
        }
    }
    out
}

fn tar_of(files: &[(String, Vec<u8>)]) -> String {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, &data[..]).unwrap();
    }
    BASE64.encode(builder.into_inner().unwrap())
}

fn stdout(reply: &Value) -> &str {
    reply["stdout"]["text"].as_str().unwrap_or_default()
}

#[test]
fn ker_02_python_cells_keep_aliases_cycles_functions_and_classes_across_fresh_interpreters() {
    if !root_or_skip(
        "ker_02_python_cells_keep_aliases_cycles_functions_and_classes_across_fresh_interpreters",
    ) {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let kernel = order("ws-a");
    let (first, archive) = cell(
        &server,
        "python",
        "import os\na = {'k': [1, 2]}\nb = a\nl = [1]\nl.append(l)\ndef twice(x):\n    return 2 * x\nclass Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(5)\nimport sys\nsys.marker_of_this_interpreter = 1\n",
        None,
        Some(kernel.clone()),
    );
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_eq!(first["kernel"]["checkpointed"], true, "{first}");
    let kept: Vec<&str> = first["kernel"]["kept"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in ["os", "a", "b", "l", "twice", "Box", "box", "sys"] {
        assert!(kept.contains(&name), "{name} not kept: {first}");
    }
    // The checkpoint is not offered as an output.
    assert_eq!(first["downloads"], json!([]), "{first}");
    let (second, archive) = cell(
        &server,
        "python",
        "import os\nprint(b is a, l[1] is l, twice(21), box.v, isinstance(box, Box), hasattr(sys, 'marker_of_this_interpreter'))\nb['k'].append(3)\n",
        archive.as_deref(),
        Some(kernel.clone()),
    );
    assert_eq!(stdout(&second), "True True 42 5 True False\n", "{second}");
    let restored = second["kernel"]["restored"].as_array().unwrap();
    assert!(restored.contains(&json!("a")), "{second}");
    let (third, _) = cell(
        &server,
        "python",
        "print(a['k'], a is b)\n",
        archive.as_deref(),
        Some(kernel),
    );
    assert_eq!(stdout(&third), "[1, 2, 3] True\n", "{third}");
}

#[test]
fn ker_03_handles_sockets_and_threads_are_named_as_not_kept() {
    if !root_or_skip("ker_03_handles_sockets_and_threads_are_named_as_not_kept") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let kernel = order("ws-b");
    let (reply, archive) = cell(
        &server,
        "python",
        "import socket, threading\nf = open('notes.txt', 'w')\ns = socket.socket()\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\nholder = {'s': s}\nx = 7\n",
        None,
        Some(kernel.clone()),
    );
    assert_eq!(reply["exit_code"], 0, "{reply}");
    let not_kept: Vec<(String, String)> = reply["kernel"]["not_kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_owned(),
                n["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let reason = |name: &str| {
        not_kept
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.as_str())
            .unwrap_or_else(|| panic!("{name} not reported: {reply}"))
    };
    assert_eq!(reason("f"), "an open file");
    assert_eq!(reason("s"), "a socket");
    assert_eq!(reason("t"), "a thread");
    assert_eq!(reason("holder"), "holds a socket");
    let (next, _) = cell(
        &server,
        "python",
        "print(x, 'f' in globals(), 's' in globals())\n",
        archive.as_deref(),
        Some(kernel),
    );
    assert_eq!(stdout(&next), "7 False False\n", "{next}");
}

#[test]
fn ker_02_node_cells_keep_maps_dates_bigints_and_functions() {
    if !root_or_skip("ker_02_node_cells_keep_maps_dates_bigints_and_functions") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let kernel = order("ws-c");
    let (first, archive) = cell(
        &server,
        "node",
        "state.visits = 1;\nconst m = new Map([['a', 1]]);\nlet when = new Date(86400000);\nvar big = 2n ** 70n;\nconst cyc = { name: 'c' }; cyc.self = cyc;\nconst alias = m;\nfunction twice(x) { return 2 * x; }\nconst net = require('net');\nconst sock = new net.Socket();\n",
        None,
        Some(kernel.clone()),
    );
    assert_eq!(first["exit_code"], 0, "{first}");
    let not_kept = first["kernel"]["not_kept"].to_string();
    assert!(not_kept.contains("\"sock\""), "{first}");
    let (second, _) = cell(
        &server,
        "node",
        "state.visits += 1;\nconsole.log(m.get('a'), when.toISOString(), big.toString(), cyc.self === cyc, alias === m, twice(21), state.visits);\n",
        archive.as_deref(),
        Some(kernel),
    );
    assert_eq!(
        stdout(&second),
        "1 1970-01-02T00:00:00.000Z 1180591620717411303424 true true 42 2\n",
        "{second}"
    );
}

#[test]
fn ker_02_a_checkpoint_not_written_by_the_kernel_is_refused_and_nothing_runs() {
    if !root_or_skip("ker_02_a_checkpoint_not_written_by_the_kernel_is_refused_and_nothing_runs") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let kernel = order("ws-d");
    let (_, archive) = cell(&server, "python", "x = 1\n", None, Some(kernel.clone()));
    let archive = archive.unwrap();
    let original = files(&archive);
    let checkpoint = original
        .iter()
        .find(|(p, _)| p == ".corral/kernel/python.ckpt")
        .unwrap()
        .1
        .clone();
    let refused = |workspace: String, kernel: Value| {
        let (reply, after) = cell(
            &server,
            "python",
            "open('ran.txt', 'w').write('ran')\nprint('ran')\n",
            Some(&workspace),
            Some(kernel),
        );
        assert_eq!(stdout(&reply), "", "the cell ran: {reply}");
        assert!(
            after.is_none()
                || !files(after.as_ref().unwrap())
                    .iter()
                    .any(|(p, _)| p == "ran.txt")
        );
        reply["not_run"].as_str().unwrap_or_default().to_owned()
    };
    // Truncated.
    let mut truncated = original.clone();
    for (path, data) in &mut truncated {
        if path == ".corral/kernel/python.ckpt" {
            data.truncate(data.len() - 3);
        }
    }
    assert_eq!(
        refused(tar_of(&truncated), kernel.clone()),
        "kernel_checkpoint_corrupt"
    );
    // Written by an ephemeral run in the kernel's own format, beside the seal that was there:
    // the seal does not verify it.
    let impersonate = "import hashlib, json, pickle\n\
payload = pickle.dumps({'x': 666})\n\
header = json.loads(open('.corral/kernel/python.ckpt', 'rb').read().split(b'\\n')[1])\n\
header.update(payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())\n\
open('.corral/kernel/python.ckpt', 'wb').write(b'CORRAL-KERNEL 1\\n' + json.dumps(header).encode() + b'\\n' + payload)\n";
    let (wrote, forged) = cell(&server, "python", impersonate, Some(&archive), None);
    assert_eq!(wrote["exit_code"], 0, "{wrote}");
    let forged = forged.unwrap();
    assert!(
        files(&forged)
            .iter()
            .any(|(p, d)| p == ".corral/kernel/python.ckpt" && *d != checkpoint)
    );
    assert_eq!(
        refused(forged, kernel.clone()),
        "kernel_checkpoint_untrusted"
    );
    // The kernel's own checkpoint without its seal.
    let mut unsealed = original.clone();
    unsealed.retain(|(p, _)| p != ".corral/kernel/python.seal");
    assert_eq!(
        refused(tar_of(&unsealed), kernel.clone()),
        "kernel_checkpoint_untrusted"
    );
    // Sealed for another workspace.
    assert_eq!(
        refused(archive.clone(), order("ws-other")),
        "kernel_checkpoint_untrusted"
    );
    // The untouched checkpoint still restores.
    let (ok, _) = cell(
        &server,
        "python",
        "print(x)\n",
        Some(&archive),
        Some(kernel),
    );
    assert_eq!(stdout(&ok), "1\n", "{ok}");
}

#[test]
fn ker_02_a_failing_cell_shows_its_own_line_and_keeps_what_it_defined() {
    if !root_or_skip("ker_02_a_failing_cell_shows_its_own_line_and_keeps_what_it_defined") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "python,node")]);
    for (language, code, line, next, expected) in [
        (
            "python",
            "kept = 5\n1 / 0\n",
            "1 / 0",
            "print(kept)\n",
            "5\n",
        ),
        (
            "node",
            "var kept = 5;\nnull.x;\n",
            "null.x;",
            "console.log(kept);\n",
            "5\n",
        ),
    ] {
        let kernel = order(&format!("ws-fail-{language}"));
        let (failed, archive) = cell(&server, language, code, None, Some(kernel.clone()));
        assert_eq!(failed["exit_code"], 1, "{failed}");
        let stderr = failed["stderr"]["text"].as_str().unwrap();
        assert!(stderr.contains(line), "{stderr}");
        assert!(
            !stderr.contains("corralKernel") && !stderr.contains("_corral_kernel"),
            "{stderr}"
        );
        assert_eq!(failed["kernel"]["checkpointed"], true, "{failed}");
        let (after, _) = cell(&server, language, next, archive.as_deref(), Some(kernel));
        assert_eq!(stdout(&after), expected, "{after}");
    }
}

#[test]
fn ker_02_a_cell_planting_a_fifo_at_the_seal_does_not_hang_the_worker() {
    if !root_or_skip("ker_02_a_cell_planting_a_fifo_at_the_seal_does_not_hang_the_worker") {
        return;
    }
    let _serial = serial();
    let server = Server::start(&[]);
    let kernel = order("ws-fifo");
    let (first, archive) = cell(&server, "python", "x = 1\n", None, Some(kernel.clone()));
    assert_eq!(first["kernel"]["checkpointed"], true, "{first}");
    // The cell replaces the seal with a FIFO: a supervisor opening it to write would block.
    let (planted, archive) = cell(
        &server,
        "python",
        "import os\nos.remove('.corral/kernel/python.seal')\nos.mkfifo('.corral/kernel/python.seal')\ny = 2\n",
        archive.as_deref(),
        Some(kernel.clone()),
    );
    assert_eq!(planted["exit_code"], 0, "{planted}");
    assert_eq!(planted["kernel"]["checkpointed"], true, "{planted}");
    let (after, _) = cell(
        &server,
        "python",
        "print(x + y)\n",
        archive.as_deref(),
        Some(kernel),
    );
    assert_eq!(stdout(&after), "3\n", "{after}");
}
