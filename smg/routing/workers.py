"""The worker registry: every worker the gateway knows, what it serves, and whether it is up.

Selection is round-robin over the healthy workers of a model. The registry does no I/O;
backends discover models and health and report them here.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from smg.protocol.errors import ApiError

log = logging.getLogger("smg.workers")


def worker_kind(url: str) -> str:
    """The worker kind a URL's scheme names: `http`, `grpc` or `zmq`."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        return "http"
    if scheme == "grpc":
        return "grpc"
    if scheme == "ipc":
        return "zmq"
    raise ValueError(f"unsupported worker URL scheme {scheme!r} in {url!r} (use http://, https://, grpc:// or ipc://)")


@dataclass
class Worker:
    url: str
    kind: str
    models: set[str] = field(default_factory=set)
    context_windows: dict[str, int] = field(default_factory=dict)
    healthy: bool = False
    discovered: bool = False
    wildcard: bool = False  # serves any model (external APIs)
    last_error: str | None = None
    consecutive_failures: int = 0

    # A worker that drops this many requests in a row is taken out until a health check passes.
    FAILURE_THRESHOLD = 3

    def record_failure(self, error: str, *, refused: bool = False) -> None:
        """A transport failure. A refused connection means nothing listens: out at once."""
        self.last_error = error
        self.consecutive_failures += 1
        if refused or self.consecutive_failures >= self.FAILURE_THRESHOLD:
            self.healthy = False

    def record_success(self) -> None:
        self.consecutive_failures = 0

    def record_health(self, ok: bool, error: str | None = None) -> bool:
        """A health check's outcome; a change of state is logged once. Returns `ok`."""
        self.last_error = None if ok else error
        if ok != self.healthy:
            log.warning("worker %s is now %s", self.url, "healthy" if ok else f"unhealthy ({error})")
        self.healthy = ok
        if ok:
            self.consecutive_failures = 0
        return ok

    def serves(self, model: str) -> bool:
        return self.wildcard or model in self.models


class WorkerRegistry:
    """All workers, with round-robin selection per model."""

    def __init__(self) -> None:
        self._workers: dict[str, Worker] = {}
        self._cursors: dict[str, itertools.count[int]] = {}

    def add(self, worker: Worker) -> Worker:
        self._workers[worker.url] = worker
        return worker

    def remove(self, url: str) -> None:
        self._workers.pop(url, None)

    def get(self, url: str) -> Worker | None:
        return self._workers.get(url)

    def all(self) -> list[Worker]:
        return list(self._workers.values())

    def models(self) -> list[str]:
        """Every model some worker serves, sorted."""
        return sorted({m for w in self._workers.values() for m in w.models})

    def candidates(self, model: str) -> list[Worker]:
        return [w for w in self._workers.values() if w.serves(model)]

    def select(self, model: str, exclude: frozenset[str] = frozenset()) -> Worker:
        """The next healthy worker for `model`.

        404 `model_not_found` when no worker serves the model (unless a worker whose models
        are still unknown might: then 503, since the answer may change once it is reachable);
        503 `no_available_workers` when the model's workers are all down.
        """
        workers = self.candidates(model)
        if not workers:
            if any(not w.discovered for w in self._workers.values()):
                raise ApiError(
                    503,
                    f"No reachable worker for model '{model}': some workers have not answered yet",
                    code="no_available_workers",
                )
            raise ApiError(404, f"No worker available for model '{model}'", code="model_not_found")
        healthy = [w for w in workers if w.healthy]
        # A retry prefers another worker, but falls back to the same one when it is the only one.
        preferred = [w for w in healthy if w.url not in exclude] or healthy
        if not preferred:
            raise ApiError(
                503,
                "All workers are unavailable (circuit breaker open or unhealthy)",
                code="no_available_workers",
            )
        cursor = self._cursors.setdefault(model, itertools.count())
        return preferred[next(cursor) % len(preferred)]
