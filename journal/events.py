"""The events a request is made of, as small data classes registered by their `kind`.

A request's life is the ordered sequence `received`, `validated` | `rejected`, `routed`,
(`rendered`, `tokens`…) | (`upstream`…) | (MCP loop: `mcp_connect`…, `stream_opened`?, then
per round `model_call`, `model_result`, `mcp_call`/`mcp_result`…), `block`…, `error`?,
`completed`. Each event is plain
data: `to_dict()` gives the JSON-ready payload that the journal stores and `event_from_dict`
rebuilds the event from it. Timing (`t`, seconds since the request arrived) is stamped by
whoever emits the event.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

_REGISTRY: dict[str, type[Event]] = {}
E = TypeVar("E", bound="Event")


@dataclass(slots=True)
class Event:
    kind: ClassVar[str] = ""
    t: float = field(default=0.0, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """The payload without `t` (stored in its own column)."""
        names = _PAYLOAD_FIELDS.get(type(self))
        if names is None:  # `fields()` is slow, and this runs for every event journaled
            names = _PAYLOAD_FIELDS[type(self)] = tuple(
                f.name for f in fields(self) if f.name != "t" and f.metadata.get("stored", True)
            )
        return {name: getattr(self, name) for name in names}


_PAYLOAD_FIELDS: dict[type[Event], tuple[str, ...]] = {}
_NOT_STORED = {"stored": False}  # a field the journal reads on its way but never stores


def _register(cls: type[E]) -> type[E]:
    _REGISTRY[cls.kind] = cls
    return cls


def event_from_dict(kind: str, data: dict[str, Any], t: float = 0.0) -> Event:
    """Rebuild an event from its stored kind and payload; unknown keys are ignored."""
    cls = _REGISTRY[kind]
    names = {f.name for f in fields(cls) if f.metadata.get("stored", True)}
    return cls(**{k: v for k, v in data.items() if k in names}, t=t)


def event_kinds() -> list[str]:
    return sorted(_REGISTRY)


@_register
@dataclass(slots=True)
class Received(Event):
    """The request arrived. Headers are redacted before this event is built.

    `request_id` is the gateway's own id for the request (the journal's key);
    `client_request_id` the id the client sent, which the gateway echoes (None: it sent none,
    or one that cannot go back in a header, and was given `request_id`). Events written
    before the split hold the echoed id in `request_id` and no `client_request_id`.
    """

    kind: ClassVar[str] = "received"
    method: str
    path: str
    request_id: str = ""
    client_request_id: str | None = None
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    client: str | None = None
    tenant: str | None = None
    ts: float = 0.0  # wall clock (epoch seconds)
    trace_id: str | None = None  # W3C trace id (32 hex): the gateway's span's, else the client's traceparent's

    @property
    def echoed_id(self) -> str:
        """The id the client was given (`x-request-id`, the envelope's `request_id`)."""
        return self.client_request_id or self.request_id


@_register
@dataclass(slots=True)
class Validated(Event):
    """The body parsed and passed every rule.

    `parsed_body`: the body as validation parsed it, when it was large (never stored): the
    journal's search index reads it instead of parsing the stored body once more.
    """

    kind: ClassVar[str] = "validated"
    model: str
    stream: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    parsed_body: Any = field(default=None, repr=False, compare=False, metadata=_NOT_STORED)


@_register
@dataclass(slots=True)
class Rejected(Event):
    """The body, or the request around it, was refused before routing."""

    kind: ClassVar[str] = "rejected"
    status: int
    error_type: str
    message: str
    code: str | None = None


@_register
@dataclass(slots=True)
class Routed(Event):
    """A backend and a worker were chosen."""

    kind: ClassVar[str] = "routed"
    backend: str
    worker: str | None
    model: str
    policy: str | None = None
    attempt: int = 1
    candidates: list[str] | None = None  # the workers the policy chose among
    reason: str | None = None  # why the policy chose this one


@_register
@dataclass(slots=True)
class Rendered(Event):
    """gRPC/ZMQ only: the prompt that was sent to the engine."""

    kind: ClassVar[str] = "rendered"
    prompt_tokens: int
    prompt_digest: str
    stop_ids: list[int] = field(default_factory=list)
    constraint: dict[str, Any] | None = None
    # What recomputing the response from the `tokens` events needs: the tokenizer's source and
    # the generation settings (message id, stops, eos ids, …) exactly as the gateway used them.
    tokenizer: str | None = None
    settings: dict[str, Any] | None = None


@_register
@dataclass(slots=True)
class Tokens(Event):
    """gRPC/ZMQ only: one engine chunk."""

    kind: ClassVar[str] = "tokens"
    ids: list[int]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


@_register
@dataclass(slots=True)
class Counted(Event):
    """gRPC/ZMQ `count_tokens`: the gateway's own answer."""

    kind: ClassVar[str] = "counted"
    input_tokens: int


@_register
@dataclass(slots=True)
class Upstream(Event):
    """Relay backends: one part of the upstream response.

    `part` is `head` (status and headers), `chunk` (a piece of a streamed body, as it
    arrived) or `body` (a whole buffered body, as the client gets it). When the gateway
    re-serializes a success body (the Anthropic backend does), the upstream's own bytes come
    first as an `original` part, which only the journal keeps: projections ignore it, as they
    ignore a prefill/decode deployment's prefill leg (`prefill:head`, `prefill:body`). Text is
    stored as text; bytes that are not UTF-8 are stored base64-encoded with
    `encoding="base64"`. Never stored: `parsed`, a `body` part's JSON as the gateway already
    parsed it (for its usage), which the journal's search index reads instead of parsing `data`
    again; `raw`, the bytes as they arrived, which `payload` hands on instead of encoding `data`.
    """

    kind: ClassVar[str] = "upstream"
    part: str
    status: int | None = None
    headers: dict[str, str] | None = None
    data: str | None = None
    encoding: str = "utf-8"
    worker: str | None = None
    parsed: Any = field(default=None, repr=False, compare=False, metadata=_NOT_STORED)
    raw: bytes | None = field(default=None, repr=False, compare=False, metadata=_NOT_STORED)

    def payload(self) -> bytes:
        """The exact bytes this part stands for."""
        if self.raw is not None:
            return self.raw
        from journal.pieces import piece_bytes

        return piece_bytes(self.data, self.encoding) if self.data else b""


@_register
@dataclass(slots=True)
class StreamOpened(Event):
    """The gateway started its own SSE response before it had any content to send.

    The MCP tool loop does this before its first model call, so that even a failure of that
    call reaches the client as an SSE `error` event (behaviors.md I.5).
    """

    kind: ClassVar[str] = "stream_opened"


@_register
@dataclass(slots=True)
class Block(Event):
    """One Anthropic stream event (`message_start`, `content_block_*`, `message_delta`,
    `message_stop`) as its JSON payload."""

    kind: ClassVar[str] = "block"
    event: dict[str, Any]


# --- the MCP tool loop (Anthropic backend, `X-SMG-MCP: enabled`) -----------------------------
# Its rounds are journaled as they happen; the client-visible output is `block` events.
# No secret is ever stored: server URLs lose their userinfo and tokens never appear.


@_register
@dataclass(slots=True)
class McpConnect(Event):
    """One `mcp_servers` entry: connected (with the tools it lists) or not (with why)."""

    kind: ClassVar[str] = "mcp_connect"
    server: str
    url: str
    ok: bool
    tools: list[str] = field(default_factory=list)
    error: str | None = None
    duration_ms: float = 0.0


@_register
@dataclass(slots=True)
class ModelCall(Event):
    """The loop calls the model (round `round`, 1-based). The first call carries the whole
    rewritten request (`request`); later ones only the messages appended since (`added`)."""

    kind: ClassVar[str] = "model_call"
    round: int
    stream: bool = False
    tools: list[str] = field(default_factory=list)
    request: dict[str, Any] | None = None
    added: list[dict[str, Any]] = field(default_factory=list)


@_register
@dataclass(slots=True)
class ModelResult(Event):
    """The model's answer to round `round`: status, outcome, and the upstream's bytes as
    received (`data`: the JSON body, or the SSE text of a stream)."""

    kind: ClassVar[str] = "model_result"
    round: int
    status: int
    duration_ms: float = 0.0
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_uses: list[str] = field(default_factory=list)
    data: str | None = None
    encoding: str = "utf-8"


@_register
@dataclass(slots=True)
class McpCall(Event):
    """The loop runs one tool call of round `round` (`allowed` is the policy's decision)."""

    kind: ClassVar[str] = "mcp_call"
    round: int
    server: str | None
    tool: str
    id: str
    input: Any = None
    allowed: bool = True


@_register
@dataclass(slots=True)
class McpResult(Event):
    """What a tool call gave back: its text (as sent to the model) and whether it failed."""

    kind: ClassVar[str] = "mcp_result"
    round: int
    server: str | None
    tool: str
    id: str
    is_error: bool = False
    content: str = ""
    duration_ms: float = 0.0


@_register
@dataclass(slots=True)
class Error(Event):
    """A failure at some stage; what the client was told."""

    kind: ClassVar[str] = "error"
    stage: str
    status: int
    error_type: str
    message: str
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)  # response headers it carried
    detail: str | None = None  # for operators, not sent to the client: e.g. the engine's own words and address


