// The TypeScript client (built to dist/ by tsc) against a real `corral up`: CORRAL_API_URL and
// CORRAL_API_TOKEN_FILE name it (services/corral/tests/typescript_client.rs starts one, builds the
// client and runs these). Without them every test is skipped, unless CORRAL_REQUIRE_SERVICES is
// set (CI), when each fails instead.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import test from "node:test";

import { CapacityUnavailable, Client, InvalidRequest, PackageRejected, RUN_MODEL_FIELDS, Unauthorized } from "../dist/index.js";

const url = process.env.CORRAL_API_URL;
const tokenFile = process.env.CORRAL_API_TOKEN_FILE;
const missing = !url || !tokenFile ? "no corral up: set CORRAL_API_URL and CORRAL_API_TOKEN_FILE" : null;
if (missing && process.env.CORRAL_REQUIRE_SERVICES) throw new Error(missing);
const token = missing ? "" : readFileSync(tokenFile, "utf8").trim();
const live = { skip: missing ?? false };
const client = () => new Client({ baseUrl: url, token, actor: "ts-client", conversation: randomUUID() });

test("the models and routes are the OpenAPI document's", live, async () => {
  const document = await (await fetch(`${url}/openapi.json`)).json();
  const run = document.components.schemas.RunResult.properties;
  for (const field of RUN_MODEL_FIELDS) assert.ok(field in run.model.properties, field);
  for (const route of ["/v1/run_code", "/v1/runs/{run_id}/events", "/v1/list_workspace", "/v1/write_workspace", "/v1/edit_workspace"]) {
    assert.ok(route in document.paths, route);
  }
});

test("a run answers its output", live, async () => {
  const result = await client().runCode("print(6 * 7)");
  assert.equal(result.outcome, "succeeded");
  assert.equal(result.stdout.text, "42\n");
  assert.equal(result.exitCode, 0);
});

test("a failed run is a result, not an exception", live, async () => {
  const result = await client().runCode("process.stdout.write('partial\\n'); process.exit(3)", "node");
  assert.equal(result.outcome, "failed");
  assert.equal(result.exitCode, 3);
  assert.equal(result.stdout.text, "partial\n");
});

test("a refusal is its typed error with its stable code", live, async () => {
  const bad = new Client({ baseUrl: url, token, actor: "", conversation: "c" });
  await assert.rejects(bad.runCode("print(1)"), (e) => e instanceof InvalidRequest && e.code === "invalid_identity" && e.status === 400);
  const stranger = new Client({ baseUrl: url, token: "not-the-credential-at-all", actor: "a", conversation: "c" });
  await assert.rejects(stranger.runCode("print(1)"), (e) => e instanceof Unauthorized && e.code === "unauthorized");
});

test("refusals carry Retry-After (the API's shape, replayed by a stand-in fetch)", async () => {
  // A stand-in for the server's answer, to reach a code a single machine cannot give on demand.
  const fetch = async () =>
    new Response(JSON.stringify({ outcome: "refused", error: { code: "wait_timeout", message: "no worker" } }), {
      status: 503,
      headers: { "Retry-After": "5", "Content-Type": "application/json" },
    });
  const mocked = new Client({ baseUrl: "http://corral.invalid", token: "t", actor: "a", conversation: "c", fetch });
  await assert.rejects(mocked.runCode("print(1)"), (e) => e instanceof CapacityUnavailable && e.retryAfter === 5 && e.code === "wait_timeout");
});

test("a full pool refuses with its typed error and Retry-After", live, async () => {
  // The stack allows two workers at once (SANDBOX_POOL_MAX_ALLOCATED=2): two runs hold both,
  // each seen running before the third asks, which waits a second and is refused.
  const holders = [0, 1].map(() => {
    let ran;
    const running = new Promise((resolve) => { ran = resolve; });
    const done = (async () => {
      for await (const event of client().streamCode("import time; time.sleep(4)")) {
        if (event.name === "run.running") ran();
      }
    })();
    return { running, done };
  });
  await Promise.all(holders.map((h) => h.running));
  await assert.rejects(
    client().runCode("print('third')", "python", { wait_seconds: 1 }),
    (e) => e instanceof CapacityUnavailable && e.code === "wait_timeout" && e.status === 503 && e.retryAfter > 0,
  );
  await Promise.all(holders.map((h) => h.done));
});

test("a streamed run gives its events as they happen", live, async () => {
  const events = [];
  const result = await client().runCode("import time; time.sleep(1.0); print('done')", "python", { onEvent: (e) => events.push(e) });
  assert.deepEqual(events.map((e) => e.name), ["run.queued", "run.running", "run.output", "run.result"]);
  assert.ok(events[3].receivedAt - events[1].receivedAt >= 900, JSON.stringify(events));
  assert.equal(result.stdout.text, "done\n");
  assert.deepEqual(events.map((e) => e.id), [1, 2, 3, 4].map((n) => `${result.runId}-${n}`));
});

