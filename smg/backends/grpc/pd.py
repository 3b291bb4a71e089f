"""gRPC prefill/decode deployments: one generation served by a pair of engines, and EPD pools.

It composes the gRPC connector's parts: its engines (`EngineWorkers`), the way to the first
engine call (`Front`, around the pure `smg.pipeline.prepare`: the refusals, the rendered
prompt, count_tokens and `max_tokens: 0` answered by the gateway, the prompt checked against the
smallest window of the pool), and its engine calls, the decode leg read through the same
generation session (`smg.pipeline.session`) as a single engine's. Each attempt is a pair chosen by the
router (`PairLease`); the prompt must fit both legs' context windows, and both legs speak the
same runtime:

- SGLang and TokenSpeed: both legs get the same request with the same rendezvous — the prefill
  worker's host, its bootstrap port (8998 unless `--prefill URL PORT` gives one) and a random
  room (SGLang's field is 32 bits: [0, 2^31); TokenSpeed's 63) — SGLang's `disaggregated_params`,
  TokenSpeed's `kv_bootstrap_info`. Both calls start at once; the prefill stream is drained until
  its `complete`, then the decode stream is the answer, read as a single engine's.
- vLLM: sequential. The prefill leg asks for one token, not streamed, tagged for the prefill
  engine's KV connector (NIXL: `do_remote_decode`; Mooncake: a transfer id the gateway mints);
  after its `complete`, the decode leg carries the KV params the prefill returned (Mooncake:
  synthesized from the prefill worker's bootstrap address and engine id).

Under `--dp-aware` each leg is a rank of its engine (`url@rank`) and carries its own rank as the
engine's `data_parallel_rank`, as the reference's gRPC router sends it (no proto has a field for
the prefill's rank on the decode leg; a Mooncake decode leg names the prefill core's engine id,
`{id}_dp{rank}`).

Both legs share one engine request id per dispatch, `<message id>-<uuid>`. A prefill leg that
fails ends the request with `Prefill stream error: …` and the status its failure maps to; an
unreachable leg lets the router try another pair. A decode leg dropped before its first answer
(the prefill failed, the client left) is aborted once that answer comes, at most 30 s later, as
the reference does: tearing a decode down mid-handoff of the KV can crash or leak the engine.
The prefill leg is journaled once it is over as an `upstream` part `prefill:complete`
(projections and the summary's first-event time ignore it), so the recorded `tokens` are the
decode leg's alone and offline replay reads them as any gRPC record.

EPD (`--epd-disaggregation`, TokenSpeed): encode workers join the pool and are health-checked.
A request with images has them fetched and preprocessed by the gateway (`smg.pipeline.media`,
`smg.pipeline.vision`), its placeholders expanded; each image then goes to an encode worker (the
encode policy's choice, keyed by the image's content hash) with `Encode`, under a room of its
own, before the pair starts: the prefill leg is told each item's encode worker and room
(`encode_bootstrap_info`) and fetches the embeddings from there; both legs carry the items'
metadata without their pixels. Each encode leg is journaled as a `prefill:encode` part (it feeds
the prefill, and the projections ignore every `prefill:` part); one that fails or declines ends
the request, 400 `multimodal_processing_failed` for a refusal, else the status its failure maps
to, before any prefill or decode call. A text-only request is served by the pair alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast
from urllib.parse import urlsplit

from journal.events import Event, Upstream
from smg.backends.base import Attempts, Call, Discovery, Failure, Lease, PairLease, Target
from smg.backends.grpc.backend import EngineConnector
from smg.backends.grpc.calls import settle
from smg.backends.grpc.discovery import EngineWorker
from smg.backends.grpc.engines.tokenspeed import TokenSpeedClient
from smg.backends.grpc.request import engine_call
from smg.backends.grpc.types import (
    Bootstrap,
    EncodeBootstrap,
    EngineDone,
    EngineError,
    EngineEvent,
    GenerateCall,
)
from smg.pipeline.engine import engine_failure, public_detail
from smg.pipeline.prepare import Prepared, check_window
from smg.pipeline.session import Session, error_event
from smg.pipeline.vision import VisionItem
from smg.protocol.errors import ApiError

log = logging.getLogger("smg.grpc.pd")

DEFAULT_BOOTSTRAP_PORT = 8998  # the reference gateway's, when a prefill worker names none
PARALLEL_RUNTIMES = frozenset({"sglang", "tokenspeed"})
SEQUENTIAL_RUNTIMES = frozenset({"vllm"})
# The room's range: SGLang's proto field is an int32, TokenSpeed's an int64 (63 random bits).
_ROOM_BITS = {"sglang": 31, "tokenspeed": 63}
DECODE_ABORT_WAIT = 30.0  # seconds a dropped decode leg's abort waits for its first answer
NIXL_PREFILL_PARAMS = '{"do_remote_decode":true,"do_remote_prefill":false}'


def runtime_not_supported(runtime: str) -> ApiError:
    return ApiError(
        400,
        f"This runtime does not support PD disaggregated mode ({runtime})",
        code="runtime_pd_not_supported",
    )


def prefill_failure(exc: EngineError) -> ApiError:
    """A prefill leg's failure, as the client is told it (the status its gRPC code maps to)."""
    status = engine_failure(exc, started=False).status
    return ApiError(
        status, f"Prefill stream error: {public_detail(exc)}", code="prefill_stream_error", detail=str(exc)
    )


