"""The worker registry shared by the replicas (`--worker-registry redis://…`): the workers
added through `POST /workers` on any replica, with Redis as the source of truth.

Redis holds a hash `smg:workers` (worker id → the worker as it was asked for, an external
worker's `api_key` only sealed under `$SMG_TENANT_SECRET`, `smg.shared.sealed`), a hash
`smg:workers:urls` (URL → id, so a URL is registered once in the fleet), and a version
`smg:workers:version`. Adding and removing are one script each: they write the hashes, bump
the version and publish the change, with its version, on `smg:workers:changes`. Every replica
subscribes, then loads the whole set (and its version, in one transaction) and applies only
the changes past it; it does so again on every reconnect, so a message missed while the
connection was down heals. No replica polls. A replica checks a new worker against its own
registry, has Redis register it, and only then discovers and routes to it: a worker the fleet
refuses (its URL taken, or Redis away) is taken out again and never routed to anywhere.

What stays per replica: the workers of `--worker-urls` (each replica's command line, never
written to Redis; a shared worker whose URL one replica has as a static worker is left out
there), health checks, circuit breakers, load and in-flight counts. With Redis away a replica
keeps routing to the workers it knows; adding and removing answer 503 until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import orjson

from smg.shared.link import RedisLink, SharedStateDown, messages, redis_errors
from smg.shared.sealed import Unsealable, seal, unseal

if TYPE_CHECKING:
    from smg.routing.router import Router, WorkerSpec

log = logging.getLogger("smg.routing.shared")

WORKERS = "smg:workers"
URLS = "smg:workers:urls"
VERSION = "smg:workers:version"
CHANGES = "smg:workers:changes"
_RECONNECT_SECS = 0.5

# KEYS: workers, urls, version, changes. ARGV: id, url, spec (JSON).
# Returns {1, version} (added) or {0, id of the worker that has the URL}. Sent again after a
# lost answer, it finds the worker added already and answers as the first time did.
ADD = """
local taken = redis.call('HGET', KEYS[2], ARGV[2])
if taken == ARGV[1] then return {1, tonumber(redis.call('GET', KEYS[3]) or '0')} end
if taken then return {0, taken} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
local version = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', KEYS[4], cjson.encode({op = 'add', id = ARGV[1], spec = cjson.decode(ARGV[3]),
  version = version}))