test("a streamed run's chunks arrive before it ends", live, async () => {
  const chunks = [];
  const errors = [];
  const code = "import sys, time\nprint('early', flush=True)\nprint('oops', file=sys.stderr)\ntime.sleep(1.5)\nprint('late')";
  const result = await client().runCode(code, "python", {
    onStdout: (text) => chunks.push([performance.now(), text]),
    onStderr: (text) => errors.push(text),
  });
  const ended = performance.now();
  assert.equal(chunks[0][1], "early\n");
  assert.ok(ended - chunks[0][0] >= 1200, JSON.stringify({ ended, chunks }));
  assert.equal(chunks.map(([, text]) => text).join(""), result.stdout.text);
  assert.equal(result.stdout.text, "early\nlate\n");
  assert.equal(errors.join(""), "oops\n");
});

test("a stream resumed on another API replica loses and repeats nothing", live, async () => {
  const replicaUrl = process.env.CORRAL_API_REPLICA_URL;
  assert.ok(replicaUrl, "no second API replica: set CORRAL_API_REPLICA_URL (corral up --api-replicas 2)");
  const conversation = randomUUID();
  const first = new Client({ baseUrl: url, token, actor: "ts-client", conversation });
  const code = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n";
  const before = [];
  for await (const event of first.streamCode(code)) {
    before.push(event);
    if (before.filter((e) => e.name === "run.output").length === 2) break; // the connection drops
  }
  const runId = before[0].data.run_id;
  const other = new Client({ baseUrl: replicaUrl, token, actor: "ts-client", conversation });
  const after = [];
  for await (const event of other.resume(runId, before.at(-1).id)) after.push(event);
  assert.equal(after.at(-1).name, "run.result");
  const events = [...before, ...after];
  assert.deepEqual(events.map((e) => e.id), events.map((_, i) => `${runId}-${i + 1}`));
  const text = events.filter((e) => e.name === "run.output").map((e) => e.data.text).join("");
  assert.equal(text, [0, 1, 2, 3, 4, 5].map((i) => `line ${i}\n`).join(""));
  assert.equal(text, after.at(-1).data.body.model.stdout.text);
  await assert.rejects(
    (async () => { for await (const _ of first.resume(runId, `${runId}-999`)) { /* refused first */ } })(),
    (e) => e instanceof InvalidRequest && e.code === "last_event_id_future",
  );
});

test("a persistent kernel keeps its state across three calls", live, async () => {
  const c = client();
  assert.equal((await c.runCode("items = [1]", "python", { kernel: "persistent" })).outcome, "succeeded");
  assert.equal((await c.runCode("items.append(2)", "python", { kernel: "persistent" })).outcome, "succeeded");
  assert.equal((await c.runCode("print(items)", "python", { kernel: "persistent" })).stdout.text, "[1, 2]\n");
});

test("the workspace is read and edited by its anchors", live, async () => {
  const c = client();
  await c.runCode("open('notes.txt', 'w').write('alpha\\nbeta\\n')");
  assert.equal(new TextDecoder().decode(await c.readFile("notes.txt")), "alpha\nbeta\n");
  const view = await c.readHashline("notes.txt");
  const [line, rest] = view.lines[1].split(/:(.*)/s);
  const tag = rest.split("|")[0];
  const edited = await c.editFile("notes.txt", [{ op: "replace", line: Number(line), tag, text: "gamma" }]);
  assert.equal(edited.outcome, "applied");
  assert.equal(new TextDecoder().decode(await c.readFile("notes.txt")), "alpha\ngamma\n");
});

test("a DataFrame and a figure are rich results", live, async () => {
  const corral = client();
  const frame = await corral.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
  assert.ok(frame.results[0]["text/html"].includes("<table"), JSON.stringify(frame.results));
  const figure = await corral.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()");
  const pngs = figure.results.filter((r) => r["image/png"]).map((r) => Buffer.from(r["image/png"], "base64"));
  assert.equal(pngs.length, 1);
  assert.deepEqual([...pngs[0].subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
});

test("a file is created, listed and never replaced", live, async () => {
  const corral = client();
  const created = await corral.writeFile("data/a.txt", "one\ntwo\n");
  assert.equal(created.generation, 1);
  assert.equal(created.hashline.total_lines, 2);
  await corral.writeFile("b.bin", new Uint8Array([0, 255]));
  const listed = await corral.listFiles();
  assert.deepEqual(listed.files.map((f) => [f.path, f.kind, f.bytes]), [
    ["b.bin", "file", 2], ["data", "directory", 0], ["data/a.txt", "file", 8]]);
  await assert.rejects(corral.writeFile("data/a.txt", "replaced?"), (e) => e.code === "workspace_path_exists" && e.status === 409);
  assert.deepEqual([...(await corral.readFile("b.bin"))], [0, 255]);
});

test("a Pi package is admitted or rejected with its code", live, async () => {
  const c = client();
  const files = { "package.json": '{"name":"tidy","version":"1.0.0"}', "skills/tidy/SKILL.md": "---\nname: tidy\ndescription: Tidies a list.\n---\nSort it.\n" };
  const admitted = await c.validatePackage(files, { name: "tidy", version: "1.0.0", skills: ["tidy"] });
  assert.equal(admitted.profile, "skill_only");
  assert.deepEqual(admitted.surface.skills, ["tidy"]);
  await assert.rejects(c.validatePackage(files, { name: "tidy", version: "1.0.0", skills: ["neat"] }),
    (e) => e instanceof PackageRejected && e.code === "package_declaration_mismatch" && e.error.step === "static");
});