def encode_failure(exc: EngineError) -> ApiError:
    """An encode leg's failure, as the client is told it."""
    if exc.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_ACCEPTED"):
        status = 400
    else:
        status = engine_failure(exc, started=False).status
    return ApiError(
        status, f"Encode error: {public_detail(exc)}", code="multimodal_processing_failed", detail=str(exc)
    )


def _encode_record(
    encoder: Target, request_id: str, image: VisionItem, bootstrap: EncodeBootstrap, err: ApiError | None
) -> Upstream:
    record: dict[str, Any] = {
        "request_id": request_id,
        "item_index": bootstrap.item_index,
        "content_hash": image.content_hash.hex(),
        "bootstrap": {"host": bootstrap.host, "port": bootstrap.port, "room": bootstrap.room},
        "accepted": err is None,
    }
    if err is not None:
        record["error"] = err.message
    return Upstream(
        part="prefill:encode",
        status=err.status if err is not None else 200,
        worker=encoder.url,
        data=json.dumps(record, separators=(",", ":")),
    )


def encode_bootstrap_for(encoder: Target, item_index: int) -> EncodeBootstrap:
    """Where the prefill fetches one item's embedding: the encode worker's bootstrap server
    (8998 unless `--encode URL PORT` gives one) and a random 63-bit room."""
    host = urlsplit(encoder.url).hostname or ""
    port = encoder.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    return EncodeBootstrap(item_index=item_index, host=host, port=port, room=secrets.randbits(63))


def bootstrap_for(prefill: Target, runtime: str) -> Bootstrap:
    """The rendezvous both legs of one dispatch are given."""
    host = urlsplit(prefill.url).hostname or ""
    port = prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    return Bootstrap(host=host, port=port, room=secrets.randbits(_ROOM_BITS[runtime]))


@dataclass(frozen=True)
class KvConnector:
    """What a vLLM prefill engine's `GetServerInfo` says of its KV connector."""

    name: str = ""  # "NixlConnector", "MooncakeConnector", "" (none configured)
    engine_id: str = ""

    @classmethod
    def of(cls, server_info: dict[str, Any]) -> KvConnector:
        name, engine_id = server_info.get("kv_connector"), server_info.get("kv_engine_id")
        return cls(name=str(name or ""), engine_id=str(engine_id or ""))


def engine_id_of(connector: KvConnector, prefill: Target) -> str:
    """The KV engine id of the core serving the prefill leg: with data parallelism each core
    suffixes the configured id with its rank (`{id}_dp{rank}`), so a rank-pinned prefill names
    its own core's."""
    if prefill.dp_rank is None:
        return connector.engine_id
    return f"{connector.engine_id}_dp{prefill.dp_rank}"


