"""What a Messages request is routed on: its routing text and its routing keys.

The routing text is the system prompt and the messages' text blocks joined by single spaces
(empty strings skipped, images, tool blocks and everything else left out), cut at
`ROUTING_TEXT_MAX_CHARS`: the string the cache-aware and prefix-hash policies match on. The
routing key is the first configured header (`x-smg-routing-key` by default) carrying a non-empty
value of at most 128 UTF-8 bytes; a value over the cap is ignored, never an error. Sticky sessions
strip a key's trailing `_r<n>` retry and `_t<n>` turn suffixes, so every turn of a conversation
shares one key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence

from smg.protocol.content import TextBlock
from smg.protocol.request import CountTokensRequest, CreateMessageRequest

ROUTING_KEY_MAX_BYTES = 128
ROUTING_TEXT_MAX_CHARS = 1 << 20
"""How much of a prompt's text the text policies route on. A prefix of a million characters
(a quarter of a million tokens or so) has long decided which worker holds the prompt's cache;
matching and recording megabytes past it would only cost the event loop a pass over the whole
prompt per request, and the prefix tree a copy of it."""
# Stable client identity `consistent_hashing` falls back to when no routing key is sent, in order.
AFFINITY_HEADERS: tuple[str, ...] = ("authorization", "x-forwarded-for", "cookie")


def routing_text(request: CreateMessageRequest | CountTokensRequest) -> str:
    """System text, then each message's text, joined by single spaces, cut at
    `ROUTING_TEXT_MAX_CHARS`."""
    parts: list[str] = []
    left = ROUTING_TEXT_MAX_CHARS + 1  # each part but the first costs its separator too
    for part in _text_parts(request):
        if not part:
            continue
        if len(part) >= left:
            parts.append(part[: left - 1])
            break
        parts.append(part)
        left -= len(part) + 1
    return " ".join(parts)


def _text_parts(request: CreateMessageRequest | CountTokensRequest) -> Iterator[str]:
    system = request.system
    if isinstance(system, str):
        yield system
    elif system is not None:
        yield from (block.text for block in system)
    for message in request.messages:
        content = message.content
        if isinstance(content, str):
            yield content
        else:
            yield from (block.text for block in content if isinstance(block, TextBlock))


def _lower(headers: Mapping[str, str]) -> Mapping[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _valid_key(value: str | None) -> str | None:
    if not value:
        return None
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    return value if size <= ROUTING_KEY_MAX_BYTES else None


def routing_key(headers: Mapping[str, str], header_names: Sequence[str], *, strip: bool = False) -> str | None:
    """The first of `header_names` present with a valid value; lineage suffixes stripped if `strip`.

    `strip` is for the routing-key override (sticky sessions), where the reference strips header
    keys as it strips request ids; without it the key is used as sent.
    """
    lowered = _lower(headers)
    for name in header_names:
        key = _valid_key(lowered.get(name.lower()))
        if key is not None:
            return strip_lineage(key) if strip else key
    return None


def _strip_tag(key: str, tag: str) -> str:
    head, sep, tail = key.rpartition("_")
    if not sep or not tail.startswith(tag):
        return key
    digits = tail[1:]
    return head if digits and digits.isascii() and digits.isdigit() else key


def strip_lineage(key: str) -> str:
    """`conv_t2_r1` -> `conv`: one trailing retry suffix, then one turn suffix; a key that is
    nothing but a suffix stays itself."""
    stripped = _strip_tag(_strip_tag(key, "r"), "t")
    return stripped or key


def rid_key(rid: str | None) -> str | None:
    """The sticky key a request's `rid` names: lineage-stripped, within the routing-key cap."""
    if not rid:
        return None
    return _valid_key(strip_lineage(rid))


def affinity_key(headers: Mapping[str, str]) -> str | None:
    """A digest of the first stable client header present (authorization, x-forwarded-for,
    cookie), so a credential is never held in clear by the router."""
    lowered = _lower(headers)
    for name in AFFINITY_HEADERS:
        value = lowered.get(name)
        if value:
            return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return None
