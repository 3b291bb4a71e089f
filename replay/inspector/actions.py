"""What the inspector's keys do to a request: export it as curl, replay it offline, diff it.

Thin adapters over `journal.export`, `replay.offline` and `replay.diff`, returning something
the app can show; every "cannot" is an `Unavailable` with a message for the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from rich.console import Group, RenderableType
from rich.text import Text

from journal.export import DEFAULT_BASE_URL, as_curl
from journal.store import JournalStore
from replay import diff as diffing
from replay.inspector.data import RequestDetail, load_detail, load_tokenizer

NOT_REPLAYABLE = "offline replay needs a gRPC request (one generated from engine token ids)"


class Unavailable(Exception):
    """The action cannot be done for this request (the message says why)."""


@dataclass
class Comparison:
    title: str
    differences: list[diffing.Difference]
    left: str
    right: str
    note: str = ""

    def view(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.note:
            parts.append(Text(self.note, style="dim"))
        if self.differences:
            parts.append(diffing.render(self.differences, left=self.left, right=self.right))
        else:
            parts.append(Text("no differences", style="bold green"))
        return Group(*parts)


def curl(detail: RequestDetail, base_url: str | None = None) -> str:
    received = detail.received
    if received is None:
        raise Unavailable(f"{detail.id} has no `received` event to export")
    return as_curl(received, base_url or DEFAULT_BASE_URL)


def offline(detail: RequestDetail) -> Comparison:
    """Recompute a gRPC request's blocks from its recorded tokens and compare them with the journal."""
    # Imported here: it brings in transformers, which the list does not need.
    from replay.offline import NotReplayable, check

    if not detail.is_grpc:
        raise Unavailable(NOT_REPLAYABLE)
    if detail.bodies != "full":
        raise Unavailable(f"{detail.id} was journaled with {detail.bodies} bodies: replay needs full ones")
    rendered = detail.rendered
    tokenizer, why = load_tokenizer(rendered.tokenizer if rendered is not None else None)
    if tokenizer is None:
        raise Unavailable(f"cannot replay {detail.id} offline: {why}")
    try:
        report = check(detail.events, tokenizer)
    except NotReplayable as exc:
        raise Unavailable(str(exc)) from exc
    verdict = "identical" if report.identical else f"{len(report.differences)} differences"
    note = f"{len(report.recorded)} blocks recorded, {len(report.recomputed)} recomputed"
    if report.partial:
        note += "; the client went away, so only the recorded prefix is compared"
    return Comparison(f"offline replay of {detail.id}: {verdict}", report.differences, "recorded", "recomputed", note)


def against_original(reader: JournalStore, detail: RequestDetail) -> Comparison:
    """A replay's response against the response of the request it replayed."""
    original_id = detail.row.get("replay_of")
    if not original_id:
        raise Unavailable(f"{detail.id} is not a replay of another request")
    original = load_detail(reader, str(original_id))
    if original is None:
        raise Unavailable(f"{detail.id} replays {original_id}, which is not in this journal")
    if original.response is None or detail.response is None:
        raise Unavailable(original.response_error or detail.response_error or "a response cannot be rebuilt")
    # A run `smg replay` journaled holds the target's answer as received: compared as such
    # (its error code included), like the command compared it.
    from replay.remote import is_replay_run, target_answer

    replayed: diffing.Side = detail.response
    if is_replay_run(detail.events):
        replayed = target_answer(detail.events) or detail.response
    # Another generation's text is only expected to match when decoding was greedy.
    text = diffing.deterministic(_json(original.received.body if original.received else None))
    found = diffing.diff(original.response, replayed, text=text)
    note = "text compared (greedy decoding)" if text else "text not compared (sampling was not greedy)"
    verdict = "same" if not found else f"{len(found)} differences"
    return Comparison(f"{detail.id} vs its original {original.id}: {verdict}", found, original.id, detail.id, note)


def _json(body: str | None) -> Any:
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