return {1, version}
"""

# KEYS: workers, urls, version, changes. ARGV: id. Returns the version, or 0 (not shared).
REMOVE = """
local spec = redis.call('HGET', KEYS[1], ARGV[1])
if not spec then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local url = cjson.decode(spec)['url']
if redis.call('HGET', KEYS[2], url) == ARGV[1] then redis.call('HDEL', KEYS[2], url) end
local version = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', KEYS[4], cjson.encode({op = 'remove', id = ARGV[1], version = version}))
return version
"""


class WorkerUrlTaken(Exception):
    """Another replica registered this URL (`worker_id` is the fleet's worker for it)."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.worker_id = worker_id


_API_KEY = b"worker api_key"


def _spec_json(spec: WorkerSpec) -> str:
    """The worker as the fleet stores it: an `api_key` only sealed. Raises WorkerRefused."""
    from smg.routing.router import WorkerRefused

    values = dataclasses.asdict(spec)
    if spec.api_key:
        try:
            values["api_key_sealed"] = seal(spec.api_key, _API_KEY, spec.url)
        except Unsealable as exc:
            raise WorkerRefused(
                f"the shared worker registry stores a worker's api_key only sealed, and {exc}",
                "WORKER_KEY_NOT_SEALABLE",
            ) from None
    values["api_key"] = None
    return orjson.dumps(values).decode()


def _spec(raw: dict[str, Any]) -> WorkerSpec:
    """Raises WorkerRefused (a sealed key this replica cannot open)."""
    from smg.routing.router import WorkerRefused, WorkerSpec

    fields = {f.name for f in dataclasses.fields(WorkerSpec)}
    values = {k: v for k, v in raw.items() if k in fields}
    values["models"] = tuple(values.get("models") or ())
    if raw.get("api_key_sealed"):
        try:
            values["api_key"] = unseal(str(raw["api_key_sealed"]), _API_KEY, str(raw.get("url") or ""))
        except Unsealable as exc:
            raise WorkerRefused(str(exc)) from None
    return WorkerSpec(**values)


class SharedWorkers:
    """This replica's view of the fleet's workers, kept in step with Redis."""

    def __init__(self, link: RedisLink, router: Router) -> None:
        self.link = link
        self.router = router
        self.version = 0  # the last change applied
        self._added_at: dict[str, int] = {}  # worker id → the version that added it
        self._task: asyncio.Task[None] | None = None

    # changes made here

    async def _run(self, source: str, keys: list[str], args: list[Any]) -> Any:
        return await self.link.run(source, keys, args)

    async def add(self, worker_id: str, spec: WorkerSpec) -> None:
        """Register the worker in the fleet. Raises WorkerUrlTaken, SharedStateDown."""
        spec = dataclasses.replace(spec, url=spec.url.rstrip("/"))  # one URL, however it was written
        added, value = await self._run(ADD, [WORKERS, URLS, VERSION, CHANGES], [worker_id, spec.url, _spec_json(spec)])
        if not added:
            raise WorkerUrlTaken(str(value))
        self._added_at[worker_id] = int(value)

    async def remove(self, worker_id: str) -> None:
        """Take the worker out of the fleet (a no-op for a worker the fleet does not have).
        Raises SharedStateDown."""
        await self._run(REMOVE, [WORKERS, URLS, VERSION, CHANGES], [worker_id])

    # changes made anywhere

    async def start(self) -> None:
        """Load the fleet's workers (and discover them) before serving, then follow changes."""
        pubsub = await self._connect()
        self._task = asyncio.get_running_loop().create_task(self._follow(pubsub), name="smg-worker-registry")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _connect(self) -> Any:
        """Subscribed, then loaded: no change falls between the two. None when Redis is away."""
        client = self.link.pubsub_client()
        pubsub = client.pubsub()  # `messages` reads the PONGs too
        try:
            await pubsub.subscribe(CHANGES)
            async with self.link.client.pipeline(transaction=True) as pipe:
                workers, version = await pipe.hgetall(WORKERS).get(VERSION).execute()
        except redis_errors() as exc:
            self.link.failed(exc)
            await self._drop(pubsub)
            return None
        self.link.answered()
        await self._load({wid: orjson.loads(raw) for wid, raw in workers.items()}, int(version or 0))
        return pubsub

    async def _load(self, workers: dict[str, dict[str, Any]], version: int) -> None:
        known = {w.id: w for w in self.router.registry.all() if w.source == "api"}
        for worker_id, worker in known.items():
            # A worker this replica added after the snapshot was taken is not stale.
            if worker_id not in workers and self._added_at.get(worker_id, 0) <= version:
                self.router.remove_worker(worker.id)
                self._added_at.pop(worker_id, None)
        fresh = [await self._register(wid, raw) for wid, raw in workers.items() if wid not in known]
        self.version = version
        await asyncio.gather(*(self.router.discover_worker(w) for w in fresh if w is not None))
        log.info("worker registry: %d shared worker(s) at version %d", len(workers), version)

    async def _register(self, worker_id: str, raw: dict[str, Any]) -> Any:
        from smg.routing.registry import DuplicateWorker
        from smg.routing.router import WorkerRefused

        try:
            if str(raw.get("url") or "").startswith("ipc://"):
                raise WorkerRefused("an ipc:// worker is a socket on the host of the replica that added it")
            return await self.router.register(_spec(raw), worker_id)
        except (DuplicateWorker, WorkerRefused) as exc:
            log.warning("worker registry: shared worker %s (%s) not served here: %s", worker_id, raw.get("url"), exc)
            return None

    async def _apply(self, change: dict[str, Any]) -> None:
        version = int(change.get("version") or 0)
        if version <= self.version:
            return  # in the snapshot already
        self.version = version
        worker_id = str(change.get("id"))
        if change.get("op") == "add":
            if self.router.registry.get(worker_id) is None:
                worker = await self._register(worker_id, change.get("spec") or {})
                if worker is not None:
                    self.router.spawn_discovery(worker)
        elif change.get("op") == "remove":
            worker = self.router.registry.get(worker_id)
            if worker is not None and worker.source == "api":
                self.router.remove_worker(worker_id)
            self._added_at.pop(worker_id, None)

    async def _follow(self, pubsub: Any) -> None:
        while True:
            if pubsub is None:
                await asyncio.sleep(_RECONNECT_SECS)
                pubsub = await self._connect()
                continue
            try:
                async for message in messages(pubsub):
                    await self._apply(orjson.loads(message["data"]))
            except redis_errors() as exc:
                self.link.failed(exc)
            await self._drop(pubsub)
            pubsub = None

    @staticmethod
    async def _drop(pubsub: Any) -> None:
        with contextlib.suppress(*redis_errors()):
            await pubsub.aclose()
        with contextlib.suppress(*redis_errors()):
            await pubsub.connection_pool.disconnect()


__all__ = ["SharedStateDown", "SharedWorkers", "WorkerUrlTaken"]
