"""Fleet-wide concurrency (`--fleet-concurrency redis://…`): `--max-concurrent-requests`
counted across every replica naming the server, with this process's queue in front.

Each replica holds its slots under a lease: a member of the sorted set `smg:fleet:leases`
whose score is the lease's expiry (Redis time, so host clocks do not matter), and a count in
the hash `smg:fleet:held`. Taking a slot is one script: drop the leases that expired (with
their counts), sum the counts, and if below the limit count one more under this replica's
lease and extend it. Giving one back is one script too, and publishes on `smg:fleet:freed` so
the replicas with requests queued try again at once. A heartbeat renews the replica's lease
every third of `--fleet-lease-secs`, writing the count the replica really holds under it (a
take whose answer was lost may have counted a slot nobody holds; a take is never sent twice);
a replica that dies (kill -9, a lost host) stops renewing,
and its slots are free again at most `--fleet-lease-secs` after its last heartbeat (default
10 s). A replica whose lease expired while it lived (Redis away or the process stalled that
long) takes a new lease: the requests it still has in flight under the old one finish
uncounted.

The queue (`--queue-size`, `--queue-timeout-secs`) is this replica's, first come first
served, with the local limiter's answers (429 `admission_queue_full`, 503
`admission_queue_timeout`); a slot a request gives back goes to this replica's first waiter
before anyone else's. Waiters retry on every `freed` message, and at least every second (a
slot freed by an expired lease publishes nothing).

With Redis unreachable a request is refused with 503 `shared_state_unavailable`
(`--redis-failure-mode closed`) or admitted uncounted (open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from typing import Any

from smg.admission.concurrency import Admitted, ConcurrencyConfig, _shed
from smg.admission.refusal import shared_state_unavailable
from smg.shared.link import RedisLink, SharedStateConfig, SharedStateDown, messages, redis_errors

log = logging.getLogger("smg.admission.fleet")

LEASES = "smg:fleet:leases"
HELD = "smg:fleet:held"
FREED = "smg:fleet:freed"
_RETRY_SECS = 1.0  # the longest a waiter goes without trying again

# KEYS: leases, held. ARGV: lease, limit, lease ms, slots this replica holds under the lease.
# Returns 1 (taken), 0 (the fleet is at its limit), -1 (the lease expired: take a new one).
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, lease in ipairs(dead) do redis.call('HDEL', KEYS[2], lease) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
if tonumber(ARGV[4]) > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
local total = 0
for _, n in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(n) end
if total >= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

# KEYS: leases, held, freed channel. ARGV: lease. A lease that expired has nothing to give back.
RELEASE = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local left = redis.call('HINCRBY', KEYS[2], ARGV[1], -1)
if left <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[3], ARGV[1])
return 1
"""