@_register
@dataclass(slots=True)
class Completed(Event):
    """The response finished (or the client went away: `disconnected`)."""

    kind: ClassVar[str] = "completed"
    status: int
    duration_ms: float
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    bytes_sent: int = 0
    disconnected: bool = False


# --- admission (concurrency slots, tenant token budgets) -------------------------------------


@_register
@dataclass(slots=True)
class Admission(Event):
    """An admission gate's decision on the request.

    `gate` is `concurrency` (a slot of `--max-concurrent-requests`; `queued_ms` is the time the
    request waited for it) or `tenant_rate_limit` (the tenant's token budget; `reserved_tokens`
    is what was debited, the rendered prompt's tokens; when a scope is stated in money,
    `prompt_usd` is the prompt at the model's input price: debited when admitted, what did
    not fit when denied; None in journals from before money budgets). `decision`: `admitted`, `queue_full`,
    `queue_timeout`, `denied` or `unavailable` (the shared budgets or fleet-wide slots in Redis
    could not be read);
    a refusal is followed by the `error` the client got.
    """

    kind: ClassVar[str] = "admission"
    gate: str
    decision: str
    queued_ms: float = 0.0
    tenant: str | None = None
    reserved_tokens: int | None = None
    retry_after: int | None = None
    prompt_usd: float | None = None


@_register
@dataclass(slots=True)
class Settled(Event):
    """A tenant budget reservation trued up with the response's real usage: `delta` tokens
    more (or, negative, fewer) than `reserved_tokens` were charged. A response that did not
    finish (an error, a client gone) keeps its reservation and has no `settled` event.

    When a scope is stated in money: `reserved_usd` was debited at admission, `cost_usd` is the
    request's cost by the price table, and `delta_usd` (their difference) was charged on top.
    None when no scope is stated in money, and in journals from before money budgets."""

    kind: ClassVar[str] = "settled"
    tenant: str
    reserved_tokens: int
    input_tokens: int
    output_tokens: int
    delta: int
    reserved_usd: float | None = None
    cost_usd: float | None = None
    delta_usd: float | None = None
