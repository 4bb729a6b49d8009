"""Corral's Python client: run code in a leased sandbox worker, stream its events, keep a
persistent kernel across calls, read and edit the workspace with Hashline anchors, validate Pi
packages, drive browser sessions, and manage the egress policy. Every refusal is a typed
:class:`CorralError` carrying the API's stable code and ``Retry-After``.

    from corral_client import Client
    with Client("http://127.0.0.1:8000", token, actor="a", conversation="c") as corral:
        print(corral.run_code("print(6 * 7)").stdout.text)
"""

from ._client import (
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STREAM_IDLE_TIMEOUT,
    AsyncClient,
    BrowserSession,
    Client,
    result_of_events,
)
from ._errors import (
    Busy,
    CapacityUnavailable,
    CorralError,
    InvalidRequest,
    PackageRejected,
    RequestTimeout,
    StreamTimeout,
    Unauthorized,
    WorkerLost,
)
from ._models import HashlineView, Output, RunError, RunEvent, RunResult, Validation

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_STREAM_IDLE_TIMEOUT",
    "AsyncClient",
    "BrowserSession",
    "Busy",
    "CapacityUnavailable",
    "Client",
    "CorralError",
    "HashlineView",
    "InvalidRequest",
    "Output",
    "PackageRejected",
    "RequestTimeout",
    "RunError",
    "RunEvent",
    "RunResult",
    "StreamTimeout",
    "Unauthorized",
    "Validation",
    "WorkerLost",
    "result_of_events",
]
