"""Clients of Corral's API: :class:`Client` (sync) and :class:`AsyncClient` (async), over httpx.

Both build the same requests (:class:`_Api`) and read the same answers; only the transport
differs. Two timeouts are kept apart and named: ``request_timeout``, the longest a request that
does not stream may take to be answered, and ``stream_idle_timeout``, the longest a streamed run
may go without an event (a long run that keeps streaming is never cut by the first).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Sequence

import httpx

from ._errors import CorralError, RequestTimeout, StreamTimeout, error_for
from ._models import HashlineView, RunEvent, RunResult, Validation

#: How long a request that does not stream may take by default: a run's whole wait and wall.
DEFAULT_REQUEST_TIMEOUT = 300.0
#: How long a streamed run may go without an event by default.
DEFAULT_STREAM_IDLE_TIMEOUT = 120.0
#: How many times a broken stream is resumed (``Last-Event-ID``) before it is given up.
DEFAULT_RESUME_ATTEMPTS = 3


class _Api:
    """The requests, by route: each returns ``(method, path, json body, query)``."""

    def __init__(self, actor: str, conversation: str, member: str) -> None:
        self.identity = {"actor": actor, "conversation": conversation, "member": member}

    def run_code(self, code: str, language: str, **options: Any) -> dict[str, Any]:
        body: dict[str, Any] = {**self.identity, "language": language, "code": code}
        body.update({k: v for k, v in options.items() if v is not None})
        return body

    def workspace_query(self, path: str, **extra: Any) -> dict[str, Any]:
        query = {"actor": self.identity["actor"], "conversation": self.identity["conversation"], "path": path}
        query.update({k: v for k, v in extra.items() if v is not None})
        return query

    def scoped(self, **extra: Any) -> dict[str, Any]:
        body = {"actor": self.identity["actor"], "conversation": self.identity["conversation"]}
        body.update({k: v for k, v in extra.items() if v is not None})
        return body


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": {"code": f"http_{response.status_code}", "message": response.text[:500]}}


def _raise_for(response: httpx.Response, body: Any) -> None:
    if response.status_code >= 400:
        raise error_for(response.status_code, body, response.headers.get("retry-after"))


class _EventParser:
    """Server-sent events, line by line: :meth:`feed` returns the events a line completes."""

    def __init__(self) -> None:
        self.name: str = "message"
        self.data: list[str] = []
        self.id: Optional[str] = None

    def feed(self, line: str) -> list[tuple[Optional[str], str, str]]:
        if line == "":
            return self.end()
        if line.startswith("event:"):
            self.name = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            self.id = line[3:].strip()
        return []

    def end(self) -> list[tuple[Optional[str], str, str]]:
        done = [(self.id, self.name, "\n".join(self.data))] if self.data else []
        self.name, self.data, self.id = "message", [], None
        return done


def _events(lines: Iterator[str]) -> Iterator[tuple[Optional[str], str, str]]:
    """Server-sent events from ``lines``: ``(id, name, data)`` for each."""
    parser = _EventParser()
    for line in lines:
        yield from parser.feed(line)
    yield from parser.end()


def _reraise_timeout(broken: Exception, idle: float) -> None:
    if isinstance(broken, httpx.TimeoutException):
        raise StreamTimeout("stream_idle_timeout", f"no event within {idle} s", 0) from broken
    raise StreamTimeout("stream_broken", f"the stream broke and could not be resumed: {broken}", 0) from broken


def _tell_output(event: RunEvent, on_stdout: Optional[Callable[[str], None]],
                 on_stderr: Optional[Callable[[str], None]]) -> None:
    if event.name != "run.output":
        return
    callback = on_stdout if event.data.get("stream") == "stdout" else on_stderr
    if callback is not None:
        callback(event.data.get("text", ""))


def _result_of(event: RunEvent) -> RunResult:
    """The run's answer carried by its ``run.result`` event (a refusal raises, as unstreamed)."""
    status = int(event.data.get("status", 0))
    body = event.data.get("body") or {}
    if status >= 400:
        retry = body.get("error", {}).get("retry_after_seconds") if isinstance(body, dict) else None
        raise error_for(status, body, None if retry is None else str(retry))
    return RunResult.of(body)