def vllm_legs(call: GenerateCall, connector: KvConnector, prefill: Target) -> tuple[GenerateCall, str | None]:
    """The vLLM prefill leg's call, and the decode leg's KV params when the gateway makes
    them itself (Mooncake; otherwise they are what the prefill returns)."""
    leg = replace(call, max_tokens=1, stream=False, dp_rank=prefill.dp_rank)
    if connector.name == "NixlConnector":
        return replace(leg, kv_transfer_params=NIXL_PREFILL_PARAMS), None
    if connector.name == "MooncakeConnector" and connector.engine_id:
        transfer = f"xfer-{uuid.uuid4()}"
        host = urlsplit(prefill.url).hostname or ""
        port = prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
        prefill_params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer}
        decode_params = {
            "do_remote_decode": False,
            "do_remote_prefill": True,
            "transfer_id": transfer,
            "remote_engine_id": engine_id_of(connector, prefill),
            "remote_bootstrap_addr": f"http://{host}:{port}",
        }
        return replace(leg, kv_transfer_params=json.dumps(prefill_params)), json.dumps(decode_params)
    return leg, None


async def drain(engine: EngineWorker, call: GenerateCall) -> EngineDone:
    """A prefill leg, read until its `complete`."""
    stream = engine.client.generate(call)
    try:
        async for item in stream:
            if isinstance(item, EngineDone):
                return item
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise EngineError("INTERNAL", "the prefill stream ended without completing")


async def _resumed(first: asyncio.Future[EngineEvent], rest: AsyncIterator[EngineEvent]) -> AsyncIterator[EngineEvent]:
    """A stream whose first item was asked for already (so its call started with the other leg's)."""
    try:
        yield await first
        async for item in rest:
            yield item
    finally:
        await _close_started(first, rest)


async def _close_started(first: asyncio.Future[EngineEvent], rest: AsyncIterator[EngineEvent]) -> None:
    if not first.done():
        first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await rest.aclose()  # type: ignore[attr-defined]


def _prefill_record(prefill: Target, call: GenerateCall, done: EngineDone | None, err: ApiError | None) -> Upstream:
    record: dict[str, Any] = {"request_id": call.request_id}
    if call.bootstrap is not None:
        record["bootstrap"] = {"host": call.bootstrap.host, "port": call.bootstrap.port, "room": call.bootstrap.room}
    if call.kv_transfer_params is not None:
        record["kv_transfer_params_sent"] = call.kv_transfer_params
    if call.encode_bootstrap:
        record["encode_bootstrap"] = [
            {"item_index": b.item_index, "host": b.host, "port": b.port, "room": b.room} for b in call.encode_bootstrap
        ]
    if done is not None:
        record.update(
            finish_reason=done.finish_reason,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
        )
        if done.kv_transfer_params is not None:
            record["kv_transfer_params"] = done.kv_transfer_params
    if err is not None:
        record["error"] = err.message
    return Upstream(
        part="prefill:complete",
        status=err.status if err is not None else 200,
        worker=prefill.url,
        data=json.dumps(record, separators=(",", ":")),
    )


