"""The worker registry: every worker the gateway knows, static or added at run time, indexed by
id and URL. It does no I/O and picks nothing; the router asks it which workers could serve a
model and in which role."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from smg.routing.workers import Role, Worker


class DuplicateWorker(ValueError):
    """A worker with this URL is registered already (`worker_id`: the one, when known)."""

    def __init__(self, message: str, worker_id: str | None = None) -> None:
        super().__init__(message)
        self.worker_id = worker_id


class WorkerRegistry:
    def __init__(self) -> None:
        self._by_id: dict[str, Worker] = {}
        self._by_url: dict[str, Worker] = {}
        self._listeners: list[Callable[[Worker], None]] = []

    def on_remove(self, listener: Callable[[Worker], None]) -> None:
        """Call `listener` with each worker as it leaves (policies forget their state of it)."""
        self._listeners.append(listener)

    def add(self, worker: Worker) -> Worker:
        if worker.key in self._by_url:
            raise DuplicateWorker(f"a worker with URL {worker.key} is registered already")
        self._by_id[worker.id] = worker
        self._by_url[worker.key] = worker
        return worker

    def rekey(self, worker: Worker, old_key: str) -> None:
        """The worker's key changed (it became rank 0 of a data-parallel engine)."""
        if self._by_url.get(old_key) is worker:
            del self._by_url[old_key]
        self._by_url[worker.key] = worker

    def remove(self, worker_id: str) -> Worker | None:
        """Take the worker out: it gets no new request; the ones it has in flight finish."""
        worker = self._by_id.pop(worker_id, None)
        if worker is None:
            return None
        self._by_url.pop(worker.key, None)
        worker.removed = True
        for listener in self._listeners:
            listener(worker)
        return worker

    def get(self, worker_id: str) -> Worker | None:
        return self._by_id.get(worker_id)

    def by_url(self, url: str) -> Worker | None:
        """The worker at `url` (`url@rank` names one rank; the bare URL finds rank 0)."""
        return self._by_url.get(url) or self._by_url.get(f"{url}@0")

    def all(self) -> list[Worker]:
        return list(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def serving(self, model: str, workers: Iterable[Worker] | None = None) -> list[Worker]:
        """The workers that serve `model` (or any model), available or not."""
        return [w for w in (self._by_id.values() if workers is None else workers) if w.serves(model)]

    def with_role(self, role: Role) -> list[Worker]:
        return [w for w in self._by_id.values() if w.role == role]

    def models(self) -> list[str]:
        """Every model some worker serves, sorted."""
        return sorted({m for w in self._by_id.values() for m in w.models})
