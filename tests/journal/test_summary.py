"""Folding events into a summary row, and one-line descriptions."""

from __future__ import annotations

from typing import Any

from journal.events import (
    Admission,
    Block,
    Completed,
    Counted,
    Error,
    Event,
    McpCall,
    McpConnect,
    McpResult,
    ModelCall,
    ModelResult,
    Received,
    Rejected,
    Rendered,
    Routed,
    Settled,
    StreamOpened,
    Tokens,
    Upstream,
    Validated,
    event_kinds,
)
from journal.summary import apply, describe


def fold(events: list[Event]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for event in events:
        apply(row, "req_1", event)
    return row


def test_received_and_replay_header() -> None:
    row = fold(
        [
            Received(
                method="POST",
                path="/v1/messages",
                headers={"X-SMG-Replay-Of": "req_0"},
                tenant="t",
                ts=5.0,
            )
        ]
    )
    assert row == {
        "id": "req_1",
        "ts": 5.0,
        "method": "POST",
        "path": "/v1/messages",
        "tenant": "t",
        "replay_of": "req_0",
    }


def test_validated_then_routed_model_wins() -> None:
    row = fold(
        [
            Validated(model="alias", stream=False),
            Routed(backend="http", worker="http://w", model="real"),
        ]
    )
    assert (row["model"], row["stream"], row["backend"], row["worker"]) == (
        "real",
        0,
        "http",
        "http://w",
    )


def test_ttfe_is_the_first_upstream_or_block() -> None:
    row = fold(
        [
            Tokens(ids=[1], t=0.005),  # not an upstream/block event
            Upstream(part="head", status=200, t=0.010),
            Upstream(part="chunk", data="x", t=0.020),
            Block(event={"type": "message_start", "message": {}}, t=0.030),
        ]
    )
    assert row["ttfe_ms"] == 10.0


def test_error_after_routing() -> None:
    row = fold(
        [
            Routed(backend="grpc", worker="w", model="m"),
            Error(
                stage="backend",
                status=502,
                error_type="api_error",
                message="down",
                code="worker_unavailable",
            ),
            Completed(status=502, duration_ms=3.0, bytes_sent=99),
        ]
    )
    assert (row["status"], row["error_code"], row["error_type"], row["completed"]) == (
        502,
        "worker_unavailable",
        "api_error",
        1,
    )


def test_rejected() -> None:
    row = fold([Rejected(status=413, error_type="request_too_large", message="big")])
    assert (row["status"], row["error_code"], row["error_type"]) == (
        413,
        None,
        "request_too_large",
    )


def test_usage_from_blocks_and_completed() -> None:
    row = fold(
        [
            Block(event={"type": "message_start", "message": {"usage": {"input_tokens": 7}}}),
            Block(
                event={
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 3},
                }
            ),
        ]
    )
    assert (row["input_tokens"], row["output_tokens"], row["stop_reason"]) == (7, 3, "end_turn")
    apply(
        row,
        "req_1",
        Completed(
            status=200,
            duration_ms=9.0,
            usage={"input_tokens": 8, "output_tokens": 4},
            stop_reason="max_tokens",
        ),
    )
    assert (row["input_tokens"], row["output_tokens"], row["stop_reason"]) == (8, 4, "max_tokens")
    assert (row["duration_ms"], row["completed"]) == (9.0, 1)


def test_block_types_flags() -> None:
    def start(kind: str) -> Block:
        return Block(event={"type": "content_block_start", "content_block": {"type": kind}})

    assert "has_tool_use" not in fold([start("text")])
    assert fold([start("tool_use")])["has_tool_use"] == 1
    assert fold([start("server_tool_use")])["has_tool_use"] == 1
    assert fold([start("thinking")])["has_thinking"] == 1
    assert fold([start("redacted_thinking")])["has_thinking"] == 1