class GrpcPdConnector:
    """Prefill/decode pairs of gRPC engines (SGLang, TokenSpeed, vLLM), and EPD pools."""

    generates = True

    def __init__(self, grpc: EngineConnector, roles: tuple[str, ...] = ("prefill", "decode")) -> None:
        # The journal's backend name, the pool's (`smg.routing.pools`): `grpc-pd`, `grpc-epd`.
        self.name = "grpc-epd" if "encode" in roles else "grpc-pd"
        # The parts of the gRPC connector, shared with it: its engines and tokenizers, the way
        # to the first engine call, and the engine calls with their aborts.
        self._workers, self._front, self._calls = grpc.workers, grpc.front, grpc.calls
        self._roles = roles  # the roles that must each have a healthy worker (EPD: encode too)
        self._kv_connectors: dict[str, KvConnector] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    # lifecycle and workers: the engines are the gRPC connector's

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        # The gRPC connector owns the engines and closes them; the legs being retired end now.
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    async def discover(self, target: Target) -> Discovery:
        return await self._workers.discover(target)

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        return await self._workers.check_health(target, timeout)

    async def forget(self, target: Target) -> None:
        self._kv_connectors.pop(target.id, None)
        await self._workers.forget(target)

    async def load(self, target: Target) -> int | None:
        return await self._workers.load(target)

    def kv_tokens(self, target: Target) -> int | None:
        return self._workers.kv_tokens(target)

    def ready(self, targets: Sequence[Target]) -> bool:
        """Every role has a healthy worker, as the reference's readiness asks of a PD or EPD
        deployment, and their models have tokenizers."""
        roles = {t.role for t in targets if t.models}
        return all(role in roles for role in self._roles) and self._workers.ready(targets)

    # requests

    async def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        taken = await self._front.take(call, pool, multimodal="encode" in self._roles, backend=self.name)
        if not isinstance(taken, Prepared):
            for event in taken:
                yield event
            return
        async for event in self._generate(taken, attempts):
            yield event

    async def _generate(self, prepared: Prepared, attempts: Attempts) -> AsyncGenerator[Event, None]:
        workers, calls = self._workers, self._calls
        session: Session | None = None
        async for lease in attempts:
            pair = cast(PairLease, lease)
            prefill, decode = pair.prefill.target, pair.target
            prefill_engine = await workers.engine(prefill)
            decode_engine = await workers.engine(decode)
            runtime = decode_engine.runtime
            if prefill_engine.runtime != runtime:
                raise ApiError(
                    400,
                    f"The prefill worker speaks {prefill_engine.runtime} and the decode worker {runtime}: a pair "
                    "must share one runtime",
                    code="runtime_pd_mismatch",
                )
            if runtime not in PARALLEL_RUNTIMES | SEQUENTIAL_RUNTIMES:
                raise runtime_not_supported(runtime)
            check_window(prepared, prefill.context_windows.get(prepared.model))
            check_window(prepared, decode.context_windows.get(prepared.model))
            request_id = f"{prepared.message_id}-{uuid.uuid4()}"
            # Sampling defaults are the decode worker's: it produces the visible tokens.
            decode_call = engine_call(
                prepared,
                runtime=runtime,
                defaults=decode_engine.sampling_defaults,
                request_id=request_id,
                dp_rank=decode.dp_rank,
            )
            encoders: list[tuple[Lease, EngineWorker, EncodeBootstrap]] = []
            if prepared.images:
                if runtime != "tokenspeed":
                    raise ApiError(
                        400, f"EPD encode is not implemented for the {runtime} runtime", code="multimodal_not_supported"
                    )
                for index, image in enumerate(prepared.images):
                    lease = pair.encoder(image.content_hash.hex())
                    yield lease.routed
                    engine = await workers.engine(lease.target)
                    encoders.append((lease, engine, encode_bootstrap_for(lease.target, index)))
            yield pair.prefill.routed
            yield pair.routed
            if session is None:
                eos = decode_engine.info.eos_token_ids if decode_engine.info else []
                session, rendered = Session.start(prepared, eos, decode_call.stop_token_ids)
                yield rendered
            else:
                session.attempt()
            if encoders:
                outcomes = await self._encode(prepared.images, encoders, request_id)
                for record, _ in outcomes:
                    yield record
                failure = next((err for _, err in outcomes if err is not None), None)
                if failure is not None:
                    yield error_event(failure, stage="encode")
                    return
                # The pixels went to the encode workers; the legs keep the items' metadata.
                decode_call = replace(decode_call, send_pixels=False)
            if runtime in PARALLEL_RUNTIMES:
                decode_call = replace(decode_call, bootstrap=bootstrap_for(prefill, runtime))
                prefill_call = replace(
                    decode_call, encode_bootstrap=[b for _, _, b in encoders], dp_rank=prefill.dp_rank
                )
            else:
                connector = await self._kv_connector(prefill, prefill_engine)
                prefill_call, decode_params = vllm_legs(decode_call, connector, prefill)
                if decode_params is not None:
                    decode_call = replace(decode_call, kv_transfer_params=decode_params)

            decode_stream: AsyncIterator[EngineEvent] | None = None
            first: asyncio.Future[EngineEvent] | None = None
            prefill_task = asyncio.ensure_future(drain(prefill_engine, prefill_call))
            if runtime in PARALLEL_RUNTIMES:
                # Both calls start now: the two engines meet in the room before either answers.
                decode_stream = decode_engine.client.generate(decode_call)
                first = asyncio.ensure_future(anext(decode_stream))
            try:
                prefill_done = await prefill_task
            except EngineError as exc:
                if first is not None and decode_stream is not None:
                    self._retire(decode_engine, request_id, first, decode_stream)
                err = prefill_failure(exc)
                yield _prefill_record(prefill, prefill_call, None, err)
                if exc.unavailable:
                    log.warning("prefill worker %s unreachable (%s)", prefill.url, exc.message)
                    pair.prefill.failed(Failure("unavailable", err))
                    continue
                pair.prefill.answered(err.status)
                yield error_event(err, stage="prefill")
                return
            except BaseException:
                # The client went away (or the gateway stops) while the prefill ran.
                prefill_task.cancel()
                await asyncio.gather(prefill_task, return_exceptions=True)
                calls.abort(prefill_engine.client, request_id)
                if first is not None and decode_stream is not None:
                    self._retire(decode_engine, request_id, first, decode_stream)
                raise
            pair.prefill.answered(200)
            # Journaled before the answer: the client may have it (and be gone) once it is complete.
            yield _prefill_record(prefill, prefill_call, prefill_done, None)
            if runtime in SEQUENTIAL_RUNTIMES and decode_call.kv_transfer_params is None:
                if prefill_done.kv_transfer_params is not None:
                    decode_call = replace(decode_call, kv_transfer_params=prefill_done.kv_transfer_params)
                else:
                    log.info("vLLM prefill %s returned no KV params: decode recomputes the prompt", prefill.url)
            stream = _resumed(first, decode_stream) if first is not None and decode_stream is not None else None
            async for event in calls.drive(decode_engine.client, decode_call, session, stream):
                yield event
            if not settle(pair, session, role="decode worker"):
                return

    async def _encode(
        self,
        images: list[VisionItem],
        encoders: list[tuple[Lease, EngineWorker, EncodeBootstrap]],
        request_id: str,
    ) -> list[tuple[Upstream, ApiError | None]]:
        """Every image to its encode worker at once: each one's `prefill:encode` part, in order,
        and its failure."""

        async def one(engine: EngineWorker, image: VisionItem, bootstrap: EncodeBootstrap) -> None:
            client = engine.client
            if not isinstance(client, TokenSpeedClient):
                raise EngineError("FAILED_PRECONDITION", f"an encode worker speaks TokenSpeed, not {engine.runtime}")
            await client.encode(f"{request_id}-encode-{bootstrap.item_index}", image, bootstrap.room)

        results = await asyncio.gather(
            *(one(engine, image, b) for image, (_, engine, b) in zip(images, encoders, strict=True)),
            return_exceptions=True,
        )
        outcomes: list[tuple[Upstream, ApiError | None]] = []
        for image, (lease, _, bootstrap), result in zip(images, encoders, results, strict=True):
            err: ApiError | None = None
            if isinstance(result, EngineError):
                err = encode_failure(result)
                if result.unavailable:
                    log.warning("encode worker %s unreachable (%s)", lease.target.url, result.message)
                    lease.failed(Failure("unavailable", err, retryable=False))
                else:
                    lease.answered(err.status)
            elif isinstance(result, BaseException):
                raise result
            else:
                lease.answered(200)
            record = _encode_record(lease.target, f"{request_id}-encode-{bootstrap.item_index}", image, bootstrap, err)
            outcomes.append((record, err))
        return outcomes

    def _retire(
        self,
        engine: EngineWorker,
        request_id: str,
        first: asyncio.Future[EngineEvent],
        rest: AsyncIterator[EngineEvent],
    ) -> None:
        """Stop a decode leg no one will read. Its abort waits for its first answer (at most
        `DECODE_ABORT_WAIT`): a decode engine torn down mid-handoff of the prefill's KV can
        crash or leak, as the reference gateway notes; the first answer proves the handoff over."""

        async def retire() -> None:
            try:
                await asyncio.wait_for(asyncio.shield(first), DECODE_ABORT_WAIT)
            except asyncio.CancelledError:
                await _close_started(first, rest)  # the gateway stops: the call is cancelled
                raise
            except Exception:
                pass  # the leg failed or never answered: abort it all the same
            await _close_started(first, rest)
            self._calls.abort(engine.client, request_id)

        task = asyncio.get_running_loop().create_task(retire(), name=f"smg-retire-{request_id}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _kv_connector(self, prefill: Target, engine: EngineWorker) -> KvConnector:
        known = self._kv_connectors.get(prefill.id)
        if known is None:
            try:
                known = KvConnector.of(await engine.client.server_info())
            except EngineError as exc:
                log.info("vLLM prefill %s: server info not read (%s); no KV connector assumed", prefill.url, exc)
                known = KvConnector()
            self._kv_connectors[prefill.id] = known
        return known
