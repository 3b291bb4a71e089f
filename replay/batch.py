"""Replay of every request a journal query selects against a live target, told in aggregate.

`smg replay QUERY --to URL` is how an engine or model upgrade is tried on recorded traffic:
each selected request goes through `replay.remote.replay_to` (what is sent, the secrets the
operator supplies, the run journaled with `replay_of`, the diff), at most `concurrency` at a
time and, with a `rate`, started at most that many a second. What comes back is a `Tally`:
how many answers were identical, different (and by which kind of difference), failed (no
whole answer: a refused connection, a timeout, an answer cut off) or skipped (the request
cannot be sent: no full body, a secret nobody supplied); and the candidate's latency and time
to first token beside the recorded ones.

Memory does not grow with the query: the selection is read a page at a time (`select`), at
most `concurrency` requests' events are held, and the distributions are `Quantiles`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from journal.redact import read_secret
from journal.store import JournalStore
from journal.writer import JournalWriter
from replay.diff import Difference
from replay.quantiles import Quantiles
from replay.remote import RemoteResult, ReplayError, replay_to

SCHEMA = "smg.replay.batch/1"
"""The JSON report's `schema`: a new key may be added under it, none renamed or removed."""
KINDS = ("text", "tool_calls", "stop_reason", "status", "usage", "other")
"""The kinds of difference counted, in the order reports show them."""
FAILURES = ("connection", "timeout", "broke_off")
"""Why a replay got no whole answer (`RemoteResult.failure`)."""
EXAMPLES = 20
"""Ids kept per kind of difference or failure (and of skipped requests), to look at with
`smg journal diff ORIGINAL REPLAY`."""
_PAGE = 500
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


@dataclass(frozen=True)
class Options:
    """How a batch is sent; the per-request settings are `replay_to`'s."""

    concurrency: int = 1
    rate: float | None = None  # requests started per second; None: as fast as the slots allow
    timeout: float = 600.0
    headers: Mapping[str, str] = field(default_factory=dict)
    mcp_tokens: Mapping[str, str] = field(default_factory=dict)
    secret_urls: tuple[str, ...] = ()
    exact: bool = False
    text: bool | None = None


def selection(query: str, *, include_replays: bool = False) -> str:
    """The query a batch reads: `query` without the replays already journaled (rows with
    `replay_of`), which carry the same bodies and would be selected again on every run."""
    if include_replays:
        return query
    return f"({query}) !replay:yes" if query.strip() else "!replay:yes"


def select(store: JournalStore, query: str, *, before: float, page: int = _PAGE) -> Iterator[dict[str, Any]]:
    """The summary rows `query` selects that arrived before `before` (epoch seconds), oldest
    first, read a page at a time by arrival (no OFFSET: page n costs what page 1 does).

    The bound keeps out the rows the replay itself adds while it runs (its own runs, and the
    target's when it journals to the same store), which the query could select again."""
    since: float | None = None
    at_since: set[str] = set()  # ids already given whose arrival is `since`
    limit = page
    while True:
        rows = store.list_requests(limit, query=query, descending=False, since_ts=since)
        fresh = 0
        for row in rows:
            ts = row.get("ts")
            if ts is None:  # no arrival time (sorted first): it cannot be paged by arrival
                continue
            if ts >= before:
                return
            rid = str(row["id"])
            if ts == since and rid in at_since:
                continue
            if ts != since:
                since, at_since = ts, set()
            at_since.add(rid)
            fresh += 1
            yield row
        if len(rows) < limit:
            return
        # A page all of one arrival time, every row given already: read a longer one.
        limit = limit * 2 if not fresh else page


def difference_kinds(differences: Iterable[Difference]) -> set[str]:
    """The kinds (`KINDS`) of a replay's differences from its original."""
    kinds: set[str] = set()
    for d in differences:
        path = d.path
        if path in ("status", "message") or path.startswith("error."):
            kinds.add("status")
        elif path in ("stop_reason", "stop_sequence"):
            kinds.add("stop_reason")
        elif path.startswith("usage."):
            kinds.add("usage")
        elif path == "content.kinds":
            kinds.add("tool_calls" if _tools(d.left) != _tools(d.right) else "text")
        elif path.startswith("content[") and path.endswith((".name", ".input")):
            kinds.add("tool_calls")
        elif path.startswith("content[") and path.endswith((".text", ".thinking", ".data")):
            kinds.add("text")
        else:
            kinds.add("other")
    return kinds


def _tools(kinds: Any) -> list[str]:
    return [k for k in kinds or () if k in _TOOL_BLOCKS]