class Client:
    """A synchronous client. ``actor``, ``conversation`` and ``member`` are the identity every
    call acts for (a workspace is the actor's and the conversation's); ``admin_token`` is needed
    only for the egress policy.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        actor: str,
        conversation: str,
        member: Optional[str] = None,
        admin_token: Optional[str] = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
        resume_attempts: int = DEFAULT_RESUME_ATTEMPTS,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._api = _Api(actor, conversation, member or actor)
        self.request_timeout = request_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.resume_attempts = resume_attempts
        self._admin_token = admin_token
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=request_timeout,
            transport=transport,
        )

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, *, body: Any = None, params: Any = None,
                 headers: Optional[dict[str, str]] = None) -> Any:
        try:
            response = self._http.request(method, path, json=body, params=params, headers=headers)
        except httpx.TimeoutException as e:
            raise RequestTimeout("request_timeout", f"no answer within {self.request_timeout} s", 0) from e
        answer = _json(response)
        _raise_for(response, answer)
        return answer

    # Runs -------------------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        packages: Optional[Sequence[str]] = None,
        kernel: Optional[str] = None,
        declared_outputs: Optional[Sequence[str]] = None,
        wait_seconds: Optional[int] = None,
        on_event: Optional[Callable[[RunEvent], None]] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> RunResult:
        """Runs ``code``. A run that did not succeed is a result (``outcome``, ``error``); a
        refusal raises its typed :class:`CorralError`. With ``on_event``, ``on_stdout`` or
        ``on_stderr`` the run is streamed: each event, and each chunk of the code's output, is
        given to them as it arrives, and a dropped connection is resumed where it broke."""
        body = self._api.run_code(code, language, packages=packages, kernel=kernel,
                                  declared_outputs=declared_outputs, wait_seconds=wait_seconds)
        if on_event is None and on_stdout is None and on_stderr is None:
            return RunResult.of(self._request("POST", "/v1/run_code", body=body))
        result: Optional[RunResult] = None
        for event in self._stream(body):
            if on_event is not None:
                on_event(event)
            _tell_output(event, on_stdout, on_stderr)
            if event.name == "run.result":
                result = _result_of(event)
        if result is None:
            raise StreamTimeout("stream_ended", "the stream ended before the run's result", 0)
        return result

    def stream_code(self, code: str, language: str = "python", **options: Any) -> Iterator[RunEvent]:
        """The run's events as they arrive; the last is ``run.result``. A dropped connection is
        resumed (up to ``resume_attempts`` times) from the last event received."""
        return self._stream(self._api.run_code(code, language, **options))

    def resume(self, run_id: str, last_event_id: Optional[str] = None) -> Iterator[RunEvent]:
        """A streamed run's events after ``last_event_id`` (all of them without one), from this
        client's API replica, whichever replica ran it: the rest of a stream another connection
        lost, to ``run.result``, nothing twice."""
        return self._resumed(run_id, last_event_id)

    def _stream(self, body: dict[str, Any]) -> Iterator[RunEvent]:
        last: Optional[RunEvent] = None
        run_id: Optional[str] = None
        try:
            for event in self._events("POST", "/v1/run_code", json_body=body):
                last = event
                run_id = run_id or event.data.get("run_id") or (event.data.get("body") or {}).get("run_id")
                yield event
            if last is not None and last.name == "run.result":
                return
        except httpx.TransportError as broken:
            if run_id is None or last is None or isinstance(broken, httpx.TimeoutException):
                _reraise_timeout(broken, self.stream_idle_timeout)
        if run_id is None or last is None:
            return
        yield from self._resumed(run_id, last.id)

    def _resumed(self, run_id: str, last_event_id: Optional[str]) -> Iterator[RunEvent]:
        attempts = 0
        while True:
            headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
            try:
                for event in self._events("GET", f"/v1/runs/{run_id}/events",
                                          params=self._api.scoped(), headers=headers):
                    last_event_id = event.id or last_event_id
                    yield event
                    if event.name == "run.result":
                        return
                return
            except httpx.TransportError as broken:
                attempts += 1
                if attempts > self.resume_attempts or isinstance(broken, httpx.TimeoutException):
                    _reraise_timeout(broken, self.stream_idle_timeout)

    def _events(self, method: str, path: str, *, json_body: Any = None, params: Any = None,
                headers: Optional[dict[str, str]] = None) -> Iterator[RunEvent]:
        timeout = httpx.Timeout(self.request_timeout, read=self.stream_idle_timeout)
        with self._http.stream(method, path, json=json_body, params=params, timeout=timeout,
                               headers={"Accept": "text/event-stream", **(headers or {})}) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response, _json(response))
            for event_id, name, data in _events(response.iter_lines()):
                yield RunEvent(name=name, data=json.loads(data), received_at=time.monotonic(), id=event_id)

    # Workspaces -------------------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        """A file of the workspace, by relative path."""
        response = self._http.get("/v1/read_workspace", params=self._api.workspace_query(path))
        if response.status_code >= 400:
            _raise_for(response, _json(response))
        return response.content

    def read_hashline(self, path: str, start: Optional[int] = None, count: Optional[int] = None) -> HashlineView:
        """A text file of the workspace with its Hashline anchors (WS-3)."""
        query = self._api.workspace_query(path, view="hashline", start=start, count=count)
        return HashlineView.of(self._request("GET", "/v1/read_workspace", params=query))

    def edit_file(self, path: str, edits: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Applies Hashline edits (``{op, tag, line, end_line?, text?}``) to a workspace file."""
        return self._request("POST", "/v1/edit_workspace", body=self._api.scoped(path=path, edits=list(edits)))

    def list_files(self) -> dict[str, Any]:
        """The stored workspace: ``{generation, files: [{path, kind, bytes}], bytes_total,
        bytes_max}`` (generation 0 and no files before any save)."""
        return self._request("GET", "/v1/list_workspace", params=self._api.scoped())

    def write_file(self, path: str, content: str | bytes) -> dict[str, Any]:
        """Creates a file (text, or bytes sent in base64) by the rules a run's save follows:
        never replaces (``workspace_path_exists``), all or nothing. A text file's answer carries
        its Hashline view (``hashline``), so :meth:`edit_file` can anchor to it at once."""
        field = {"text": content} if isinstance(content, str) else {"base64": base64.b64encode(content).decode()}
        return self._request("POST", "/v1/write_workspace", body=self._api.scoped(path=path, **field))

    # Packages ---------------------------------------------------------------------------------

    def validate_package(self, files: dict[str, str | bytes], manifest: dict[str, Any],
                         deadline_seconds: Optional[int] = None) -> Validation:
        """Validates an authored Pi package (PI-1): its files by path (text, or bytes sent in
        base64) and the reviewed manifest. A package not admitted raises
        :class:`PackageRejected` with its code, step and drift."""
        return Validation.of(self._request("POST", "/v1/validate_package",
                                           body=_validation(self._api, files, manifest, deadline_seconds)))

    # Browser sessions -------------------------------------------------------------------------

    def open_browser(self, url: Optional[str] = None, wait_seconds: Optional[int] = None) -> "BrowserSession":
        """Opens a browser session; use it as a context manager so that it is always closed."""
        body = {**self._api.identity, **({"url": url} if url else {}),
                **({"wait_seconds": wait_seconds} if wait_seconds else {})}
        return BrowserSession(self, self._request("POST", "/v1/browser_sessions", body=body))

    # Administration ---------------------------------------------------------------------------

    def egress_policy(self) -> dict[str, Any]:
        """The deployment's egress policy (the admin credential)."""
        return self._request("GET", "/v1/admin/egress_policy", headers=self._admin())

    def set_egress_policy(self, policy: dict[str, Any]) -> dict[str, Any]:
        """Replaces the egress policy (the admin credential); it applies to the next run."""
        return self._request("PUT", "/v1/admin/egress_policy", body=policy, headers=self._admin())

    def _admin(self) -> dict[str, str]:
        if not self._admin_token:
            raise CorralError("admin_token_missing", "the client was given no admin_token", 0)
        return {"Authorization": f"Bearer {self._admin_token}"}


