"""Every refusal of Corral's API as a typed exception carrying its stable code and Retry-After."""

from __future__ import annotations

from typing import Any, Optional


class CorralError(Exception):
    """A refusal: ``code`` is the API's stable code, ``status`` the HTTP status, ``retry_after``
    the seconds the API asked the caller to wait (``Retry-After``), ``body`` the whole answer."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        retry_after: Optional[float] = None,
        body: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.body = body or {}

    @property
    def error(self) -> dict[str, Any]:
        """The answer's ``error`` object (its code, message and whatever the code adds)."""
        error = self.body.get("error")
        return error if isinstance(error, dict) else {}


class Unauthorized(CorralError):
    """No credential, or the wrong one (401)."""


class InvalidRequest(CorralError):
    """The request was refused before anything ran: malformed, an invalid identity, a bound
    above the deployment's, a choice the caller may not make (400, 413, 422)."""


class Busy(CorralError):
    """Another operation holds what the request needs: a kernel's cell, a session (409)."""


class CapacityUnavailable(CorralError):
    """No worker within the wait, a full queue, or coordination unavailable (429, 503): come back
    after ``retry_after`` seconds."""


class WorkerLost(CorralError):
    """The worker stopped answering; nothing was kept (502)."""


class PackageRejected(CorralError):
    """A package validation failed closed (PI-1): ``code`` is its ``package_*`` code, ``step`` the
    step that failed, ``drift`` what differed from the reviewed manifest, ``tail`` a bounded tail
    of the failing step's output."""

    @property
    def step(self) -> Optional[str]:
        return self.error.get("step")

    @property
    def drift(self) -> Optional[dict[str, list[str]]]:
        return self.error.get("drift")

    @property
    def tail(self) -> Optional[str]:
        return self.error.get("tail")


class StreamTimeout(CorralError):
    """No event arrived on a run's stream within the client's ``stream_idle_timeout``: the run
    goes on at the API; only this client stopped waiting."""


class RequestTimeout(CorralError):
    """A request that does not stream got no answer within the client's ``request_timeout``."""


def error_for(status: int, body: Any, retry_after: Optional[str]) -> CorralError:
    """The typed exception of an answer with ``status`` and ``body``."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = str(error.get("code") or f"http_{status}")
    message = str(error.get("message") or "")
    seconds: Optional[float] = None
    if retry_after is not None:
        try:
            seconds = float(retry_after)
        except ValueError:
            seconds = None
    if seconds is None and isinstance(error.get("retry_after_seconds"), (int, float)):
        seconds = float(error["retry_after_seconds"])
    if code.startswith("package_") or code == "pi_runtime_unavailable":
        kind: type[CorralError] = PackageRejected
    elif status == 401:
        kind = Unauthorized
    elif status == 409:
        kind = Busy
    elif status in (429, 503):
        kind = CapacityUnavailable
    elif status == 502:
        kind = WorkerLost
    else:
        kind = InvalidRequest
    return kind(code, message, status, seconds, body if isinstance(body, dict) else None)
