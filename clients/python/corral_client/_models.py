"""The typed answers of Corral's API. Each keeps the whole answer in ``body`` as well."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Output:
    """One bounded output stream of a run."""

    text: str
    truncated: bool = False
    bytes_total: int = 0
    bytes_dropped: int = 0

    @classmethod
    def of(cls, value: Any) -> "Output":
        value = value if isinstance(value, dict) else {}
        return cls(
            text=str(value.get("text", "")),
            truncated=bool(value.get("truncated", False)),
            bytes_total=int(value.get("bytes_total", 0)),
            bytes_dropped=int(value.get("bytes_dropped", 0)),
        )


@dataclass(frozen=True)
class RunError:
    """Why a run did not succeed, in band (the run itself was answered): its stable code, a
    message, and whatever the code adds (``packages``, ``cause``, ``checks``...)."""

    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


#: The fields of a run answer's ``model`` that :class:`RunResult` reads; the tests check each
#: against the API's ``/openapi.json``.
RUN_MODEL_FIELDS = ("exit_code", "stdout", "stderr", "downloads", "diagnostics", "kernel", "results")


@dataclass(frozen=True)
class RunResult:
    """A run's answer. ``outcome`` is ``succeeded``, ``failed`` (nonzero exit), ``bound_exceeded``,
    ``not_run`` or ``error``; ``error`` says why when it is not ``succeeded``."""

    run_id: str
    outcome: str
    exit_code: Optional[int]
    stdout: Output
    stderr: Output
    error: Optional[RunError]
    downloads: list[dict[str, Any]]
    diagnostics: list[str]
    kernel: Optional[dict[str, Any]]
    body: dict[str, Any]
    #: Rich results, as a notebook shows them: the last expression's value and the figures left
    #: open, each ``{"text/plain", "text/html"?, "image/png"? (base64)}``.
    results: list[dict[str, str]] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    @classmethod
    def of(cls, body: dict[str, Any]) -> "RunResult":
        model = body.get("model") if isinstance(body.get("model"), dict) else {}
        error = body.get("error")
        run_error = None
        if isinstance(error, dict):
            run_error = RunError(
                code=str(error.get("code", "")),
                message=str(error.get("message", "")),
                detail={k: v for k, v in error.items() if k not in ("code", "message")},
            )
        return cls(
            run_id=str(body.get("run_id", "")),
            outcome=str(body.get("outcome", "")),
            exit_code=model.get("exit_code"),
            stdout=Output.of(model.get("stdout")),
            stderr=Output.of(model.get("stderr")),
            error=run_error,
            downloads=list(model.get("downloads") or []),
            diagnostics=list(model.get("diagnostics") or []),
            kernel=model.get("kernel"),
            body=body,
            results=list(model.get("results") or []),
        )


@dataclass(frozen=True)
class RunEvent:
    """One event of a streamed run: its name (``run.queued``, ``run.running``, ``run.output``
    with ``{stream, text}``, ``run.bound``, ``run.result``), its id (``<run id>-<n>``, for
    :meth:`Client.resume`), its data, and when this client received it (``time.monotonic()``)."""

    name: str
    data: dict[str, Any]
    received_at: float
    id: Optional[str] = None


@dataclass(frozen=True)
class Validation:
    """An admitted package (PI-1): its profile, the Pi runtime that loaded it, what it registers
    by kind, and the time of each step."""

    validation_id: str
    profile: str
    runtime_version: Optional[str]
    surface: dict[str, list[str]]
    durations: dict[str, int]
    body: dict[str, Any]

    @classmethod
    def of(cls, body: dict[str, Any]) -> "Validation":
        runtime = body.get("runtime") if isinstance(body.get("runtime"), dict) else {}
        return cls(
            validation_id=str(body.get("validation_id", "")),
            profile=str(body.get("profile", "")),
            runtime_version=runtime.get("version"),
            surface=dict(body.get("surface") or {}),
            durations=dict(body.get("durations") or {}),
            body=body,
        )


def _lines(value: Any) -> list[str]:
    """The API gives the shown lines as one text, a line each."""
    if isinstance(value, str):
        return value.splitlines()
    return [str(line) for line in value or []]


@dataclass(frozen=True)
class HashlineView:
    """A file of a workspace with its Hashline anchors (WS-3): ``lines`` as ``LINE:TAG|text``."""

    path: str
    generation: int
    tag: str
    total_lines: int
    first_line: int
    lines: list[str]

    @classmethod
    def of(cls, body: dict[str, Any]) -> "HashlineView":
        return cls(
            path=str(body.get("path", "")),
            generation=int(body.get("generation", 0)),
            tag=str(body.get("tag", "")),
            total_lines=int(body.get("total_lines", 0)),
            first_line=int(body.get("first_line", 1)),
            lines=_lines(body.get("lines")),
        )
