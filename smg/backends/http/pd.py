"""HTTP prefill/decode: one Messages request dispatched to a prefill and a decode worker at once.

Both legs get the same body: the client's request (canonical model id) plus SGLang's bootstrap
fields — `bootstrap_host` (the prefill worker's host), `bootstrap_port` (its bootstrap port, or
null), `bootstrap_room` (a random 63-bit integer shared by the two legs); under `--dp-aware`,
`routed_dp_rank` (each leg's rank) and, on decode, `disagg_prefill_dp_rank` (the prefill's),
as the reference adds them for rank-pinned workers. The client gets the
decode leg's answer, streamed or not, relayed as it arrives. The prefill leg's answer is
journaled first, as `prefill:head`/`prefill:body` parts (the projections ignore them); when the prefill
leg fails, its status and error are the client's answer. count_tokens goes to one prefill
worker, without bootstrap fields, like any relayed request.

A pair whose prefill worker is vLLM (its model list is `owned_by: vllm`) is served sequentially,
as vLLM's disaggregation has no rendezvous: the prefill leg is sent alone, sanitized for the KV
handoff (`stream: false`, `stream_options` and `min_tokens` removed, `n` 1, `max_tokens: 1`) and
tagged with NIXL's `kv_transfer_params` (`do_remote_decode`); once it answers, the decode leg gets
the client's request with the `kv_transfer_params` the prefill returned (none: the decode
recomputes the prompt). Neither leg has bootstrap fields. A request with `n` > 1 skips the prefill
leg, as the reference does: the single-consumer handoff cannot serve its fan-out.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

from journal.events import Event, Upstream
from journal.pieces import text_piece
from smg.backends.base import Attempts, Call, Discovery, Failure, FailureKind, PairLease, Target
from smg.backends.http.headers import forwarded_request_headers, relayed_response_headers, with_worker_key
from smg.backends.http.relay import HttpConnector, relay_body
from smg.backends.upstream import BodyTooLarge, read_capped
from smg.config import GatewayConfig
from smg.protocol import codec
from smg.protocol.errors import ApiError, describe_exception, describe_upstream_failure

_MESSAGES = "/v1/messages"
_ROOM_BITS = 63
NIXL_PREFILL_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False}

log = logging.getLogger("smg.pd")


def bootstrap_bodies(call: Call, prefill: Target, decode: Target, room: int) -> tuple[bytes, bytes]:
    """The bodies the prefill and the decode leg receive: the same request and rendezvous, and
    under `--dp-aware` each leg's rank — `routed_dp_rank` (its own), and for decode
    `disagg_prefill_dp_rank` (the prefill's: where its KV comes from)."""
    body = codec.loads(relay_body(call))
    body["bootstrap_host"] = urlsplit(prefill.url).hostname
    body["bootstrap_port"] = prefill.bootstrap_port
    body["bootstrap_room"] = room
    if prefill.dp_rank is None and decode.dp_rank is None:
        shared = codec.dumps(body)
        return shared, shared
    prefill_body, decode_body = dict(body), body
    if prefill.dp_rank is not None:
        prefill_body["routed_dp_rank"] = prefill.dp_rank
        decode_body["disagg_prefill_dp_rank"] = prefill.dp_rank
    if decode.dp_rank is not None:
        decode_body["routed_dp_rank"] = decode.dp_rank
    return codec.dumps(prefill_body), codec.dumps(decode_body)


def vllm_prefill_body(body: dict[str, Any]) -> bytes:
    """A vLLM prefill leg: the request sanitized for the KV handoff, tagged for the connector."""
    leg = dict(body)
    leg["stream"] = False
    leg.pop("stream_options", None)
    if "n" in leg:
        leg["n"] = 1
    leg.pop("min_tokens", None)
    leg["max_tokens"] = 1
    leg["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)
    return codec.dumps(leg)


def returned_kv_params(raw: bytes) -> Any:
    """The `kv_transfer_params` a vLLM prefill leg answered with, if any."""
    try:
        answer = codec.loads(raw)
    except ValueError:
        return None
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    return params if isinstance(params, dict) else None


def _transport_failure(exc: httpx.HTTPError, leg: str, url: str) -> Failure:
    if isinstance(exc, httpx.TimeoutException):
        log.warning("%s leg %s: %s", leg, url, describe_exception(exc))
        error = ApiError(504, f"{leg} leg: {describe_upstream_failure(exc)}", code="call_upstream_timeout")
        return Failure("timeout", error)
    kind: FailureKind = "refused" if isinstance(exc, httpx.ConnectError) else "transport"
    log.warning("%s leg %s: %s", leg, url, describe_exception(exc))
    message = f"Transport error: {leg} leg: {describe_upstream_failure(exc)}"
    return Failure(kind, ApiError(502, message, code="pd_disaggregation_request_failed"))


class HttpPdConnector:
    """Prefill/decode pairs of HTTP workers (SGLang's disaggregation over its HTTP API)."""

    name = "http-pd"
    generates = False

    def __init__(self, config: GatewayConfig, relay: HttpConnector | None = None) -> None:
        self._config = config
        self._relay = relay or HttpConnector(config)

    async def start(self) -> None:
        await self._relay.start()

    async def close(self) -> None:
        await self._relay.close()

    async def discover(self, target: Target) -> Discovery:
        return await self._relay.discover(target)

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        return await self._relay.check_health(target, timeout, endpoint)

    async def load(self, target: Target) -> int | None:
        return None

    async def forget(self, target: Target) -> None:
        await self._relay.forget(target)

    def ready(self, targets: Sequence[Target]) -> bool:
        return any(t.models for t in targets)

    def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        if call.endpoint == "count_tokens":
            return self._relay.handle(call, pool, attempts)
        return self._dispatch(call, attempts)

    async def _dispatch(self, call: Call, attempts: Attempts) -> AsyncGenerator[Event, None]:
        if getattr(call.request, "max_tokens", None) == 0:
            raise ApiError(
                400,
                "max_tokens: 0 cannot be relayed to an HTTP worker: the gateway renders no prompt "
                "on this backend, so it cannot build the empty message",
                code="max_tokens_zero_not_relayed",
            )
        client = self._relay.client
        forwarded = forwarded_request_headers(call.headers, self._config.api_key, self._config.instance_id)
        async for lease in attempts:
            pair = cast(PairLease, lease)
            prefill, decode = pair.prefill.target, pair.target
            if prefill.runtime == "vllm":
                unreachable: list[str] = []
                async for event in self._sequential(call, pair, client, forwarded, unreachable):
                    yield event
                if unreachable:
                    continue
                return
            yield pair.prefill.routed
            yield pair.routed
            prefill_body, decode_body = bootstrap_bodies(call, prefill, decode, secrets.randbits(_ROOM_BITS))
            legs = {
                "prefill": asyncio.ensure_future(self._send(client, prefill, prefill_body, forwarded)),
                "decode": asyncio.ensure_future(self._send(client, decode, decode_body, forwarded)),
            }
            await asyncio.wait(legs.values(), return_when=asyncio.ALL_COMPLETED)
            failed = next((leg for leg, task in legs.items() if task.exception() is not None), None)
            if failed is not None:
                for task in legs.values():
                    if task.exception() is None:
                        await task.result().aclose()
                exc = cast(httpx.HTTPError, legs[failed].exception())
                target = prefill if failed == "prefill" else decode
                failure = _transport_failure(exc, failed, target.url)
                (pair.prefill if failed == "prefill" else pair).failed(failure)
                continue
            prefill_response, decode_response = legs["prefill"].result(), legs["decode"].result()
            prefill_status = prefill_response.status_code
            pair.prefill.answered(prefill_status)
            if prefill_status >= 400:
                # The prefill leg's error is the answer: the decode leg cannot have produced one.
                await decode_response.aclose()
                pair.answered(prefill_status)
                async for event in self._prefill_error(prefill, prefill_response):
                    yield event
                return
            pair.answered(decode_response.status_code)
            # The prefill leg ends before the decode leg's first token (the decode waits for its KV),
            # so reading it first delays nothing, and its record is journaled before the answer
            # leaves (a client that has its answer may hang up before anything after it is written).
            try:
                raw = await self._read(prefill_response)
            except BaseException:
                await decode_response.aclose()
                raise
            yield Upstream(
                part="prefill:head",
                status=prefill_status,
                headers=relayed_response_headers(prefill_response.headers.multi_items()),
                worker=prefill.url,
            )
            data, encoding = text_piece(raw)
            yield Upstream(part="prefill:body", data=data, encoding=encoding)
            async for event in self._relay.relay_response(call, decode, decode_response):
                yield event
            return

    async def _sequential(
        self,
        call: Call,
        pair: PairLease,
        client: httpx.AsyncClient,
        forwarded: dict[str, str],
        unreachable: list[str],
    ) -> AsyncGenerator[Event, None]:
        """One vLLM attempt: the prefill leg, then the decode leg with the KV params it returned.
        A transport failure marks the lease that failed and names its leg in `unreachable` (the
        caller tries the next pair)."""
        prefill, decode = pair.prefill.target, pair.target
        body = codec.loads(relay_body(call))
        fan_out = isinstance(body.get("n"), int) and body["n"] > 1
        if not fan_out:
            yield pair.prefill.routed
            try:
                response = await self._send(client, prefill, vllm_prefill_body(body), forwarded)
            except httpx.HTTPError as exc:
                pair.prefill.failed(_transport_failure(exc, "prefill", prefill.url))
                unreachable.append("prefill")
                return
            status = response.status_code
            pair.prefill.answered(status)
            if status >= 400:
                pair.answered(status)
                async for event in self._prefill_error(prefill, response):
                    yield event
                return
            raw = await self._read(response)
            yield Upstream(
                part="prefill:head",
                status=status,
                headers=relayed_response_headers(response.headers.multi_items()),
                worker=prefill.url,
            )
            data, encoding = text_piece(raw)
            yield Upstream(part="prefill:body", data=data, encoding=encoding)
            params = returned_kv_params(raw)
            if params is not None:
                body["kv_transfer_params"] = params
            else:
                log.info("vLLM prefill %s returned no kv_transfer_params: decode recomputes the prompt", prefill.url)
        yield pair.routed
        try:
            decode_response = await self._send(client, decode, codec.dumps(body), forwarded)
        except httpx.HTTPError as exc:
            pair.failed(_transport_failure(exc, "decode", decode.url))
            unreachable.append("decode")
            return
        pair.answered(decode_response.status_code)
        async for event in self._relay.relay_response(call, decode, decode_response):
            yield event

    async def _send(
        self, client: httpx.AsyncClient, target: Target, body: bytes, forwarded: dict[str, str]
    ) -> httpx.Response:
        url = target.url + _MESSAGES
        headers = with_worker_key(forwarded, target.api_key)
        return await client.send(client.build_request("POST", url, content=body, headers=headers), stream=True)

    async def _read(self, response: httpx.Response) -> bytes:
        try:
            return await read_capped(response, self._config.max_payload_size)
        except (httpx.HTTPError, BodyTooLarge) as exc:
            return f"(prefill answer not read: {describe_upstream_failure(exc)})".encode()
        finally:
            await response.aclose()

    async def _prefill_error(self, prefill: Target, response: httpx.Response) -> AsyncGenerator[Event, None]:
        head = relayed_response_headers(response.headers.multi_items())
        yield Upstream(part="head", status=response.status_code, headers=head, worker=prefill.url)
        data, encoding = text_piece(await self._read(response))
        yield Upstream(part="body", data=data, encoding=encoding)
