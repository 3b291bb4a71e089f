"""A loopback HTTP origin for the tests of outbound fetches: it counts every connection it
accepts and every request (so a test proves a refusal happened before any connect, or that
nothing was fetched) and serves scripted answers.

Paths:

- ``/file/NAME``: a body registered with ``origin.serve(NAME, data, media_type)``, else 404;
- ``/redirect?to=URL``: ``302`` to URL;
- ``/status/CODE``: that status, with the reason phrase ``Secret Reason`` and the body
  ``SECRET-BODY`` (what an error message must never repeat);
- ``/bytes/N`` (``?chunked=1``: without a Content-Length): N bytes;
- ``/trickle``: a 200 head announcing 100,000 bytes, then one byte every 50 ms;
- ``/silent``: reads the request and never answers.

Runs in a thread of the test process (`with Origin() as origin:`); ``host`` may be any loopback
address (``127.0.0.2`` is a second origin the policy treats apart from ``127.0.0.1``). Closing
it ends the trickling and silent handlers.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

SECRET_REASON = "Secret Reason"
SECRET_BODY = b"SECRET-BODY"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str) -> None:
        super().__init__((host, 0), _Handler)
        self.connections = 0
        self.requests = 0
        self.files: dict[str, tuple[bytes, str]] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a client that hangs up mid-answer (a refused body) is expected here

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self.lock:
            self.connections += 1
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        return None

    def _answer(
        self, status: int, body: bytes, headers: dict[str, str] | None = None, reason: str | None = None
    ) -> None:
        self.send_response(status, reason)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        head, _, rest = parts.path.lstrip("/").partition("/")
        if head == "file" and rest in self.server.files:
            data, media_type = self.server.files[rest]
            self._answer(200, data, {"Content-Type": media_type})
        elif head == "redirect":
            self._answer(302, b"", {"Location": query["to"]})
        elif head == "status":
            self._answer(int(rest), SECRET_BODY, {"Content-Type": "text/plain"}, reason=SECRET_REASON)
        elif head == "bytes":
            self._bytes(int(rest), chunked="chunked" in query)
        elif head == "trickle":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while not self.server.stopping.wait(0.05):
                self.wfile.write(b"x")
                self.wfile.flush()
        elif head == "silent":
            self.server.stopping.wait()
        else:
            self._answer(404, b"not found")

    def _bytes(self, n: int, *, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if not chunked:
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(b"x" * n)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        while sent < n and not self.server.stopping.is_set():
            size = min(16384, n - sent)
            self.wfile.write(b"%x\r\n%s\r\n" % (size, b"x" * size))
            sent += size
        self.wfile.write(b"0\r\n\r\n")


class Origin:
    """The origin: ``url``, ``connections`` and ``requests`` (so far), ``serve`` and ``close``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = _Server(host)
        self.host = host
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=f"origin-{host}", daemon=True
        )
        self._thread.start()

    @property
    def connections(self) -> int:
        with self._server.lock:
            return self._server.connections

    @property
    def requests(self) -> int:
        """Requests answered so far (a kept-alive connection carries several)."""
        with self._server.lock:
            return self._server.requests

    def serve(self, name: str, data: bytes, media_type: str) -> str:
        """Serve `data` at ``/file/NAME``; returns its URL."""
        self._server.files[name] = (data, media_type)
        return f"{self.url}/file/{name}"

    def close(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Origin:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