@dataclass
class Tally:
    """What a batch found so far (see the module docstring); `report()` is the JSON report."""

    target: str
    query: str
    journal: str
    options: Options
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    interrupted: bool = False  # stopped before the end of the selection (Ctrl-C)
    replayed: int = 0
    identical: int = 0
    different: int = 0
    failed: int = 0
    skipped: int = 0
    text_compared: int = 0  # answers whose text was compared (a greedy request, or --text)
    by_kind: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    latency: dict[str, Quantiles] = field(default_factory=lambda: {"recorded": Quantiles(), "candidate": Quantiles()})
    ttft: dict[str, Quantiles] = field(default_factory=lambda: {"recorded": Quantiles(), "candidate": Quantiles()})

    @property
    def done(self) -> int:
        return self.replayed + self.skipped

    def skip(self, row: Mapping[str, Any], reason: str) -> None:
        self.skipped += 1
        self._example("skipped", {"id": str(row["id"]), "reason": reason})
        # Reasons name URLs and servers; a few hundred distinct ones say enough.
        if reason in self.skip_reasons or len(self.skip_reasons) < 200:
            self.skip_reasons[reason] += 1
        else:
            self.skip_reasons["(other reasons)"] += 1

    def add(self, row: Mapping[str, Any], result: RemoteResult) -> None:
        self.replayed += 1
        _timing(self.latency["recorded"], row.get("duration_ms"))
        _timing(self.ttft["recorded"], row.get("ttfe_ms"))
        example = {"id": str(row["id"]), "replay_id": result.replay_id, "status": result.status}
        if result.failure is not None:
            self.failed += 1
            self.failures[result.failure] += 1
            self._example(f"failed.{result.failure}", {**example, "error": result.error})
            return
        _timing(self.latency["candidate"], result.latency_ms)
        _timing(self.ttft["candidate"], result.ttft_ms)
        self.text_compared += 1 if result.text_compared else 0
        if result.identical:
            self.identical += 1
            return
        self.different += 1
        fields = [d.path for d in result.differences][:10]
        for kind in difference_kinds(result.differences):
            self.by_kind[kind] += 1
            self._example(kind, {**example, "fields": fields})

    def _example(self, key: str, example: dict[str, Any]) -> None:
        kept = self.examples.setdefault(key, [])
        if len(kept) < EXAMPLES:
            kept.append(example)

    def report(self) -> dict[str, Any]:
        """The JSON report (`SCHEMA`): every key present, every kind listed, zeros included."""
        return {
            "schema": SCHEMA,
            "target": self.target,
            "query": self.query,
            "journal": self.journal,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at) if self.finished_at is not None else None,
            "interrupted": self.interrupted,
            "options": {
                "concurrency": self.options.concurrency,
                "rate": self.options.rate,
                "timeout": self.options.timeout,
                "exact": self.options.exact,
                "text": self.options.text,
            },
            "selected": self.done,
            "replayed": self.replayed,
            "identical": self.identical,
            "different": self.different,
            "failed": self.failed,
            "skipped": self.skipped,
            "text_compared": self.text_compared,
            "different_by_kind": {kind: self.by_kind[kind] for kind in KINDS},
            "failed_by_kind": {kind: self.failures[kind] for kind in FAILURES},
            "skipped_reasons": dict(self.skip_reasons.most_common()),
            "latency_ms": {side: q.summary() for side, q in self.latency.items()},
            "ttft_ms": {side: q.summary() for side, q in self.ttft.items()},
            "examples": {
                "different": {kind: self.examples.get(kind, []) for kind in KINDS},
                "failed": {kind: self.examples.get(f"failed.{kind}", []) for kind in FAILURES},
                "skipped": self.examples.get("skipped", []),
            },
        }


def _timing(quantiles: Quantiles, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        quantiles.add(float(value))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Pace:
    """Starts at most `rate` a second: each start at least 1/rate after the one before."""

    def __init__(self, rate: float | None) -> None:
        self._gap = 1.0 / rate if rate else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        if not self._gap:
            return
        now = time.monotonic()
        if now < self._next:
            await asyncio.sleep(self._next - now)
            now = time.monotonic()
        self._next = max(now, self._next) + self._gap


async def run(
    store: JournalStore,
    rows: Iterable[Mapping[str, Any]],
    url: str,
    tally: Tally,
    journal_path: str | Path | None,
    *,
    on_done: Callable[[Tally], None] | None = None,
) -> Tally:
    """Replay each of `rows` (summary rows of `store`) to `url`, journaling the runs in
    `journal_path` (None: not journaled here), counting into `tally`; `on_done` is called
    after each request (a progress bar)."""
    options = tally.options
    slots = asyncio.Semaphore(options.concurrency)
    pace = _Pace(options.rate)
    running: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
    # The runs' fingerprints are keyed as the gateway that wrote the journal keys them.
    writer = JournalWriter(journal_path, secret=read_secret(journal_path)) if journal_path is not None else None
    if writer is not None:
        await writer.start()

    async def one(row: Mapping[str, Any], client: httpx.AsyncClient, started_at: float) -> None:
        try:
            if row.get("bodies") not in (None, "full"):
                tally.skip(row, f"journaled with --journal-bodies {row['bodies']}: replay needs full bodies")
                return
            events = [e for _, e in store.events(str(row["id"]))]
            try:
                result = await replay_to(
                    events,
                    url,
                    options.headers,
                    journal_path,  # for the journal's key only: `writer` is the one that journals
                    exact=options.exact,
                    text=options.text,
                    mcp_tokens=options.mcp_tokens,
                    secret_urls=options.secret_urls,
                    writer=writer,
                    client=client,
                    started_at=started_at,
                )
            except ReplayError as exc:
                tally.skip(row, str(exc))
                return
            tally.add(row, result)
        finally:
            slots.release()
            if on_done is not None:
                on_done(tally)

    try:
        timeout = httpx.Timeout(options.timeout, connect=min(10.0, options.timeout))
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            for row in rows:
                await slots.acquire()
                await pace.wait()
                task = asyncio.create_task(one(row, client, time.time()))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
    finally:
        # Interrupted (Ctrl-C cancels this task): the requests in flight are abandoned, and
        # waited for so that their runs are journaled up to where they stopped.
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if writer is not None:
            await writer.close()
        tally.finished_at = time.time()
    return tally
