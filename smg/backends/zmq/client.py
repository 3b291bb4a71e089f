"""A vLLM (or TokenSpeed) engine over ZMQ as an `EngineClient`, so the engine pipeline serves it as it serves gRPC.

EngineCore has no tokenizer and no model metadata service, so what gRPC's `GetModelInfo`
answers comes from elsewhere: the model id is the gateway's `--model-path` string (the
reference gateway's choice; `--model-alias` gives it another name), the context window is
the engines' `max_model_len` from their ready responses, the EOS ids and vocabulary size
from the model directory's `config.json` / `generation_config.json` (the connector adds the
tokenizer's EOS ids). The engine trusts its frontend (an over-long prompt or an
out-of-vocabulary id kills it), so the connector checks the window and this client the
vocabulary before anything is sent. Stop strings are never sent: the gateway matches them.
A prompt's images go as the ADD's `mm_features`, their tensors in frames after it (`features`).
Outputs are per-step deltas whatever `stream` says; a streamed or not, the pipeline sees
`EngineChunk`s with running totals and one `EngineDone`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from smg.backends.grpc.types import (
    EngineChunk,
    EngineDone,
    EngineError,
    EngineEvent,
    EngineInfo,
    EngineLoad,
    GenerateCall,
)
from smg.backends.zmq import features, tokenspeed, wire
from smg.backends.zmq.addresses import DEFAULT_IPC_DIRS, zmq_addresses
from smg.backends.zmq.transport import Transport

log = logging.getLogger("smg.zmq")

ZMQ_RUNTIMES = ("vllm", "tokenspeed")


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def model_dir_facts(model_path: str) -> tuple[list[int], int | None]:
    """The model's EOS ids (config.json's first, then generation_config.json's) and vocabulary
    size, when `model_path` is a local directory; else none known."""
    directory = Path(model_path)
    if not directory.is_dir():
        return [], None
    config = _json_file(directory / "config.json")
    generation = _json_file(directory / "generation_config.json")
    eos = list(dict.fromkeys([*_ids(config.get("eos_token_id")), *_ids(generation.get("eos_token_id"))]))
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int):
        vocab = (config.get("text_config") or {}).get("vocab_size")
    return eos, vocab if isinstance(vocab, int) and vocab > 0 else None


class ZmqEngineClient:
    """The engines of one `ipc://PATH` worker."""

    def __init__(
        self,
        url: str,
        *,
        model_id: str,
        runtime: str = "vllm",
        engine_count: int = 1,
        ipc_dirs: Sequence[str] = DEFAULT_IPC_DIRS,
    ) -> None:
        if runtime not in ZMQ_RUNTIMES:
            raise ValueError(f"ZMQ workers speak {', '.join(ZMQ_RUNTIMES)}, not {runtime!r}")
        self.runtime = runtime
        self.target = url
        self.model_id = model_id
        decode = tokenspeed.outputs if runtime == "tokenspeed" else wire.outputs
        self.transport = Transport(zmq_addresses(url), engine_count, decode, ipc_dirs)
        self.eos_token_ids, self.vocab_size = model_dir_facts(model_id)
        self._unfinished: dict[str, bytes] = {}  # closed before the engine finished: abort goes there

    def _serving(self) -> Transport:
        self.transport.start()
        if not self.transport.serving:
            raise EngineError("UNAVAILABLE", self.transport.waiting_reason())
        return self.transport

    async def health(self) -> bool:
        return self._serving().serving

    async def model_info(self) -> EngineInfo:
        transport = self._serving()
        return EngineInfo(
            model_id=self.model_id,
            model_path=self.model_id,
            max_context_length=transport.max_model_len,
            eos_token_ids=list(self.eos_token_ids),
            vocab_size=self.vocab_size,
        )

    async def server_info(self) -> dict[str, Any]:
        transport = self._serving()
        return {
            "engines": [
                {"index": e.index, **(e.ready.raw if e.ready else {})} for e in transport.engines.values() if e.ready
            ]
        }

    async def loads(self) -> EngineLoad | None:
        if not self.transport.serving:
            raise EngineError("UNAVAILABLE", self.transport.waiting_reason())
        found = self.transport.loads()
        if found is None:
            return None
        running, waiting, usage = found
        return EngineLoad(running_requests=running, waiting_requests=waiting, token_usage=usage,
                          dp_ranks=self.transport.engine_count)

    def _payload(self, call: GenerateCall, window: int | None, engine_dtype: str = "") -> tuple[bytes, list[bytes]]:
        """The ADD's payload and the aux frames its image tensors travel in."""
        if not call.input_ids:
            raise EngineError("INVALID_ARGUMENT", "The decoder prompt cannot be empty")
        if self.vocab_size is not None:
            bad = next((t for t in call.input_ids if t < 0 or t >= self.vocab_size), None)
            if bad is not None:
                raise EngineError("INVALID_ARGUMENT", f"Token id {bad} is out of vocabulary")
        if window is not None and len(call.input_ids) > window:
            raise EngineError(
                "INVALID_ARGUMENT",
                f"The decoder prompt (length {len(call.input_ids)}) is longer than the maximum model length of "
                f"{window}",
            )
        room = window - len(call.input_ids) if window is not None else None
        max_tokens = call.max_tokens if call.max_tokens is not None else room
        if room is not None and max_tokens is not None:
            max_tokens = min(max_tokens, room)
        if self.runtime == "tokenspeed":
            # TokenSpeed knows its EOS; it gets the stop ids and the constraint as its own fields.
            native = tokenspeed.sampling_params(
                max_tokens=max(1, max_tokens or 1),
                temperature=call.temperature,
                top_p=call.top_p,
                top_k=call.top_k,
                min_p=call.min_p,
                repetition_penalty=call.repetition_penalty,
                stop_token_ids=call.stop_token_ids,
                constraint=call.constraint,
            )
            if call.images:
                raise EngineError("INVALID_ARGUMENT", "TokenSpeed's ZMQ requests carry no images")
            return tokenspeed.add_request(call.request_id, call.input_ids, native), []
        params = wire.sampling_params(
            max_tokens=max(1, max_tokens or 1),
            temperature=call.temperature,
            top_p=call.top_p,
            top_k=call.top_k,
            min_p=call.min_p,
            repetition_penalty=call.repetition_penalty,
            stop_token_ids=call.stop_token_ids,
            eos_token_ids=list(dict.fromkeys([*self.eos_token_ids, *call.eos_token_ids])),
            structured=wire.structured_outputs(*call.constraint) if call.constraint is not None else None,
        )
        if not call.images:
            return wire.add_request(call.request_id, call.input_ids, params), []
        mm, aux = features.mm_features(call.input_ids, call.images, engine_dtype)
        return wire.add_request(call.request_id, call.input_ids, params, mm), aux

    async def generate(self, call: GenerateCall) -> AsyncIterator[EngineEvent]:
        transport = self._serving()
        if call.images:
            # Casting the pixels to the engine's dtype takes tens to hundreds of milliseconds an
            # image: not on the event loop, where every other stream would wait for it.
            payload, aux = await asyncio.to_thread(self._payload, call, transport.max_model_len, transport.engine_dtype)
        else:
            payload, aux = self._payload(call, transport.max_model_len, transport.engine_dtype)
        queue = await transport.submit(call.request_id, payload, aux)
        prompt = len(call.input_ids)
        total = 0
        ended = False  # the engine finished the request or failed it
        try:
            while True:
                item = await queue.get()
                if isinstance(item, EngineError):
                    ended = True
                    raise item
                if item.new_token_ids:
                    total += len(item.new_token_ids)
                # TokenSpeed counts a stop token it trimmed from the ids: trust its running total.
                total = max(total, item.completion_tokens or 0)
                if item.new_token_ids:
                    yield EngineChunk(token_ids=list(item.new_token_ids), prompt_tokens=prompt, completion_tokens=total)
                if item.finish_reason is not None:
                    ended = True
                    stop = item.stop_reason
                    yield EngineDone(
                        finish_reason=item.finish_reason,
                        prompt_tokens=prompt,
                        completion_tokens=total,
                        matched_token_id=stop if isinstance(stop, int) and not isinstance(stop, bool) else None,
                        matched_stop_str=stop if isinstance(stop, str) else None,
                    )
                    return
        finally:
            owner = transport.finish(call.request_id)
            if owner is not None:
                self._unfinished[call.request_id] = owner
            if not ended:
                # Closed by the gateway (a client gone, a stop string matched): the engine may have
                # finished meanwhile (its outputs are read ahead), else an ABORT follows.
                log.info(
                    "ZMQ worker %s: request %s closed after %d tokens; %s", self.transport.addresses.path,
                    call.request_id, total, "ABORT follows" if owner is not None else "the engine had finished it",
                )

    async def abort(self, request_id: str) -> None:
        """The engine does not confirm an abort: the request already ended for the gateway."""
        owner = self._unfinished.pop(request_id, None)
        if owner is not None:
            await self.transport.abort(owner, request_id)

    async def tokenizer_bundle(self) -> bytes:
        raise EngineError("UNIMPLEMENTED", "a ZMQ engine has no tokenizer to send (give --model-path)")

    async def close(self) -> None:
        await self.transport.close()

    def __repr__(self) -> str:
        return f"ZmqEngineClient({self.target!r})"
