"""`GET /v1/models` and `GET /v1/models/{id}`: the models the gateway serves, aliases included,
in Anthropic's list shape when the request carries `anthropic-version`, OpenAI's otherwise."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.backends.base import ModelCard
from smg.protocol.errors import envelope
from smg.server.state import Gateway

_CREATED_AT = "1970-01-01T00:00:00Z"


def _cards(gateway: Gateway) -> list[ModelCard]:
    cards = {c.id: c for c in gateway.backend.models()}
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


def list_models(gateway: Gateway, headers: Mapping[str, str]) -> HTTPResponse:
    cards = _cards(gateway)
    if "anthropic-version" in headers:
        data = [_anthropic(c) for c in cards]
        return json_response(
            {
                "data": data,
                "has_more": False,
                "first_id": cards[0].id if cards else None,
                "last_id": cards[-1].id if cards else None,
            }
        )
    return json_response({"object": "list", "data": [_openai(c) for c in cards]})


def retrieve_model(gateway: Gateway, headers: Mapping[str, str], model_id: str, request_id: str) -> HTTPResponse:
    card = next((c for c in _cards(gateway) if c.id == model_id), None)
    anthropic = "anthropic-version" in headers
    if card is None:
        message = f"model: {model_id}"
        if anthropic:
            body = orjson.dumps(envelope("not_found_error", message, request_id))
        else:
            body = orjson.dumps({"error": {"type": "not_found_error", "message": message}})
        return HTTPResponse(body, status=404, content_type="application/json")
    return json_response(_anthropic(card) if anthropic else _openai(card))
