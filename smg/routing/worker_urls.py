"""Which worker URLs the gateway registers, from `--worker-urls` or the worker API, refused
before anything is sent to them.

The gateway builds every request URL from a worker's by appending a path (`/v1/messages`,
`/v1/models`, `/health`, …), so what else a URL carries would go where nobody meant it to:
a query or a fragment would be sent with every probe, and userinfo (`user:pw@`) would be sent
as credentials nobody asked for. Per kind:

- `http://`, `https://` workers (engines serving the Messages API): an origin, `scheme://host[:port]`.
  The engines serve at their root; a path would be prefixed to every probe and request.
- an external provider's API (`provider: anthropic`, `--backend anthropic`): an origin with an
  optional base path (a proxy in front of the API, e.g. `https://proxy.example/anthropic`, as the
  Anthropic SDK's `base_url` allows); still no query, fragment or userinfo.
- `grpc://host:port`: an address, nothing else.
- `ipc:///PATH`: an absolute path below an allowed directory (`--ipc-dir`), without `?` or `#`.

A URL that leads to the gateway itself is refused too (`smg.routing.self_address`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from smg.backends.zmq.addresses import DEFAULT_IPC_DIRS, socket_path_refusal
from smg.flags import option


@dataclass(frozen=True)
class WorkerUrlConfig:
    """Where `ipc://` workers' sockets may be."""

    ipc_dirs: tuple[str, ...] = field(
        default=DEFAULT_IPC_DIRS,
        metadata=option(
            "--ipc-dir",
            "Directories ipc:// worker sockets may be in (repeatable; default: the system temp dir). Missing "
            "directories are created only below them.",
        ),
    )


class WorkerRefused(ValueError):
    """A worker that cannot be registered, said plainly (a 400 on the worker API), with the
    worker API's machine code."""

    def __init__(self, message: str, code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.code = code


def _invalid(url: str, why: str) -> WorkerRefused:
    return WorkerRefused(f"Invalid worker URL {url!r}: {why}", "INVALID_WORKER_URL")


def check_worker_url(url: str, *, provider: str | None = None, config: WorkerUrlConfig | None = None) -> None:
    """Raises `WorkerRefused` for a URL its kind does not take (`provider`: an external
    provider's API). The scheme itself is checked where the kind is chosen (`worker_kind`)."""
    config = config or WorkerUrlConfig()
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise _invalid(url, "it holds whitespace or control characters")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme == "ipc":
        if "?" in rest or "#" in rest:
            raise _invalid(url, "an ipc:// URL is a socket path, without a query or a fragment")
        refusal = socket_path_refusal(rest, config.ipc_dirs)
        if refusal is not None:
            raise WorkerRefused(refusal, "IPC_PATH_NOT_ALLOWED")
        return
    if scheme not in ("http", "https", "grpc"):
        return
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise _invalid(url, "credentials do not go in a worker URL (give the worker's key as `api_key`)")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise _invalid(url, "a worker URL carries no query or fragment")
    if not parts.hostname:
        raise _invalid(url, "it names no host")
    try:
        parts.port  # noqa: B018 - parsing is the check
    except ValueError:
        raise _invalid(url, "its port is not a number between 0 and 65535") from None
    if parts.path not in ("", "/") and (provider is None or scheme == "grpc"):
        kind = "a gRPC worker's is host:port" if scheme == "grpc" else "an HTTP worker's is its origin, scheme://host:port"
        raise _invalid(url, f"it has a path ({parts.path}); {kind}, the gateway adds the paths")
