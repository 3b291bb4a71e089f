"""Request bodies and small helpers shared by the protocol tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_count_tokens, parse_create_message
from smg.protocol.request import CountTokensRequest, CreateMessageRequest

BASE: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}


def body(**fields: Any) -> dict[str, Any]:
    """A minimal valid `/v1/messages` body with `fields` replaced or added."""
    out = copy.deepcopy(BASE)
    out.update(copy.deepcopy(fields))
    return out


def accepted(data: dict[str, Any], *, beta: str | None = None) -> CreateMessageRequest:
    return parse_create_message(data, anthropic_beta=beta)


def refused(data: object, *, beta: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_create_message(data, anthropic_beta=beta)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    assert not info.value.minted
    return info.value


def count_accepted(data: dict[str, Any]) -> CountTokensRequest:
    return parse_count_tokens(data)


def count_refused(data: object) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_count_tokens(data)
    assert info.value.status == 400
    return info.value


def tool_use(id: str, name: str = "get_weather") -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": {"city": "Paris"}}


def tool_result(id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id, "content": "sunny"}


def custom_tool(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": "d",
        "input_schema": {"type": "object", "properties": {}},
        **extra,
    }


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def system(content: Any) -> dict[str, Any]:
    return {"role": "system", "content": content}