# KEYS: leases, held. ARGV: lease, lease ms, the fewest and the most slots Redis may rightly
# count under it (what the replica holds; that plus its takes and releases still in flight).
# The count is set within those bounds, so a slot counted by a take whose reply never
# came back is given back here. Returns 0 when the lease had expired already.
RENEW = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local low, high = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
n = math.max(low, math.min(high, n))
if n <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
redis.call('HSET', KEYS[2], ARGV[1], n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
"""


def _replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FleetLimiter:
    """Slots counted in Redis across the fleet, and this replica's queue for them."""

    def __init__(self, config: ConcurrencyConfig, link: RedisLink, shared: SharedStateConfig) -> None:
        self.capacity = config.max_concurrent_requests
        self.queue_size = config.queue_size
        self.timeout = config.queue_timeout_secs
        self.link = link
        self.fail_open = shared.fail_open
        self.lease_secs = shared.lease_secs
        self._replica = _replica_id()  # made again at start: each forked process is a replica
        self._generation = 0
        self._held: dict[str, int] = {}  # slots this replica holds, per lease
        self._taking: dict[str, int] = {}  # takes sent and not answered yet, per lease
        self._giving: dict[str, int] = {}  # slots given back and not answered yet, per lease
        self._unsure: set[str] = set()  # leases whose count in Redis a lost answer left unknown
        self._waiters: deque[asyncio.Future[str]] = deque()
        self._wake: asyncio.Event | None = None
        self._pump: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def lease(self) -> str:
        return f"{self._replica}#{self._generation}"

    @property
    def in_use(self) -> int:
        return sum(self._held.values())

    @property
    def waiting(self) -> int:
        return sum(not w.done() for w in self._waiters)

    # lifecycle

    async def start(self) -> None:
        self._replica = _replica_id()
        self._wake = asyncio.Event()
        self._spawn(self._heartbeat(), "smg-fleet-heartbeat")
        self._spawn(self._listen(), "smg-fleet-freed")

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._pump] if self._pump else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, source: str, keys: list[str], args: list[Any]) -> Any:
        return await self.link.run(source, keys, args)

    # slots

    async def _take(self) -> str | None:
        """A slot under this replica's lease, or None when the fleet is at its limit.
        Raises SharedStateDown."""
        for _ in range(2):
            lease = self.lease
            self._taking[lease] = self._taking.get(lease, 0) + 1
            try:
                got = await self._run(
                    ACQUIRE,
                    [LEASES, HELD],
                    [lease, self.capacity, int(self.lease_secs * 1000), self._held.get(lease, 0)],
                )
            except BaseException:
                # Sent, maybe run, its answer lost (a timeout, a cancelled request): the heartbeat
                # sets the lease's count to what this replica holds.
                self._unsure.add(lease)
                raise
            finally:
                self._taking[lease] -= 1
                if not self._taking[lease]:
                    del self._taking[lease]
            if got == -1:
                self._renew_lost(lease)
                continue
            if got == 1:
                self._held[lease] = self._held.get(lease, 0) + 1
                return lease
            return None
        return None

    def _renew_lost(self, lease: str) -> None:
        if lease == self.lease:
            log.warning(
                "fleet lease %s expired while this replica held %d slot(s); taking a new one",
                lease,
                self._held.get(lease, 0),
            )
            self._generation += 1
        self._held.pop(lease, None)

    def _refused_down(self) -> Admitted:
        if self.fail_open:
            return Admitted(0.0, queued=False)
        raise shared_state_unavailable("the fleet-wide admission slots are unreachable")

    async def acquire(self) -> Admitted:
        if not self.waiting:
            try:
                lease = await self._take()
            except SharedStateDown:
                return self._refused_down()
            if lease is not None:
                return Admitted(0.0, queued=False, lease=lease)
        if self.queue_size == 0:
            raise _shed(429, "admission_queue_full", "concurrency limit reached and queuing is disabled")
        if self.waiting >= self.queue_size:
            raise _shed(429, "admission_queue_full", "admission queue is at capacity")
        start = time.perf_counter()
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._ensure_pump()
        try:
            async with asyncio.timeout(self.timeout):
                lease = await waiter
        except TimeoutError:
            if not (waiter.done() and not waiter.cancelled() and waiter.exception() is None):
                raise _shed(503, "admission_queue_timeout", "timed out waiting for an admission slot") from None
            lease = waiter.result()  # handed a slot just as the wait ran out: it is ours
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(Admitted(0.0, True, lease=waiter.result()))  # pass it on
            raise
        except SharedStateDown:
            return self._refused_down()
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        return Admitted(time.perf_counter() - start, queued=True, lease=lease or None)

    def release(self, admitted: Admitted | None = None) -> None:
        """A request ended: its slot goes to this replica's first waiter, else back to the fleet."""
        lease = admitted.lease if admitted is not None else None
        if lease is None or lease not in self._held:
            return  # admitted uncounted (Redis away, failing open), or its lease expired
        if lease == self.lease and self._hand_over(lease):
            return  # the slot changes hands; the count stays
        self._held[lease] -= 1
        if self._held[lease] <= 0 and lease != self.lease:
            del self._held[lease]
        self._spawn(self._give_back(lease), "smg-fleet-release")

    def _hand_over(self, lease: str) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(lease)
                return True
        return False

    async def _give_back(self, lease: str) -> None:
        self._giving[lease] = self._giving.get(lease, 0) + 1
        try:
            await self._run(RELEASE, [LEASES, HELD, FREED], [lease])
        except SharedStateDown:
            self._unsure.add(lease)  # the heartbeat writes the count this replica holds
        except BaseException:
            self._unsure.add(lease)
            raise
        finally:
            self._giving[lease] -= 1
            if not self._giving[lease]:
                del self._giving[lease]

    # waiting

    def _ensure_pump(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._serve_waiters(), name="smg-fleet-queue")

    async def _serve_waiters(self) -> None:
        """Take slots for the waiters, first come first served, while any wait."""
        assert self._wake is not None
        while self.waiting:
            self._wake.clear()
            try:
                lease = await self._take()
            except SharedStateDown as down:
                for waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_exception(down)
                return
            if lease is not None:
                if not self._hand_over(lease):
                    self.release(Admitted(0.0, False, lease=lease))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RETRY_SECS):
                    await self._wake.wait()

    async def _listen(self) -> None:
        """Wake the waiters whenever a replica gives a slot back."""
        while True:
            client = self.link.pubsub_client()
            pubsub = client.pubsub()  # `messages` reads the PONGs too
            try:
                await pubsub.subscribe(FREED)
                async for _ in messages(pubsub):
                    if self._wake is not None:
                        self._wake.set()
            except redis_errors():
                pass  # the link logs Redis's absence from the commands that fail
            finally:
                with contextlib.suppress(*redis_errors()):
                    await pubsub.aclose()
                with contextlib.suppress(*redis_errors()):
                    await client.aclose()
            await asyncio.sleep(_RETRY_SECS)

    async def _heartbeat(self) -> None:
        """Renew this replica's leases while it holds slots under them, writing their true count
        (and set right the leases a lost answer may have counted a slot under)."""
        every = self.lease_secs / 3
        while True:
            await asyncio.sleep(every)
            leases = {lease for lease, count in self._held.items() if count > 0} | self._unsure
            for lease in leases:
                held = self._held.get(lease, 0)
                # Redis may count, beyond what is held, the takes not answered yet and the slots
                # given back whose release has not run yet.
                most = held + self._taking.get(lease, 0) + self._giving.get(lease, 0)
                try:
                    renewed = await self._run(RENEW, [LEASES, HELD], [lease, int(self.lease_secs * 1000), held, most])
                except SharedStateDown:
                    break
                self._unsure.discard(lease)
                if not renewed and held:
                    self._renew_lost(lease)
