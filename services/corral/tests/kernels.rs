//! Persistent kernels through the whole stack (KER-1 to KER-5, decision 0016): `corral up`, cells
//! sent to `POST /v1/run_code` as an agent platform sends them, each on whichever clean worker
//! the pool gives. Needs root, Valkey and the baked stack; without them each test skips through
//! `corral_testkit::skip`, which CI forbids.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::stack::{Stack, fetcher, stdout};

#[path = "../../egress-proxy/tests/support/netns.rs"]
#[allow(dead_code)]
mod netns;
use corral_testkit::{Need, skip};
use serde_json::{Value, json};

/// Where `scripts/build-python-stack` puts the stack (`CORRAL_JAIL_PYTHON_STACK`'s default).
const STACK: &str = "/opt/corral/python";

fn stack_or_skip(test: &str) -> bool {
    if Path::new(STACK).join("corral-stack.tsv").exists() {
        return true;
    }
    skip(
        test,
        Need::Tools,
        "no baked stack: run scripts/build-python-stack",
    );
    false
}

fn cell(language: &str, actor: &str, conversation: &str, code: &str) -> Value {
    json!({ "actor": actor, "conversation": conversation, "member": actor, "language": language,
            "code": code, "kernel": "persistent" })
}

/// Waits until `count` workers are warm (the pool leases the one warm the longest).
async fn warm(stack: &Stack, count: u32) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counts = stack.settled().await.counts();
        if counts.warm >= count {
            return;
        }
        assert!(Instant::now() < deadline, "never {count} warm: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn names(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_01_ker_02_a_python_session_moves_across_three_workers_and_keeps_its_state() {
    let test = "ker_01_ker_02_a_python_session_moves_across_three_workers_and_keeps_its_state";
    if !stack_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(test, &[("SANDBOX_WARM_POOL_MIN", "3")], &[]) else {
        return;
    };
    warm(&stack, 3).await;
    let cells = [
        "import pandas as pd\n\
         df = pd.DataFrame({'n': [1, 2, 3], 'sq': [1, 4, 9]})\n\
         a = {'k': [1]}\n\
         b = a\n\
         loop = [0]\n\
         loop.append(loop)\n\
         def total(frame):\n    return int(frame['sq'].sum())\n\
         class Counter:\n    def __init__(self):\n        self.n = 0\n    def bump(self):\n        self.n += 1\n        return self.n\n\
         c = Counter()\n\
         c.bump()\n",
        "b['k'].append(2)\n\
         print(total(df), b is a, loop[1] is loop, c.bump(), type(c).__name__)\n",
        "print(a['k'], len(df), c.bump())\n",
    ];
    let mut workers = Vec::new();
    for (i, code) in cells.iter().enumerate() {
        let (status, body) = stack.run(cell("python", "ana", "kernel-1", code)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["outcome"], "succeeded", "cell {i}: {body}");
        let kernel = &body["model"]["kernel"];
        assert_eq!(kernel["mode"], "persistent", "{body}");
        assert_eq!(kernel["durable"], true, "{body}");
        assert!(names(&kernel["kept"]).contains(&"df"), "{body}");
        workers.push(body["model"]["worker"].as_str().unwrap().to_owned());
        match i {
            0 => assert!(names(&kernel["restored"]).is_empty(), "{body}"),
            1 => {
                assert_eq!(stdout(&body), "14 True True 2 Counter\n", "{body}");
                for name in ["df", "a", "b", "loop", "total", "Counter", "c"] {
                    assert!(names(&kernel["restored"]).contains(&name), "{name}: {body}");
                }
            }
            _ => assert_eq!(stdout(&body), "[1, 2] 3 3\n", "{body}"),
        }
        // The next cell goes to the worker warm the longest: wait for this one's reset.
        warm(&stack, 3).await;
    }
    workers.sort();
    workers.dedup();
    assert_eq!(workers.len(), 3, "three cells, three workers: {workers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_03_handles_are_not_kept_and_an_oversized_checkpoint_is_not_durable() {
    let test = "ker_03_handles_are_not_kept_and_an_oversized_checkpoint_is_not_durable";
    if !stack_or_skip(test) {
        return;
    }
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let (_, body) = stack
        .run(cell(
            "python",
            "ben",
            "kernel-2",
            "import socket, threading\nkept = 41\nf = open('log.txt', 'w')\ns = socket.socket()\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n",
        ))
        .await;
    assert_eq!(body["outcome"], "succeeded", "{body}");
    let not_kept = &body["model"]["kernel"]["not_kept"];
    let reason = |name: &str| {
        not_kept
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["reason"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("{name} not named: {body}"))
    };
    assert_eq!(reason("f"), "an open file");
    assert_eq!(reason("s"), "a socket");
    assert_eq!(reason("t"), "a thread");
    // A cell whose checkpoint pushes the workspace over SANDBOX_WORKSPACE_MAX_BYTES (8 MiB).
    let (_, over) = stack
        .run(cell(
            "python",
            "ben",
            "kernel-2",
            "import os\nkept = 42\nbig = os.urandom(9 * 1024 * 1024)\n",
        ))
        .await;
    assert_eq!(over["outcome"], "bound_exceeded", "{over}");
    assert_eq!(
        over["model"]["bound"], "SANDBOX_WORKSPACE_MAX_BYTES",
        "{over}"
    );
    assert_eq!(over["model"]["kernel"]["durable"], false, "{over}");
    assert_eq!(over["model"]["kernel"]["checkpointed"], false, "{over}");
    // The previous checkpoint stays authoritative.
    let (_, after) = stack
        .run(cell(
            "python",
            "ben",
            "kernel-2",
            "print(kept, 'big' in globals())\n",
        ))
        .await;
    assert_eq!(stdout(&after), "41 False\n", "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_02_a_node_session_keeps_a_map_a_date_and_a_bigint_across_workers() {
    let test = "ker_02_a_node_session_keeps_a_map_a_date_and_a_bigint_across_workers";
    let Some(stack) = Stack::start(test, &[("SANDBOX_WARM_POOL_MIN", "2")], &[]) else {
        return;
    };
    warm(&stack, 2).await;
    let (_, first) = stack
        .run(cell(
            "node",
            "cy",
            "kernel-3",
            "const seen = new Map([['x', 1]]);\nconst when = new Date(Date.UTC(2026, 11, 3));\nconst big = 2n ** 64n;\n",
        ))
        .await;
    assert_eq!(first["outcome"], "succeeded", "{first}");
    warm(&stack, 2).await;
    let (_, second) = stack
        .run(cell(
            "node",
            "cy",
            "kernel-3",
            "seen.set('y', 2);\nconsole.log(seen.get('x'), seen.size, when.toISOString(), (big + 1n).toString());\n",
        ))
        .await;
    assert_eq!(
        stdout(&second),
        "1 2 2026-12-03T00:00:00.000Z 18446744073709551617\n",
        "{second}"
    );
    assert_ne!(first["model"]["worker"], second["model"]["worker"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_05_a_persistent_cell_has_no_egress_and_no_resources() {
    let test = "ker_05_a_persistent_cell_has_no_egress_and_no_resources";
    let Some(mut ns) = netns::netns_or_skip(test) else {
        return;
    };
    let upstream = ns.start_echo_server(80).expect("echo server");
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    // The administrator opens a route to the upstream, so that a refusal below is the kernel's
    // and not the policy's.
    let policy = json!({
        "SANDBOX_EGRESS_MODE": "private_network",
        "SANDBOX_EGRESS_PRIVATE_CIDRS": format!("{}/32", upstream.ip()),
        "SANDBOX_EGRESS_ALLOWED_PORTS": "80",
    });
    stack.put_egress_policy(&policy).await;
    let fetch = fetcher(&[format!("http://{}/kernel", upstream.ip())]);
    // The positive control: an ephemeral run of the same actor and conversation reaches it.
    let (_, open) = stack
        .run(
            json!({ "actor": "dee", "conversation": "kernel-4", "member": "dee",
                      "language": "python", "code": fetch.clone() }),
        )
        .await;
    assert!(
        stdout(&open).starts_with("status 200 method=GET path=/kernel"),
        "the route is open to an ephemeral run: {open}"
    );
    // A persistent cell does not, under the same policy: it holds no grant, so the worker's
    // relay refuses the connection itself and the proxy is never asked (decision 0008).
    let (_, body) = stack.run(cell("python", "dee", "kernel-4", &fetch)).await;
    assert_eq!(body["outcome"], "succeeded", "{body}");
    assert_eq!(
        stdout(&body),
        "status 407 grant_missing\n",
        "a persistent cell was not refused for want of a grant: {body}"
    );
    assert_eq!(
        body["model"]["egress"]["effective_mode"], "isolated",
        "{body}"
    );
    assert_eq!(
        body["model"]["egress"]["notes"],
        json!(["persistent_kernel"]),
        "{body}"
    );
    for name in [
        "KAIZEN_SHARED_RESOURCES_MANIFEST",
        "KAIZEN_SHARED_RESOURCES_DIR",
    ] {
        let (status, body) = stack
            .run(cell(
                "python",
                "dee",
                "kernel-4",
                &format!("import os\nprint(open(os.environ[{name:?}]).read())\n"),
            ))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["outcome"], "not_run", "{body}");
        assert_eq!(
            body["model"]["not_run"], "resource_persistent_kernel",
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_04_with_persistence_off_a_kernel_keeps_its_worker_and_its_state() {
    let test = "ker_04_with_persistence_off_a_kernel_keeps_its_worker_and_its_state";
    let Some(stack) = Stack::start(
        test,
        &[
            ("SANDBOX_WORKSPACE_PERSIST", "false"),
            ("SANDBOX_WARM_POOL_MIN", "2"),
        ],
        &[],
    ) else {
        return;
    };
    warm(&stack, 2).await;
    let (_, first) = stack
        .run(cell("python", "eve", "kernel-5", "x = [1, 2]\ny = x\n"))
        .await;
    assert_eq!(first["outcome"], "succeeded", "{first}");
    let kernel = &first["model"]["kernel"];
    assert_eq!(kernel["durability"], "affinity", "{first}");
    assert_eq!(kernel["durable"], true, "{first}");
    // The lease is held between cells: an ephemeral run of the same conversation gets another
    // worker and an empty workspace.
    let (_, other) = stack
        .run(
            json!({ "actor": "eve", "conversation": "kernel-5", "member": "eve",
                     "language": "python", "code": "import os\nprint(sorted(os.listdir('.')))\n" }),
        )
        .await;
    assert_eq!(stdout(&other), "[]\n", "{other}");
    assert_ne!(
        other["model"]["worker"], first["model"]["worker"],
        "{other}"
    );
    let (_, second) = stack
        .run(cell(
            "python",
            "eve",
            "kernel-5",
            "y.append(3)\nprint(x, x is y)\n",
        ))
        .await;
    assert_eq!(stdout(&second), "[1, 2, 3] True\n", "{second}");
    assert_eq!(
        second["model"]["worker"], first["model"]["worker"],
        "{second}"
    );
    assert_eq!(
        second["model"]["kernel"]["session_ended"],
        Value::Null,
        "{second}"
    );
    // Every cell is a fresh interpreter on that worker; another conversation's kernel starts
    // empty.
    let (_, fresh) = stack
        .run(cell(
            "python",
            "eve",
            "kernel-6",
            "print('x' in globals())\n",
        ))
        .await;
    assert_eq!(stdout(&fresh), "False\n", "{fresh}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_05_a_persistent_cell_calls_read_only_tools_without_holding_the_capability() {
    let test = "ker_05_a_persistent_cell_calls_read_only_tools_without_holding_the_capability";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let capability = format!(
        "capability-marker-{}",
        corral_core::ids::hex(&corral_contract::credential::random_bytes())
    );
    let code = "import corral_tools, json, os\n\
        out = {'available': corral_tools.available()}\n\
        out['echo'] = corral_tools.call('sample.echo', q='hi')\n\
        out['words'] = corral_tools.call('sample.word_count', text='one two three')\n\
        for name in ['mail.send', 'run_code', 'sample.large', 'sample.absent']:\n\
        \x20   try:\n\
        \x20       corral_tools.call(name)\n\
        \x20       out[name] = 'called'\n\
        \x20   except corral_tools.ToolError as e:\n\
        \x20       out[name] = e.code\n\
        import re\n\
        marker = re.compile(('capa' + 'bility-marker-').encode() + rb'[0-9a-f]{64}')\n\
        found = []\n\
        if any(marker.search(v.encode()) for v in os.environ.values()):\n\
        \x20   found.append('environ')\n\
        for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n\
        \x20   for part in ('environ', 'cmdline'):\n\
        \x20       try:\n\
        \x20           if marker.search(open('/proc/%s/%s' % (pid, part), 'rb').read()):\n\
        \x20               found.append('/proc/%s/%s' % (pid, part))\n\
        \x20       except OSError:\n\
        \x20           pass\n\
        with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb') as mem:\n\
        \x20   for line in maps:\n\
        \x20       span, perms = line.split()[:2]\n\
        \x20       if 'r' not in perms:\n\
        \x20           continue\n\
        \x20       start, end = (int(x, 16) for x in span.split('-'))\n\
        \x20       try:\n\
        \x20           mem.seek(start)\n\
        \x20           chunk = mem.read(min(end - start, 1 << 28))\n\
        \x20       except (OSError, ValueError, OverflowError):\n\
        \x20           continue\n\
        \x20       if marker.search(chunk):\n\
        \x20           found.append('memory ' + line.split()[-1])\n\
        for top in ('/workspace', '/tmp', '/run', '/etc', '/home', '/root'):\n\
        \x20   for root, dirs, files in os.walk(top):\n\
        \x20       for name in files:\n\
        \x20           path = os.path.join(root, name)\n\
        \x20           try:\n\
        \x20               if not os.path.islink(path) and marker.search(open(path, 'rb').read()):\n\
        \x20                   found.append(path)\n\
        \x20           except OSError:\n\
        \x20               pass\n\
        out['found'] = found\n\
        print(json.dumps(out, sort_keys=True))\n";
    let mut body = cell("python", "fay", "kernel-7", code);
    body["tools"] = json!({
        "capability": capability,
        "tools": [
            { "name": "sample.echo", "access": "read" },
            { "name": "sample.word_count", "access": "read" },
            { "name": "sample.large", "access": "read" },
            { "name": "mail.send", "access": "write" },
            { "name": "run_code", "access": "read" },
        ],
    });
    let (status, answer) = stack.run(body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"], "succeeded", "{answer}");
    let out: Value = serde_json::from_str(stdout(&answer).trim()).expect("JSON");
    assert_eq!(
        out["available"],
        json!(["sample.echo", "sample.word_count", "sample.large"]),
        "{out}"
    );
    // The platform's endpoint got the capability (it says which by digest); the code never did.
    use sha2::Digest as _;
    let digest = corral_core::ids::hex(&sha2::Sha256::digest(capability.as_bytes()));
    assert_eq!(out["echo"]["echo"], json!({ "q": "hi" }), "{out}");
    assert_eq!(out["echo"]["capability_sha256"], digest[..16], "{out}");
    assert_eq!(out["words"]["words"], 3, "{out}");
    assert_eq!(out["mail.send"], "tool_write_refused", "{out}");
    assert_eq!(out["run_code"], "tool_recursive_refused", "{out}");
    assert_eq!(out["sample.large"], "tool_payload_too_large", "{out}");
    assert_eq!(out["sample.absent"], "tool_not_granted", "{out}");
    assert_eq!(out["found"], json!([]), "{out}");
    // A malformed grant is refused before any lease.
    let mut bad = cell("python", "fay", "kernel-7", "print(1)");
    bad["tools"] = json!({ "capability": "", "tools": [] });
    let (status, refused) = stack.run(bad).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (400, Some("tools_invalid")),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ker_05_node_code_calls_tools_through_its_library() {
    let test = "ker_05_node_code_calls_tools_through_its_library";
    let Some(stack) = Stack::start(test, &[], &[]) else {
        return;
    };
    let mut body = cell(
        "node",
        "gus",
        "kernel-8",
        "const tools = require('./corral_tools');\n\
         (async () => {\n\
           const words = await tools.call('sample.word_count', { text: 'a b c d' });\n\
           let refused = '';\n\
           try { await tools.call('mail.send', {}); } catch (e) { refused = e.code; }\n\
           console.log(JSON.stringify({ tools: await tools.available(), words, refused }));\n\
         })();\n",
    );
    body["tools"] = json!({
        "capability": "capability-for-node",
        "tools": [
            { "name": "sample.word_count", "access": "read" },
            { "name": "mail.send", "access": "write" },
        ],
    });
    let (status, answer) = stack.run(body).await;
    assert_eq!(status, 200, "{answer}");
    let out: Value = serde_json::from_str(stdout(&answer).trim()).expect("JSON");
    assert_eq!(
        out,
        json!({ "tools": ["sample.word_count"], "words": { "words": 4 }, "refused": "tool_write_refused" }),
        "{answer}"
    );
}
