"""Routing text from a Messages request; routing keys and client identity from headers."""

from __future__ import annotations

from typing import Any

import pytest

from smg.protocol.request import CountTokensRequest, CreateMessageRequest
from smg.routing.policies import affinity_key, rid_key, routing_key, routing_text, strip_lineage

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _request(**fields: Any) -> CreateMessageRequest:
    return CreateMessageRequest.model_validate({"model": "m", "max_tokens": 8, **fields})


def test_system_then_messages_joined_by_single_spaces() -> None:
    request = _request(
        system="Be brief.",
        messages=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": [_text("Hi!")]},
            {"role": "user", "content": [_text("What is"), IMAGE, _text("this?")]},
        ],
    )
    assert routing_text(request) == "Be brief. Hello Hi! What is this?"


def test_system_blocks_and_empty_strings() -> None:
    request = _request(
        system=[_text("One."), _text(""), _text("Two.")],
        messages=[{"role": "user", "content": ""}, {"role": "user", "content": "Three."}],
    )
    assert routing_text(request) == "One. Two. Three."


def test_only_top_level_text_blocks_count() -> None:
    request = _request(
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "call the tool", "signature": "sig"},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [_text("sunny")]}],
            },
        ]
    )
    assert routing_text(request) == "Weather?"


def test_no_text_is_empty() -> None:
    assert routing_text(_request(messages=[{"role": "user", "content": [IMAGE]}])) == ""


def test_count_tokens_requests_route_on_the_same_text() -> None:
    body = {"model": "m", "system": "S", "messages": [{"role": "user", "content": "Q"}]}
    assert routing_text(CountTokensRequest.model_validate(body)) == "S Q"


NAMES = ("x-smg-routing-key",)


def test_routing_key_reads_the_configured_headers_in_order() -> None:
    assert routing_key({"X-SMG-Routing-Key": "conv-1"}, NAMES) == "conv-1"
    assert routing_key({}, NAMES) is None
    names = ("x-session-id", "x-smg-routing-key")
    assert routing_key({"x-smg-routing-key": "b", "x-session-id": "a"}, names) == "a"
    assert routing_key({"x-smg-routing-key": "b", "x-session-id": ""}, names) == "b"


def test_routing_key_over_the_cap_is_ignored() -> None:
    assert routing_key({"x-smg-routing-key": "k" * 128}, NAMES) == "k" * 128
    assert routing_key({"x-smg-routing-key": "k" * 129}, NAMES) is None
    # The cap is in UTF-8 bytes: 43 three-byte characters are 129 bytes.
    assert routing_key({"x-smg-routing-key": "€" * 43}, NAMES) is None
    # An over-cap value does not hide a valid one further down the list.
    names = ("x-a", "x-b")
    assert routing_key({"x-a": "k" * 200, "x-b": "ok"}, names) == "ok"


def test_routing_key_is_stripped_only_for_sticky_sessions() -> None:
    headers = {"x-smg-routing-key": "conv_t3_r1"}
    assert routing_key(headers, NAMES) == "conv_t3_r1"
    assert routing_key(headers, NAMES, strip=True) == "conv"


@pytest.mark.parametrize(
    ("key", "stripped"),
    [
        ("conv_t2_r1", "conv"),
        ("conv_r3", "conv"),
        ("conv_t2", "conv"),
        ("conv_r1_t2", "conv_r1"),  # a turn suffix after a retry: only the turn goes
        ("conv_x1", "conv_x1"),
        ("conv_t", "conv_t"),
        ("conv_t1a", "conv_t1a"),
        ("conv_t²", "conv_t²"),
        ("_r1", "_r1"),  # nothing but a suffix: keys as itself
        ("_t1_r2", "_t1_r2"),
        ("plain", "plain"),
    ],
)
def test_strip_lineage(key: str, stripped: str) -> None:
    assert strip_lineage(key) == stripped


def test_rid_key() -> None:
    assert rid_key("chat-42_t7_r2") == "chat-42"
    assert rid_key(None) is None
    assert rid_key("") is None
    assert rid_key("r" * 129) is None


def test_affinity_key_is_a_stable_digest_of_the_first_identity_header() -> None:
    bearer = {"Authorization": "Bearer sk-secret", "X-Forwarded-For": "10.1.1.1"}
    key = affinity_key(bearer)
    assert key is not None and "sk-secret" not in key
    assert key == affinity_key({"authorization": "Bearer sk-secret"})
    assert key != affinity_key({"x-forwarded-for": "10.1.1.1"})
    assert affinity_key({"cookie": "a=1"}) is not None
    assert affinity_key({"x-smg-routing-key": "k", "authorization": ""}) is None


def test_the_routing_text_of_a_huge_prompt_is_its_bounded_prefix() -> None:
    from smg.routing.policies.keys import ROUTING_TEXT_MAX_CHARS

    part = "abcdefghi " * (ROUTING_TEXT_MAX_CHARS // 40)  # four parts together pass the bound
    request = _request(system=part, messages=[{"role": "user", "content": [_text(part), _text(part)]}] * 2)
    whole = " ".join([part] * 5)
    text = routing_text(request)
    assert len(whole) > ROUTING_TEXT_MAX_CHARS
    assert text == whole[:ROUTING_TEXT_MAX_CHARS]


def test_a_prompt_at_the_routing_bound_is_routed_whole() -> None:
    from smg.routing.policies.keys import ROUTING_TEXT_MAX_CHARS

    half = "x" * (ROUTING_TEXT_MAX_CHARS // 2)
    request = _request(system=half, messages=[{"role": "user", "content": half[1:]}])
    assert routing_text(request) == f"{half} {half[1:]}"
    assert len(routing_text(request)) == ROUTING_TEXT_MAX_CHARS
