"""GET a client-named URL within the request's budget: one deadline, one byte budget, few at once.

Budgets are per request, not per read: a destination that trickles a byte every few seconds
is cut at the request's deadline, and many fetches share one byte budget, so a request holds
at most that much fetched data however many URLs it names. A body announced larger than what
is left is refused before it is read. Redirects are followed here, a few hops at most, each
hop's URL checked by the policy and its connection vetted again when it is dialled.

What the destination answered (status text, headers, body, the HTTP client's exception) is
never in an error's text: it would make the gateway an oracle for whatever the policy lets it
reach.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx2

from smg.fetch.dial import guarded_transport
from smg.fetch.policy import BadAnswer, BadUrl, DestinationPolicy, FetchError, OverLimit, TimedOut, Unreachable

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MIB = 1024 * 1024


def _size(n: int) -> str:
    return f"{n / _MIB:g} MiB" if n % (_MIB // 4) == 0 else f"{n} bytes"


@dataclass(frozen=True)
class Fetched:
    """A URL's body and the media type it was served as; `url` is the last hop's."""

    data: bytes
    media_type: str
    url: str


class Budget:
    """One request's fetches: a deadline for all of them together, a byte budget they share,
    and a bound on how many run at once. `label` names the budget in errors ("media")."""

    def __init__(self, *, timeout_secs: float, max_bytes: int, parallel: int, label: str) -> None:
        self.timeout_secs = timeout_secs
        self.deadline = asyncio.get_running_loop().time() + timeout_secs
        self.max_bytes = max_bytes
        self.remaining = max_bytes
        self.label = label
        self.slots = asyncio.Semaphore(max(1, parallel))

    def take(self, n: int) -> None:
        """Charge `n` fetched bytes. Raises `OverLimit` past the budget."""
        self.remaining -= n
        if self.remaining < 0:
            raise OverLimit(f"fetch exceeded the request's {_size(self.max_bytes)} {self.label} budget")


class Fetcher:
    """Bounded GETs through a policy-guarded client (one client, shared by every request)."""

    def __init__(self, policy: DestinationPolicy) -> None:
        self.policy = policy
        self._client: httpx2.AsyncClient | None = None

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(
                transport=guarded_transport(self.policy, max_connections=100, keepalive_expiry=30.0),
                follow_redirects=False,
                timeout=None,  # the request's deadline bounds everything (`Budget`)
                trust_env=False,
                # Bodies are read raw and counted as they arrive: no decompression that could
                # turn a small body into a large one.
                headers={"accept": "*/*", "accept-encoding": "identity", "user-agent": "smg"},
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def get(self, url: str, budget: Budget, *, max_bytes: int) -> Fetched:
        """`url`'s body, at most `max_bytes` of it, within `budget`. Raises `FetchError`."""
        # Running out of time before any response head is "did not answer" (like a refused
        # connection); waiting for a slot or for a body that trickles is the request's timeout.
        answered = [True]
        try:
            async with asyncio.timeout_at(budget.deadline):
                async with budget.slots:
                    answered[0] = False
                    return await self._follow(url, budget, max_bytes, answered)
        except TimeoutError:
            if answered[0]:
                raise TimedOut(budget.timeout_secs) from None
            raise Unreachable(budget.timeout_secs) from None

    async def _follow(self, url: str, budget: Budget, max_bytes: int, answered: list[bool]) -> Fetched:
        client = self._http()
        for _hop in range(MAX_REDIRECTS + 1):
            target = self.policy.target(url)
            try:
                async with client.stream("GET", target.url) as response:
                    answered[0] = True
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = urljoin(target.url, response.headers["location"])
                        answered[0] = False
                        continue
                    if response.status_code != 200:
                        raise BadAnswer("the destination did not answer with the content (status other than 200)")
                    announced = response.headers.get("content-length", "")
                    if announced.isdigit():
                        _fits(int(announced), max_bytes, budget)
                    data = bytearray()
                    async for chunk in response.aiter_raw():
                        data += chunk
                        budget.take(len(chunk))
                        if len(data) > max_bytes:
                            raise OverLimit(f"is larger than the {_size(max_bytes)} limit for one item")
                    media_type = response.headers.get("content-type", "").split(";")[0].strip()
                    return Fetched(bytes(data), media_type, target.url)
            except FetchError:
                raise
            except httpx2.InvalidURL:
                raise BadUrl("the URL is malformed") from None
            except httpx2.HTTPError:
                if answered[0]:
                    raise BadAnswer("the destination's answer broke off") from None
                raise Unreachable(budget.timeout_secs) from None
        raise BadAnswer(f"more than {MAX_REDIRECTS} redirects")


def _fits(announced: int, max_bytes: int, budget: Budget) -> None:
    if announced > max_bytes:
        raise OverLimit(f"is larger than the {_size(max_bytes)} limit for one item")
    if announced > budget.remaining:
        raise OverLimit(f"fetch exceeded the request's {_size(budget.max_bytes)} {budget.label} budget")
