"""From a decoded JSON body to a validated request, or one 400 `ApiError`.

The first pydantic error becomes the message `"<dotted location>: <reason>"` with a machine
code; the cross-field rules of `smg.protocol.validation` run on what parsed. Whatever the
input, nothing but `ApiError` leaves these functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from smg.protocol.content import HIDDEN_TAGS
from smg.protocol.errors import ApiError, invalid_request
from smg.protocol.request import CountTokensRequest, CreateMessageRequest
from smg.protocol.validation import validate_count_tokens, validate_create_message

_M = TypeVar("_M", bound=BaseModel)

_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})

# Public-API rule codes for built-in pydantic errors at known places: (type, location regex).
_CODES_BY_PLACE: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("string_too_long", re.compile(r"tools\.\d+\.custom\.name"), "tool_name_too_long"),
    ("string_pattern_mismatch", re.compile(r"tools\.\d+\.custom\.name"), "invalid_tool_name"),
    ("literal_error", re.compile(r"tools\.\d+\.custom\.input_schema\.type"), "invalid_input_schema_type"),
    ("extra_forbidden", re.compile(r"tools\.\d+\.custom\.[^.]+"), "unknown_tool_field"),
    ("greater_than_equal", re.compile(r"thinking\.enabled\.budget_tokens"), "thinking_budget_too_small"),
)


def parse_create_message(data: object, *, anthropic_beta: str | None = None) -> CreateMessageRequest:
    """Validate a `POST /v1/messages` body; `anthropic_beta` is the request's header value."""
    req = _validate(CreateMessageRequest, data)
    _guard(lambda: validate_create_message(req, anthropic_beta=anthropic_beta))
    return req


def parse_count_tokens(data: object) -> CountTokensRequest:
    """Validate a `POST /v1/messages/count_tokens` body."""
    req = _validate(CountTokensRequest, data)
    _guard(lambda: validate_count_tokens(req))
    return req


def _validate(model: type[_M], data: object) -> _M:
    if not isinstance(data, dict):
        raise invalid_request("request body must be a JSON object", "invalid_body_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    except (ValueError, TypeError, RecursionError) as exc:
        # Last resort: a body pydantic cannot even walk (absurdly deep nesting, …).
        raise invalid_request(f"Invalid request body: {type(exc).__name__}", "invalid_body") from None


def _guard(check: Callable[[], None]) -> None:
    try:
        check()
    except ApiError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise invalid_request(f"Invalid request body: {type(exc).__name__}", "invalid_body") from None


def _from_validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    if not errors:
        return invalid_request("Invalid request body", "invalid_body")
    first = errors[0]
    location = ".".join(str(part) for part in first["loc"] if part not in HIDDEN_TAGS)
    message = f"{location}: {first['msg']}" if location else first["msg"]
    return invalid_request(message, _code(first["type"], location))


def _code(error_type: str, location: str) -> str:
    for kind, place, code in _CODES_BY_PLACE:
        if error_type == kind and place.fullmatch(location):
            return code
    if error_type == "missing":
        return "missing_field"
    if error_type in _RANGE_ERRORS:
        return "value_out_of_range"
    return error_type
