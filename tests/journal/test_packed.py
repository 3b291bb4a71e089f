"""The packed form of a run of streaming events (`journal.packed`): every payload comes back as
the very dict it was, the short forms are as short as promised, and what the format cannot hold
is refused (the writer then stores those events one JSON row each)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from journal import packed
from journal.events import Block, Completed, Event, Tokens, Upstream
from journal.reader import JournalReader
from journal.writer import JournalWriter, encode
from smg.protocol import stream as ev


def round_trip(events: list[Event], seq: int = 5) -> list[tuple[int, str, float, dict[str, object]]]:
    data = packed.pack(events, events[0].t, encode)
    assert packed.count(data) == len(events)
    return packed.unpack(seq, events[0].t, data)


def test_every_kind_of_entry_comes_back_as_it_was() -> None:
    events: list[Event] = [
        Tokens(ids=[151644, 0, 9], prompt_tokens=12, completion_tokens=3, t=0.5),
        Block(ev.text_delta(0, 'a "quoted"\n\x01 line ✓'), t=0.5001),
        Tokens(ids=[4], prompt_tokens=12, completion_tokens=4, t=0.5002),  # predicted: no fields
        Block(ev.thinking_delta(0, "hmm"), t=0.5003),
        Block(ev.content_block_stop(0), t=0.5004),  # generic
        Block(ev.input_json_delta(3, '{"a": 1'), t=0.5005),  # another index
        Block(ev.text_delta(3, ""), t=0.5006),
        Tokens(ids=[], prompt_tokens=None, completion_tokens=None, t=0.5007),
        Tokens(ids=[2**40], prompt_tokens=12, completion_tokens=99, finish_reason="stop", matched_stop=-3, t=0.6),
        Tokens(ids=[1], prompt_tokens=0, completion_tokens=0, matched_stop="</s>", t=0.4),  # time went back
        Tokens(ids=[-1, -1], prompt_tokens=0, completion_tokens=2, t=0.41),  # ids as `redacted` bodies keep them
        Upstream(part="chunk", data="event: ping\ndata: {}\n\n", t=0.61),
        Upstream(part="chunk", data="aGk=", encoding="base64", t=0.62),  # generic
        Block({"index": 0, "type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}, t=0.63),
        Block(ev.text_delta(0, "x") | {"extra": True}, t=0.64),
    ]
    out = round_trip(events)
    assert [seq for seq, *_ in out] == list(range(5, 5 + len(events)))
    assert [kind for _, kind, _, _ in out] == [e.kind for e in events]
    assert [list(p.items()) for *_, p in out] == [list(e.to_dict().items()) for e in events]  # keys in order
    blocks = [list(e.event) for e in events if isinstance(e, Block)]
    assert [list(p["event"]) for *_, p in out if "event" in p] == blocks
    for (_, _, t, _), event in zip(out, events, strict=True):
        assert t == pytest.approx(event.t, abs=1e-6)
    assert out[0][2] == events[0].t  # the row's first time is exact


def test_a_streamed_token_costs_a_few_bytes() -> None:
    # One engine chunk of one token and its text delta, as the gRPC path journals them.
    events: list[Event] = []
    for i in range(200):
        events.append(Tokens(ids=[100_000 + i], prompt_tokens=30, completion_tokens=i + 1, t=0.01 + i * 3e-4))
        events.append(Block(ev.text_delta(0, " word"), t=0.01 + i * 3e-4 + 2e-5))
    data = packed.pack(events, events[0].t, encode)
    assert len(data) / 200 <= 16
    alone = packed.pack(events[2:4], events[2].t, encode)  # a flush window holding one token
    assert len(alone) <= 20


def test_token_ids_at_every_varint_width_come_back() -> None:
    # Each side of the one-, two-, three- and more-byte encodings, zigzagged, and the int64 ends.
    edges = [0, 63, 64, 8191, 8192, 1048575, 1048576, 2**40, 2**63 - 1]
    ids = [*edges, *(-1 - e for e in edges), True - 1]
    out = round_trip([Tokens(ids=ids, prompt_tokens=1, completion_tokens=len(ids))])
    assert out[0][3]["ids"] == ids
    assert packed.pack([Tokens(ids=[7] * 300)], 0.0, encode).count(bytes([14])) == 300


@pytest.mark.parametrize(
    "event",
    [
        Block(ev.text_delta(0, "lone \udcff surrogate")),
        Tokens(ids=[1 << 64]),
        Tokens(ids=[1 << 63]),
        Tokens(ids=[-(1 << 63) - 1]),
        Tokens(ids=[1, True]),
        Tokens(ids=[1.0]),  # type: ignore[list-item]
        Tokens(ids=[1], matched_stop=1.5),  # type: ignore[arg-type]
    ],
)
def test_what_the_format_cannot_hold_is_refused(event: Event) -> None:
    with pytest.raises((ValueError, TypeError)):
        packed.pack([event], 0.0, encode)


def test_only_streaming_kinds_are_packed() -> None:
    with pytest.raises(ValueError):
        packed.pack([Tokens(ids=[1]), Completed(status=200, duration_ms=1.0)], 0.0, encode)


async def test_the_writer_packs_a_stream_and_stores_the_rest_one_row_each(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    events: list[Event] = [Tokens(ids=[i], prompt_tokens=3, completion_tokens=i + 1, t=i / 1000) for i in range(50)]
    events.insert(20, Block(ev.text_delta(0, "bad \udcff"), t=0.0195))  # cannot be packed: its run is split off
    for seq, event in enumerate(events, 1):
        await writer.append("msg_a", seq, event)
    await writer.close()
    assert writer.stats["events_written"] == len(events)
    with JournalReader(path) as reader:
        stored = reader.events("msg_a")
    assert [seq for seq, _ in stored] == list(range(1, len(events) + 1))
    assert [e.to_dict() for _, e in stored][:20] == [e.to_dict() for e in events][:20]
    assert isinstance(stored[20][1], Block) and "\\udcff" in str(stored[20][1].event)
    conn = sqlite3.connect(path)
    try:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events ORDER BY seq")]
    finally:
        conn.close()
    assert kinds.count("run") < 5 and len(kinds) < 10


@pytest.mark.parametrize("bodies", ["redacted", "none"])
async def test_every_body_mode_packs_a_stream(tmp_path: Path, bodies: str) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, bodies=bodies)
    await writer.start()
    for seq in range(1, 41):
        await writer.append("msg_a", seq, Tokens(ids=[seq], prompt_tokens=3, completion_tokens=seq, t=seq / 1000))
    await writer.close()
    conn = sqlite3.connect(path)
    try:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events")]
    finally:
        conn.close()
    assert set(kinds) == {"run"} and len(kinds) <= 3
    with JournalReader(path) as reader:
        counts = [len(e.ids) for _, e in reader.events("msg_a") if isinstance(e, Tokens)]
    assert counts == [0 if bodies == "none" else 1] * 40