class BrowserSession:
    """An open browser session: :meth:`act` drives it, :meth:`viewer` mints a member's viewer
    ticket, :meth:`close` (or leaving the ``with`` block) closes it and returns its worker."""

    def __init__(self, client: Client, opened: dict[str, Any]) -> None:
        self._client = client
        self.opened = opened
        self.id = str(opened.get("session", ""))
        self.closed: Optional[dict[str, Any]] = None

    def __enter__(self) -> "BrowserSession":
        return self

    def __exit__(self, *_: Any) -> None:
        if self.closed is None:
            self.close()

    def act(self, action: str, **arguments: Any) -> dict[str, Any]:
        """One action (``navigate``, ``click``, ``type``, ``press``, ``scroll``, ``text``,
        ``accessibility``, ``evaluate``, ``screenshot``, ``wait``) with its arguments."""
        body = self._client._api.scoped(action={"action": action, **arguments})
        return self._client._request("POST", f"/v1/browser_sessions/{self.id}/actions", body=body)

    def viewer(self, member: Optional[str] = None) -> dict[str, Any]:
        """A member's ticket to watch (``ticket``, ``viewport``, ``signal``, ``expires_at_ms``)."""
        body = self._client._api.scoped(member=member or self._client._api.identity["member"])
        return self._client._request("POST", f"/v1/browser_sessions/{self.id}/viewers", body=body)

    def close(self) -> dict[str, Any]:
        self.closed = self._client._request("POST", f"/v1/browser_sessions/{self.id}/close",
                                            body=self._client._api.scoped())
        return self.closed


