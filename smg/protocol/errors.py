"""Errors as values: a status, an error type, a message and an optional machine code.

Every refusal in the gateway is an `ApiError`, raised at one place and rendered at one place
(the server's envelope). This module owns the Messages error envelope shape and the
status → `error.type` vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type_for_status(status: int) -> str:
    """The Anthropic `error.type` for an HTTP status (402 stays `invalid_request_error`)."""
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    if 400 <= status < 500:
        return "invalid_request_error"
    return "api_error"


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


@dataclass
class ApiError(Exception):
    """A refusal or failure that leaves the gateway as an Anthropic error envelope.

    `code` is the machine-readable code. `minted` says the gateway itself produced the error,
    which is when the `X-SMG-Error-Code` header is set; validation refusals and relayed
    upstream errors are not minted. `error_type` overrides the status-derived type (an
    upstream body already in the Anthropic shape keeps its own).
    """

    status: int
    message: str
    code: str | None = None
    minted: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None
    detail: str | None = None  # for the journal's operators only (e.g. the engine's address), never the client

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    @property
    def type(self) -> str:
        return self.error_type or error_type_for_status(self.status)

    def response_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.minted and self.code:
            out["X-SMG-Error-Code"] = self.code
        return out


def invalid_request(message: str, code: str | None = None) -> ApiError:
    """A 400 body refusal (parse or validation): no `X-SMG-Error-Code` header."""
    return ApiError(400, message, code=code, minted=False)


def envelope(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    """The Messages error envelope: exactly `type`, `error{type,message}` and `request_id`."""
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


def error_from_upstream(status: int, body: bytes, headers: dict[str, str] | None = None) -> ApiError:
    """Re-shape an upstream error response (HTTP worker, Anthropic API) into an `ApiError`.

    An Anthropic-shaped body keeps its `error.type` and `error.message`; any other JSON body
    gives up its `error.message`/`error`/`message`; plain text is carried over trimmed; an empty
    or unreadable body becomes the status reason phrase. The status is kept.
    """
    import orjson

    kept = {k: v for k, v in (headers or {}).items() if k.lower() in ("retry-after", "www-authenticate")}
    message: str | None = None
    error_type: str | None = None
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
        text = body.decode("utf-8", errors="replace").strip() if len(body) <= 1 << 20 else ""
        message = text or None
    if isinstance(data, dict):
        err = data.get("error")
        if (
            data.get("type") == "error"
            and isinstance(err, dict)
            and isinstance(err.get("type"), str)
            and isinstance(err.get("message"), str)
        ):
            error_type, message = err["type"], err["message"]
        elif isinstance(err, dict):
            inner = err.get("message")
            if isinstance(inner, str):
                message = inner
            elif inner is not None:
                message = orjson.dumps(inner).decode()
            else:
                message = orjson.dumps(err).decode()
        elif isinstance(err, str):
            message = err
        elif isinstance(data.get("message"), str):
            message = data["message"]
    elif data is not None and message is None:
        message = orjson.dumps(data).decode()
    return ApiError(
        status,
        message or reason_phrase(status),
        code=None,
        minted=False,
        headers=kept,
        error_type=error_type,
    )


def describe_exception(exc: BaseException) -> str:
    """How a failure reads in an error message: `ConnectError: [Errno 111] …`. Exception
    groups (anyio's, from the MCP SDK) are unwrapped to their first cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# A URL, a host:port, a socket address tuple or a bare IP: what names a worker inside an error text.
_ADDRESS = re.compile(
    r"[a-z][a-z0-9+.-]*://\S+"
    r"|\('[^']*', \d+(?:, \d+)*\)"
    r"|(?:\[[0-9a-f:.]+\]|\b[\w.-]+):\d{1,5}\b"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b",
    re.IGNORECASE,
)


def describe_upstream_failure(exc: BaseException) -> str:
    """`describe_exception` as a client may read it: the addresses of internal workers (URLs,
    host:port, socket addresses) are replaced by `<worker>`. The worker that failed is in the
    journal (the attempt's `routed` event) and in the gateway's log, not in the envelope."""
    return _ADDRESS.sub("<worker>", describe_exception(exc))
