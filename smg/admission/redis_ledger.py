"""Token budgets in Redis (`--tenant-rate-limit-state redis://…`): the buckets of `ledger`,
shared by every replica on every host that names the server.

Each reservation and each settlement is ONE Lua script (sent as EVALSHA, loaded again on
NOSCRIPT), so Redis runs the read, refill, check and debit of every scope of a request with
nothing in between: any number of replicas draw from one budget. The scripts read the time
from Redis (`TIME`), not from the replicas, so hosts whose clocks disagree still refill one
bucket at one rate. A bucket is a hash `smg:budget:<scope>` (tokens, requests, updated) that
expires when it would be full again: a missing key is a full bucket, so nothing is pruned by
hand. A gateway restart resumes the buckets where they are; so does a Redis restart when the
server persists (`appendonly yes`), else the buckets start full again.

With the server unreachable, a reservation is allowed uncharged (`--redis-failure-mode open`)
or refused with 503 `shared_state_unavailable` (closed, the default); a settlement that
cannot be written is dropped (its request's output goes uncharged). Either way the link logs
one line, not one per request, and while the server is known down neither waits for it
(`smg.shared.link`). A settlement runs in a task of its own, kept until it is answered; the
response's end waits for it at most `SETTLE_WAIT_SECS` (a server that answers, in well under a
millisecond, has trued the budget up before the client sees the end; a stalled one costs no
more than that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from smg.admission.ledger import Decision
from smg.admission.policy import Scope
from smg.shared.link import RedisLink, SharedStateDown

PREFIX = "smg:budget:"
UNAVAILABLE_RETRY_AFTER = 2
SETTLE_WAIT_SECS = 0.2

# Shared by both scripts: a bucket refilled to now, and its write with the expiry that makes a
# full bucket the same as no key.
_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
-- dcap 0: the scope has no money limit, its dollars are never read
local function load(key, tcap, rcap, dcap)
  local h = redis.call('HMGET', key, 'tokens', 'requests', 'updated', 'dollars')
  if not h[1] then return tcap, rcap, now, dcap end
  local updated = tonumber(h[3])
  local elapsed = math.max(0, now - updated)
  local dollars = 0
  if dcap > 0 then
    dollars = dcap  -- a bucket from before its money limit: none of it spent yet
    if h[4] then dollars = math.min(dcap, tonumber(h[4]) + elapsed * dcap / 60) end
  end
  return math.min(tcap, tonumber(h[1]) + elapsed * tcap / 60),
         math.min(rcap, tonumber(h[2]) + elapsed * rcap / 60),
         math.max(now, updated), dollars
end
local function store(key, tokens, requests, updated, dollars, tcap, rcap, dcap)
  local full_in = math.max((tcap - tokens) / (tcap / 60), (rcap - requests) / (rcap / 60))
  if dcap > 0 then
    full_in = math.max(full_in, (dcap - dollars) / (dcap / 60))
    redis.call('HSET', key, 'dollars', string.format('%.17g', dollars))
  end
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens),
             'requests', string.format('%.17g', requests), 'updated', string.format('%.17g', updated))
  redis.call('PEXPIRE', key, math.ceil(full_in * 1000) + 1000)
end
"""

# KEYS: the scopes' buckets. ARGV: tokens, dollars, then each scope's tokens, requests and
# dollars per minute (0: no money limit).
# Returns {1, 0} (debited), {0, seconds} (retry then), {0, -1} (more than the scope ever holds).
RESERVE = (
    _BUCKET
    + """
local want, spend = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = {}
local allowed, never, wait = true, false, 0
for i, key in ipairs(KEYS) do
  local tcap, rcap, dcap = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local tokens, requests, updated, dollars = load(key, tcap, rcap, dcap)
  held[i] = {tokens, requests, updated, dollars, tcap, rcap, dcap}
  local broke = dcap > 0 and dollars < spend
  if not (tokens >= want and requests >= 1) or broke then
    allowed = false
    if want > tcap or (dcap > 0 and spend > dcap) then
      never = true
    else
      local w = 0
      if tokens < want then w = math.max(w, (want - tokens) / (tcap / 60)) end
      if requests < 1 then w = math.max(w, (1 - requests) / (rcap / 60)) end
      if broke then w = math.max(w, (spend - dollars) / (dcap / 60)) end
      wait = math.max(wait, math.max(1, math.ceil(w)))
    end
  end
end
if not allowed then
  if never then return {0, -1} end
  return {0, wait}
end
for i, key in ipairs(KEYS) do
  local b = held[i]
  store(key, b[1] - want, b[2] - 1, b[3], b[4] - spend, b[5], b[6], b[7])
end
return {1, 0}
"""
)

# KEYS: the scopes' buckets. ARGV: delta (tokens used beyond the reservation; negative gives
# back), the dollars beyond it, then each scope's tokens, requests and dollars per minute.
SETTLE = (
    _BUCKET
    + """
local delta, spent = tonumber(ARGV[1]), tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local tcap, rcap, dcap = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local tokens, requests, updated, dollars = load(key, tcap, rcap, dcap)
  store(key, math.min(tcap, tokens - delta), requests, updated, math.min(dcap, dollars - spent), tcap, rcap, dcap)
end
return 1
"""
)


def _args(tokens: int, dollars: float, scopes: Sequence[Scope]) -> list[int | float]:
    out: list[int | float] = [tokens, dollars]
    for scope in scopes:
        limits = scope.limits
        out += [limits.tokens_per_minute, limits.requests_per_minute, limits.dollars_per_minute or 0]
    return out


class RedisLedger:
    """The buckets in Redis, shared by every replica naming the server."""

    def __init__(self, link: RedisLink, *, fail_open: bool) -> None:
        self.link = link
        self.fail_open = fail_open
        self._settling: set[asyncio.Task[None]] = set()

    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float, dollars: float = 0.0) -> Decision:
        keys = [PREFIX + s.key for s in scopes]
        try:
            allowed, wait = await self.link.run(RESERVE, keys, _args(tokens, dollars, scopes))
        except SharedStateDown:
            if self.fail_open:
                return Decision(True)
            return Decision(False, UNAVAILABLE_RETRY_AFTER, unavailable=True)
        if allowed:
            return Decision(True)
        return Decision(False, None if wait < 0 else int(wait))

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float, dollars: float = 0.0) -> None:
        keys = [PREFIX + s.key for s in scopes]
        args = _args(delta, dollars, scopes)
        task = asyncio.get_running_loop().create_task(self._settle(keys, args), name="smg-settle")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        await asyncio.wait((task,), timeout=SETTLE_WAIT_SECS)  # the task goes on past the wait

    async def _settle(self, keys: list[str], args: list[int | float]) -> None:
        try:
            await self.link.run(SETTLE, keys, args)
        except SharedStateDown:
            pass  # counted and logged by the link; this output goes uncharged

    def close(self) -> None:
        pass  # the link is closed with the others when the server stops
