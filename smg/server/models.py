"""`GET /v1/models` and `GET /v1/models/{id}`: the models the gateway serves, aliases included,
in Anthropic's list shape when the request carries `anthropic-version`, OpenAI's otherwise.

In front of the Anthropic API the list is the API's own answer to the caller's credentials
(what Claude Code's gateway model discovery reads); beside self-hosted models (IGW) the API's
models are listed after them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.backends.anthropic import AnthropicConnector
from smg.backends.base import ModelCard
from smg.protocol.errors import ApiError, envelope
from smg.routing.pools import ANTHROPIC
from smg.server.state import Gateway

_CREATED_AT = "1970-01-01T00:00:00Z"


def _cards(gateway: Gateway) -> list[ModelCard]:
    cards = {c.id: c for c in gateway.router.models()}
    for alias, canonical in gateway.config.model_aliases.items():
        if canonical in cards and alias not in cards:
            target = cards[canonical]
            cards[alias] = ModelCard(id=alias, owned_by=target.owned_by, context_window=target.context_window)
    return sorted(cards.values(), key=lambda c: c.id)


def _anthropic(card: ModelCard) -> dict[str, object]:
    return {"type": "model", "id": card.id, "display_name": card.id, "created_at": _CREATED_AT}


def _openai(card: ModelCard) -> dict[str, object]:
    entry: dict[str, object] = {"id": card.id, "object": "model", "created": 0, "owned_by": card.owned_by}
    if card.context_window:
        entry["max_model_len"] = card.context_window
    return entry


async def _upstream(
    gateway: Gateway, headers: Mapping[str, str], query: str, model_id: str | None = None
) -> tuple[int, bytes] | None:
    """The Anthropic API's own answer, when an Anthropic worker is registered."""
    worker = gateway.router.provider_worker("anthropic")
    connector = gateway.router.connector(ANTHROPIC)
    if worker is None or not isinstance(connector, AnthropicConnector):
        return None
    return await connector.list_models(worker, headers, query, model_id)


def _local_list(cards: list[ModelCard], anthropic: bool, extra: list[Any] | None = None) -> HTTPResponse:
    if anthropic:
        data = [_anthropic(c) for c in cards] + (extra or [])
        return json_response(
            {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )
    return json_response({"object": "list", "data": [_openai(c) for c in cards] + (extra or [])})


async def list_models(gateway: Gateway, headers: Mapping[str, str], query: str = "") -> HTTPResponse:
    cards = _cards(gateway)
    anthropic = "anthropic-version" in headers
    try:
        upstream = await _upstream(gateway, headers, query)
    except ApiError:
        if not cards:
            raise  # the API could not be reached: the caller is told so
        upstream = None  # IGW: the self-hosted models are still worth listing
    if upstream is None:
        return _local_list(cards, anthropic)
    status, body = upstream
    if not cards:
        return HTTPResponse(body, status=status, content_type="application/json")
    try:
        listed = orjson.loads(body).get("data") if status == 200 else None
    except (orjson.JSONDecodeError, AttributeError):
        listed = None
    local = {c.id for c in cards}
    extra = [m for m in listed if isinstance(m, dict) and m.get("id") not in local] if isinstance(listed, list) else []
    return _local_list(cards, anthropic, extra)


async def retrieve_model(gateway: Gateway, headers: Mapping[str, str], model_id: str, request_id: str) -> HTTPResponse:
    card = next((c for c in _cards(gateway) if c.id == model_id), None)
    anthropic = "anthropic-version" in headers
    if card is None:
        upstream = await _upstream(gateway, headers, "", model_id)
        if upstream is not None:
            status, body = upstream
            return HTTPResponse(body, status=status, content_type="application/json")
        message = f"model: {model_id}"
        if anthropic:
            body = orjson.dumps(envelope("not_found_error", message, request_id))
        else:
            body = orjson.dumps({"error": {"type": "not_found_error", "message": message}})
        return HTTPResponse(body, status=404, content_type="application/json")
    return json_response(_anthropic(card) if anthropic else _openai(card))