def _validation(api: _Api, files: dict[str, str | bytes], manifest: dict[str, Any],
                deadline_seconds: Optional[int]) -> dict[str, Any]:
    import base64

    listed = [
        {"path": path, "text": content} if isinstance(content, str)
        else {"path": path, "base64": base64.b64encode(content).decode("ascii")}
        for path, content in files.items()
    ]
    body: dict[str, Any] = {**api.identity, "files": listed, "manifest": manifest}
    if deadline_seconds is not None:
        body["deadline_seconds"] = deadline_seconds
    return body


class AsyncClient:
    """The asynchronous client: the same calls as :class:`Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        actor: str,
        conversation: str,
        member: Optional[str] = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._api = _Api(actor, conversation, member or actor)
        self.request_timeout = request_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=request_timeout,
            transport=transport,
        )

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, body: Any = None, params: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, json=body, params=params)
        except httpx.TimeoutException as e:
            raise RequestTimeout("request_timeout", f"no answer within {self.request_timeout} s", 0) from e
        answer = _json(response)
        _raise_for(response, answer)
        return answer

    async def run_code(self, code: str, language: str = "python", **options: Any) -> RunResult:
        """See :meth:`Client.run_code` (without ``on_event``; use :meth:`stream_code`)."""
        body = self._api.run_code(code, language, **options)
        return RunResult.of(await self._request("POST", "/v1/run_code", body=body))

    async def stream_code(self, code: str, language: str = "python", **options: Any) -> AsyncIterator[RunEvent]:
        """The run's events as they arrive; the last is ``run.result``."""
        body = self._api.run_code(code, language, **options)
        async for event in self._events("POST", "/v1/run_code", json_body=body):
            yield event

    async def resume(self, run_id: str, last_event_id: Optional[str] = None) -> AsyncIterator[RunEvent]:
        """See :meth:`Client.resume`."""
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        async for event in self._events("GET", f"/v1/runs/{run_id}/events", params=self._api.scoped(),
                                        headers=headers):
            yield event

    async def _events(self, method: str, path: str, *, json_body: Any = None, params: Any = None,
                      headers: Optional[dict[str, str]] = None) -> AsyncIterator[RunEvent]:
        timeout = httpx.Timeout(self.request_timeout, read=self.stream_idle_timeout)
        try:
            async with self._http.stream(method, path, json=json_body, params=params, timeout=timeout,
                                         headers={"Accept": "text/event-stream", **(headers or {})}) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response, _json(response))
                parser = _EventParser()
                async for line in response.aiter_lines():
                    for event_id, name, data in parser.feed(line):
                        yield RunEvent(name=name, data=json.loads(data), received_at=time.monotonic(), id=event_id)
                for event_id, name, data in parser.end():
                    yield RunEvent(name=name, data=json.loads(data), received_at=time.monotonic(), id=event_id)
        except httpx.ReadTimeout as e:
            raise StreamTimeout("stream_idle_timeout", f"no event within {self.stream_idle_timeout} s", 0) from e

    async def read_file(self, path: str) -> bytes:
        response = await self._http.get("/v1/read_workspace", params=self._api.workspace_query(path))
        if response.status_code >= 400:
            _raise_for(response, _json(response))
        return response.content

    async def validate_package(self, files: dict[str, str | bytes], manifest: dict[str, Any],
                               deadline_seconds: Optional[int] = None) -> Validation:
        return Validation.of(await self._request("POST", "/v1/validate_package",
                                                 body=_validation(self._api, files, manifest, deadline_seconds)))


def result_of_events(events: Sequence[RunEvent]) -> RunResult:
    """The result carried by a finished stream's events."""
    for event in events:
        if event.name == "run.result":
            return _result_of(event)
    raise CorralError("stream_ended", "no run.result among the events", 0)