def test_describe_every_kind() -> None:
    samples: list[Event] = [
        Received(method="POST", path="/v1/messages", body="{}", tenant="t"),
        Validated(model="m", stream=True),
        Rejected(status=400, error_type="invalid_request_error", message="no", code="c"),
        Routed(backend="grpc", worker="w", model="m", policy="round_robin", attempt=2),
        Rendered(prompt_tokens=5, prompt_digest="abcdef0123456789", stop_ids=[2]),
        Tokens(ids=[1, 2], completion_tokens=2, finish_reason="stop"),
        Upstream(part="chunk", data="x" * 500),
        Block(event={"type": "content_block_delta", "index": 0, "delta": {"text": "hi\n"}}),
        Error(stage="backend", status=500, error_type="api_error", message="boom"),
        Completed(status=200, duration_ms=1.25, usage={"input_tokens": 1, "output_tokens": 2}),
        StreamOpened(),
        McpConnect(server="s", url="http://m/mcp", ok=False, error="ConnectError: refused", duration_ms=2.0),
        ModelCall(round=2, stream=True, tools=["a"], added=[{"role": "user", "content": []}]),
        ModelResult(round=2, status=200, stop_reason="tool_use", usage={"input_tokens": 3}, tool_uses=["a", "b"]),
        McpCall(round=2, server="s", tool="a", id="mcptoolu_1", input={"q": "x" * 300}, allowed=False),
        McpResult(round=2, server="s", tool="a", id="mcptoolu_1", is_error=True, content="no\n" * 100),
        Admission(gate="concurrency", decision="queue_timeout", queued_ms=1000.0, tenant="auth:t"),
        Settled(tenant="auth:t", reserved_tokens=5, input_tokens=5, output_tokens=9, delta=9),
        Counted(input_tokens=5),
    ]
    assert sorted({e.kind for e in samples}) == event_kinds()
    for event in samples:
        line = describe(event)
        assert line and "\n" not in line and len(line) < 200, (event.kind, line)
    assert describe(samples[7]) == "content_block_delta #0 'hi\\n'"
    assert describe(samples[-1]) == "input_tokens=5"
    assert "attempt=2" in describe(samples[3])
    assert describe(samples[12]).startswith("round 2 stream +1 messages")
    assert "calls=a,b" in describe(samples[13]) and "DENIED" in describe(samples[14])


def test_a_stream_cut_before_its_usage_keeps_its_prompt_tokens() -> None:
    row: dict[str, Any] = {}
    for event in (
        Received(method="POST", path="/v1/messages", body='{"model": "m"}', ts=1.0),
        Validated(model="m", stream=True, t=0.001),
        Rendered(prompt_tokens=42, prompt_digest="d", t=0.002),
        Completed(status=200, duration_ms=5.0, disconnected=True, t=0.005),
    ):
        apply(row, "r", event)
    assert row["input_tokens"] == 42


def test_usage_that_comes_wins_over_the_rendered_count_and_cache_tokens_are_priced() -> None:
    from journal.prices import parse
    from journal.summary import price

    row: dict[str, Any] = {}
    usage = {"input_tokens": 40, "output_tokens": 7, "cache_creation_input_tokens": 1000}
    for event in (
        Received(method="POST", path="/v1/messages", body="{}", ts=1.0),
        Routed(backend="grpc", worker="w", model="claude-x", t=0.001),
        Rendered(prompt_tokens=1040, prompt_digest="d", t=0.002),
        Completed(status=200, duration_ms=5.0, usage=usage, t=0.005),
    ):
        apply(row, "r", event)
    assert (row["input_tokens"], row["output_tokens"]) == (40, 7)
    price(row, parse({"models": {"claude-*": {"input": 1.0, "output": 2.0, "cache_write": 10.0}}}))
    assert row["cost_usd"] == (40 * 1.0 + 7 * 2.0 + 1000 * 10.0) / 1_000_000
    price(row, parse({"models": {"other": {"input": 1.0}}}))
    assert row["cost_usd"] is None


def test_budget_events_from_before_money_budgets_still_read_and_describe() -> None:
    from journal.events import event_from_dict

    old_admission = {"gate": "tenant_rate_limit", "decision": "admitted", "tenant": "t", "reserved_tokens": 5}
    old_settled = {"tenant": "t", "reserved_tokens": 5, "input_tokens": 5, "output_tokens": 9, "delta": 9}
    admission = event_from_dict("admission", old_admission)
    settled = event_from_dict("settled", old_settled)
    assert isinstance(admission, Admission) and admission.prompt_usd is None
    assert isinstance(settled, Settled) and (settled.reserved_usd, settled.cost_usd, settled.delta_usd) == (None,) * 3
    assert describe(admission) == "tenant_rate_limit admitted reserved=5 tenant=t"
    assert describe(settled) == "+9 tokens (input=5 output=9 reserved=5) tenant=t"
    money = Settled(
        tenant="t", reserved_tokens=5, input_tokens=5, output_tokens=1, delta=-4,
        reserved_usd=0.5, cost_usd=0.25, delta_usd=-0.25,
    )  # fmt: skip
    assert "-$0.250000 (cost=$0.250000 reserved=$0.500000)" in describe(money)
    denied = Admission(gate="tenant_rate_limit", decision="denied", tenant="t", prompt_usd=0.5)
    assert "asked=$0.500000" in describe(denied)
