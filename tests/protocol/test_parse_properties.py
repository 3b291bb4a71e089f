"""Property: whatever JSON value arrives, parsing either succeeds or raises a 400 `ApiError`."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_count_tokens, parse_create_message

from .test_tolerance import EVERY_BLOCK, claude_code_body

KEYS = st.sampled_from(
    [
        "model",
        "messages",
        "max_tokens",
        "role",
        "content",
        "type",
        "text",
        "tools",
        "name",
        "input_schema",
        "tool_choice",
        "thinking",
        "budget_tokens",
        "tool_use_id",
        "id",
        "input",
        "source",
        "system",
        "mcp_servers",
        "mcp_server_name",
        "configs",
        "default_config",
        "enabled",
    ]
) | st.text(max_size=8)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(
        ["text", "tool_use", "tool_result", "mcp_toolset", "custom", "object", "user", "assistant", "system", "auto"]
    )
)

JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


def _seed_bodies() -> list[dict[str, Any]]:
    rich = claude_code_body()
    blocks = copy.deepcopy(rich)
    blocks["messages"].append({"role": "user", "content": [b for k, b in EVERY_BLOCK.items() if k != "tool_result"]})
    return [rich, blocks, {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}]


SEEDS = _seed_bodies()


def _assert_parses_or_refuses(data: object) -> None:
    for parse in (
        lambda d: parse_create_message(d, anthropic_beta="interleaved-thinking-2025-05-14"),
        parse_count_tokens,
    ):
        try:
            parse(data)
        except ApiError as error:
            assert error.status == 400
            assert error.type == "invalid_request_error"
            assert isinstance(error.message, str) and error.message
            assert isinstance(error.code, str) and error.code


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_arbitrary_json_values(data: object) -> None:
    _assert_parses_or_refuses(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON.filter(lambda v: isinstance(v, dict)) | st.dictionaries(KEYS, JSON, max_size=8))
def test_arbitrary_objects(data: object) -> None:
    _assert_parses_or_refuses(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_bodies(data: st.DataObject) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(SEEDS)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(body)
        path = data.draw(st.sampled_from(paths))
        if not path:
            continue
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(JSON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(KEYS)] = data.draw(JSON)
        else:
            parent.append(data.draw(JSON))
    _assert_parses_or_refuses(body)


def test_seed_bodies_are_valid() -> None:
    for seed in SEEDS:
        parse_create_message(seed, anthropic_beta="interleaved-thinking-2025-05-14")


def test_deeply_nested_document_sources_are_refused_or_parsed() -> None:
    block: dict[str, Any] = {"type": "text", "text": "x"}
    for _ in range(400):
        block = {"type": "document", "source": {"type": "content", "content": [block]}}
    _assert_parses_or_refuses({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [block]}]})
