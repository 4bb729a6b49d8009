"""The Python client against a real `corral up`: CORRAL_API_URL and CORRAL_API_TOKEN_FILE name
it (services/corral/tests/python_client.rs starts one and runs these). Without them every test
skips, unless CORRAL_REQUIRE_SERVICES is set (CI), when each fails instead."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
import uuid

import httpx
import pytest

from corral_client import (
    AsyncClient,
    Busy,
    CapacityUnavailable,
    Client,
    CorralError,
    InvalidRequest,
    PackageRejected,
    Unauthorized,
)


def _stack() -> tuple[str, str]:
    url = os.environ.get("CORRAL_API_URL")
    token_file = os.environ.get("CORRAL_API_TOKEN_FILE")
    if not url or not token_file:
        why = "no corral up: set CORRAL_API_URL and CORRAL_API_TOKEN_FILE"
        if os.environ.get("CORRAL_REQUIRE_SERVICES"):
            pytest.fail(why)
        pytest.skip(why)
    with open(token_file, encoding="utf-8") as f:
        return url, f.read().strip()


@pytest.fixture
def corral():
    url, token = _stack()
    # A conversation of its own per test: workspaces and kernels never meet.
    with Client(url, token, actor="py-client", conversation=uuid.uuid4().hex) as client:
        yield client


def test_the_models_and_routes_are_the_openapi_documents(corral: Client) -> None:
    from corral_client._models import RUN_MODEL_FIELDS

    document = corral._http.get("/openapi.json").json()
    run = document["components"]["schemas"]["RunResult"]["properties"]
    assert {"run_id", "outcome", "error", "model", "member"} <= set(run), sorted(run)
    missing = [name for name in RUN_MODEL_FIELDS if name not in run["model"]["properties"]]
    assert not missing, missing
    for route in ("/v1/run_code", "/v1/runs/{run_id}/events", "/v1/read_workspace", "/v1/edit_workspace",
                  "/v1/list_workspace", "/v1/write_workspace", "/v1/validate_package", "/v1/browser_sessions"):
        assert route in document["paths"], route


def test_a_run_answers_its_output(corral: Client) -> None:
    result = corral.run_code("print(6 * 7)")
    assert result.succeeded, result.body
    assert result.stdout.text == "42\n"
    assert result.exit_code == 0
    assert result.run_id


def test_a_failed_run_is_a_result_not_an_exception(corral: Client) -> None:
    result = corral.run_code("import sys; print('partial'); sys.exit(3)")
    assert result.outcome == "failed"
    assert result.exit_code == 3
    assert result.stdout.text == "partial\n"


def test_node_runs_too(corral: Client) -> None:
    assert corral.run_code("console.log([1, 2, 3].map((x) => x * 2).join(','))", "node").stdout.text == "2,4,6\n"


def test_a_refusal_is_its_typed_exception_with_its_stable_code() -> None:
    url, token = _stack()
    with Client(url, token, actor="", conversation="c") as bad:
        with pytest.raises(InvalidRequest) as refused:
            bad.run_code("print(1)")
    assert refused.value.code == "invalid_identity"
    assert refused.value.status == 400
    with Client(url, "not-the-credential-at-all", actor="a", conversation="c") as stranger:
        with pytest.raises(Unauthorized) as refused:
            stranger.run_code("print(1)")
    assert refused.value.code == "unauthorized"


def test_refusals_map_to_their_types_and_carry_retry_after() -> None:
    # The API's refusal shapes, replayed by httpx's mock transport: a mock of the server, used
    # only to reach the codes a single machine's pool cannot be made to give on demand.
    answers = {
        "queue_full": (429, "2"),
        "wait_timeout": (503, "5"),
        "kernel_busy": (409, None),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        code = next(c for c in answers if c in request.content.decode())
        status, retry = answers[code]
        headers = {"Retry-After": retry} if retry else {}
        return httpx.Response(status, headers=headers,
                              json={"outcome": "refused", "error": {"code": code, "message": code}})

    with Client("http://corral.invalid", "t" * 32, actor="a", conversation="c",
                transport=httpx.MockTransport(handler)) as mocked:
        with pytest.raises(CapacityUnavailable) as full:
            mocked.run_code("queue_full")
        assert (full.value.code, full.value.status, full.value.retry_after) == ("queue_full", 429, 2.0)
        with pytest.raises(CapacityUnavailable) as waited:
            mocked.run_code("wait_timeout")
        assert waited.value.retry_after == 5.0
        with pytest.raises(Busy) as busy:
            mocked.run_code("kernel_busy")
        assert busy.value.retry_after is None


def test_a_full_pool_refuses_with_its_typed_exception_and_retry_after(corral: Client) -> None:
    # The stack allows two workers at once (SANDBOX_POOL_MAX_ALLOCATED=2): two runs hold both,
    # each seen running before the third asks, which waits a second and is refused.
    url, token = _stack()
    running = [threading.Event(), threading.Event()]

    def hold(started: threading.Event) -> None:
        with Client(url, token, actor="py-holder", conversation=uuid.uuid4().hex) as holder:
            for event in holder.stream_code("import time; time.sleep(4)"):
                if event.name == "run.running":
                    started.set()

    holders = [threading.Thread(target=hold, args=(started,)) for started in running]
    for thread in holders:
        thread.start()
    try:
        assert all(started.wait(60) for started in running), "the holders never ran"
        with pytest.raises(CapacityUnavailable) as full:
            corral.run_code("print('third')", wait_seconds=1)
        assert (full.value.code, full.value.status) == ("wait_timeout", 503)
        assert full.value.retry_after is not None and full.value.retry_after > 0
    finally:
        for thread in holders:
            thread.join()


def test_a_streamed_run_gives_its_events_as_they_happen(corral: Client) -> None:
    events = []
    result = corral.run_code("import time; time.sleep(1.0); print('done')", on_event=events.append)
    assert [e.name for e in events] == ["run.queued", "run.running", "run.output", "run.result"]
    running, final = events[1], events[-1]
    # The running event arrived while the code still slept.
    assert final.received_at - running.received_at >= 0.9, events
    assert result.stdout.text == "done\n"
    # Numbered in order, each once.
    assert [e.id for e in events] == [f"{result.run_id}-{n}" for n in range(1, 5)]


def test_a_streamed_runs_chunks_arrive_before_it_ends(corral: Client) -> None:
    chunks: list[tuple[float, str]] = []
    errors: list[str] = []
    code = "import sys, time\nprint('early', flush=True)\nprint('oops', file=sys.stderr)\ntime.sleep(1.5)\nprint('late')"
    result = corral.run_code(code, on_stdout=lambda text: chunks.append((time.monotonic(), text)),
                             on_stderr=errors.append)
    ended = time.monotonic()
    assert chunks[0][1] == "early\n", chunks
    # The first chunk came while the code slept, long before the answer.
    assert ended - chunks[0][0] >= 1.2, (ended, chunks)
    assert "".join(text for _, text in chunks) == result.stdout.text == "early\nlate\n"
    assert "".join(errors) == "oops\n"


def test_a_stream_resumed_on_another_replica_loses_and_repeats_nothing(corral: Client) -> None:
    replica_url = os.environ.get("CORRAL_API_REPLICA_URL")
    if not replica_url:
        pytest.fail("no second API replica: set CORRAL_API_REPLICA_URL (corral up --api-replicas 2)")
    _, token = _stack()
    code = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
    before = []
    stream = corral.stream_code(code)
    for event in stream:
        before.append(event)
        if sum(e.name == "run.output" for e in before) == 2:
            break
    stream.close()  # the connection drops mid-run
    run_id = before[0].data["run_id"]
    identity = corral._api.identity
    with Client(replica_url, token, actor=identity["actor"], conversation=identity["conversation"]) as other:
        after = list(other.resume(run_id, last_event_id=before[-1].id))
    assert after[-1].name == "run.result"
    events = before + after
    assert [e.id for e in events] == [f"{run_id}-{n}" for n in range(1, len(events) + 1)]
    text = "".join(e.data["text"] for e in events if e.name == "run.output")
    assert text == "".join(f"line {i}\n" for i in range(6)) == after[-1].data["body"]["model"]["stdout"]["text"]
    with pytest.raises(InvalidRequest) as future:
        list(corral.resume(run_id, last_event_id=f"{run_id}-999"))
    assert future.value.code == "last_event_id_future"


def test_a_persistent_kernel_keeps_its_state_across_three_calls(corral: Client) -> None:
    assert corral.run_code("items = [1]", kernel="persistent").succeeded
    assert corral.run_code("items.append(2)", kernel="persistent").succeeded
    third = corral.run_code("print(items)", kernel="persistent")
    assert third.stdout.text == "[1, 2]\n", third.body


def test_a_dataframe_and_a_figure_are_rich_results(corral: Client) -> None:
    frame = corral.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert frame.succeeded, frame.body
    assert "<table" in frame.results[0]["text/html"] and "text/plain" in frame.results[0], frame.results
    figure = corral.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('shown')\nplt.show()")
    pngs = [r["image/png"] for r in figure.results if "image/png" in r]
    assert len(pngs) == 1, figure.results
    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    # In a persistent kernel too: the value of the cell's last expression.
    corral.run_code("import pandas as pd\nframe = pd.DataFrame({'x': [7]})", kernel="persistent")
    kept = corral.run_code("frame", kernel="persistent")
    assert "<table" in kept.results[0]["text/html"], kept.results


def test_the_workspace_is_read_and_edited_by_its_anchors(corral: Client) -> None:
    assert corral.run_code("open('notes.txt', 'w').write('alpha\\nbeta\\n')").succeeded
    assert corral.read_file("notes.txt") == b"alpha\nbeta\n"
    view = corral.read_hashline("notes.txt")
    assert view.total_lines == 2
    line, rest = view.lines[1].split(":", 1)
    tag = rest.split("|", 1)[0]
    edited = corral.edit_file("notes.txt", [{"op": "replace", "line": int(line), "tag": tag, "text": "gamma"}])
    assert edited["outcome"] == "applied", edited
    assert corral.read_file("notes.txt") == b"alpha\ngamma\n"
    with pytest.raises(CorralError) as stale:
        corral.edit_file("notes.txt", [{"op": "replace", "line": int(line), "tag": tag, "text": "delta"}])
    assert stale.value.code == "stale_anchor"


def test_a_file_is_created_listed_and_never_replaced(corral: Client) -> None:
    created = corral.write_file("data/a.txt", "one\ntwo\n")
    assert created["generation"] == 1 and created["hashline"]["total_lines"] == 2, created
    corral.write_file("b.bin", b"\x00\xff")
    listed = corral.list_files()
    assert [(f["path"], f["kind"], f["bytes"]) for f in listed["files"]] == [
        ("b.bin", "file", 2), ("data", "directory", 0), ("data/a.txt", "file", 8)]
    with pytest.raises(CorralError) as exists:
        corral.write_file("data/a.txt", "replaced?")
    assert (exists.value.code, exists.value.status) == ("workspace_path_exists", 409)
    assert corral.read_file("data/a.txt") == b"one\ntwo\n"
    assert corral.read_file("b.bin") == b"\x00\xff"


SKILL = "---\nname: tidy\ndescription: Tidies a list.\n---\nSort it.\n"


def test_a_pi_package_is_admitted_or_rejected_with_its_code(corral: Client) -> None:
    files = {"package.json": '{"name":"tidy","version":"1.0.0"}', "skills/tidy/SKILL.md": SKILL}
    admitted = corral.validate_package(files, {"name": "tidy", "version": "1.0.0", "skills": ["tidy"]})
    assert admitted.profile == "skill_only"
    assert admitted.surface["skills"] == ["tidy"]
    with pytest.raises(PackageRejected) as rejected:
        corral.validate_package(files, {"name": "tidy", "version": "1.0.0", "skills": ["neat"]})
    assert rejected.value.code == "package_declaration_mismatch"
    assert rejected.value.step == "static"


def test_the_async_client_runs_and_streams() -> None:
    url, token = _stack()

    async def both() -> tuple[str, list[str]]:
        async with AsyncClient(url, token, actor="py-async", conversation=uuid.uuid4().hex) as client:
            result = await client.run_code("print('async')")
            names = [event.name async for event in client.stream_code("print('streamed')")]
            return result.stdout.text, names

    text, names = asyncio.run(both())
    assert text == "async\n"
    assert names == ["run.queued", "run.running", "run.output", "run.result"]
