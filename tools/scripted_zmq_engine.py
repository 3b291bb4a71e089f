"""A scripted vLLM EngineCore on its real ZMQ wire, answering as a test says.

It does what `vllm serve --headless` does on the wire: a DEALER (identity: its engine index,
2 bytes little-endian) dials the gateway's handshake address and says `HELLO`, takes the
data-plane addresses from the answer, says `READY`, registers on the input socket with an
`EngineCoreReadyResponse` map, connects a PUSH to the output socket, then serves ADD and
ABORT frames with `EngineCoreOutputs` arrays (msgpack, trailing default fields left off as
msgspec's `omit_defaults` does). Like EngineCore it has no tokenizer and trusts its frontend:
it stops only at the request's `_eos_token_id`, a `stop_token_ids` hit (named in
`stop_reason`) or `max_tokens`; stop strings mean nothing to it; a prompt longer than its
`--max-model-len` or an id outside the vocabulary kills it (`ENGINE_CORE_DEAD`, then exit),
as it kills vLLM. An ABORT is recorded and stops the request's outputs, never acknowledged.

Tests steer it with the scripted gRPC engine's control service (`tools.engine_control`) on
`--control-port`: `Script`, `Received` (every ADD as a dict: the `EngineCoreRequest` fields by
name, `fields`, the array's length, and `frames`, the ADD's frames after its type; `mm_features`
decoded as EngineCore decodes them, each tensor's numbers read from its inline data or its
frame, an undecodable one killing the engine as it kills vLLM), `Aborts`, `Release`, `Reset`, and `Die` (send
`ENGINE_CORE_DEAD` and exit). Scripts are the gRPC engine's (`text`/`token_ids`, `eos`,
`chunk_size`, `delay_ms`, `hold_after`, `when_prompt_contains`, `repeat`); `error` means the
engine dies once `after_tokens` tokens were sent (`ENGINE_CORE_DEAD`, then exit); `exit_after`
that the process ends at once after that many tokens, without a word (its sockets vanish);
`finish_reason` (`stop`, `length`, `abort`, `error`) what the last output says. `error` is how
vLLM fails a request it cannot run: as EngineCore, this engine fails that way a request whose
`structured_outputs` names no `_backend` (EngineCore builds no backend of its own; vLLM's
frontend always names one). When the script's tokens run out before any stop, the generation
ends as `length` (a real engine would go on to `max_tokens`).

With ``--runtime tokenspeed`` it speaks TokenSpeed's messages on the same transport instead: a
tagged `TokenizedGenerateReqInput` in (recorded with its fields by name, the nested sampling
array as sent), tagged `BatchTokenIDOutSlim` columns out, finish reasons as strings, a matched
stop token trimmed from the ids but counted; it stops at its own model's EOS.

Run: ``python -m tools.scripted_zmq_engine --path PATH --model-path DIR --control-port P
[--handshake-address tcp://H:P] [--max-model-len N] [--engine-index I] [--runtime vllm|tokenspeed]``. It prints a line
starting with ``scripted zmq engine ready`` once its control service serves, and one starting
with ``scripted zmq engine registered`` once the gateway took it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import msgpack
import zmq
import zmq.asyncio

from smg.backends.zmq.addresses import zmq_addresses
from tools.scripted_engine import CONTROL_SERVICE, DEFAULT_TEXT, Script, ScriptError, exit_now

READY_LINE = "scripted zmq engine ready"
REGISTERED_LINE = "scripted zmq engine registered"
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
REQUEST_FIELDS = (
    "request_id",
    "prompt_token_ids",
    "mm_features",
    "sampling_params",
    "pooling_params",
    "arrival_time",
    "lora_request",
    "cache_salt",
    "data_parallel_rank",
)
TOKENSPEED_REQUEST = "TokenizedGenerateReqInput"
TOKENSPEED_OUTPUT = "BatchTokenIDOutSlim"
TOKENSPEED_FIELDS = (
    "tag",
    "request_id",
    "http_worker_ipc",
    "input_text",
    "prompt_token_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "stream",
)
STOP, LENGTH = 0, 1
FINISH_CODES = {"stop": STOP, "length": LENGTH, "abort": 2, "error": 3}  # vLLM's FinishReason


def _pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def _tensor(value: Any, frames: list[bytes]) -> dict[str, Any]:
    """A `[dtype, shape, data]` tensor of vLLM's msgpack encoding, its data inline (ext type 3)
    or the index of its frame, as numbers (bfloat16 widened to float32)."""
    import numpy as np

    dtype, shape, data = value
    if isinstance(data, msgpack.ExtType):
        if data.code != 3:
            raise ValueError(f"a tensor's inline data is ext type 3, not {data.code}")
        raw = data.data
    elif isinstance(data, int) and 0 < data < len(frames):
        raw = frames[data]
    else:
        raise ValueError(f"a tensor names frame {data!r} of {len(frames)}")
    if dtype == "bfloat16":
        array = (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).view("<f4")
    else:
        array = np.frombuffer(raw, dtype={"float32": "<f4", "float16": "<f2", "int64": "<i8", "bool": "?"}[dtype])
    return {"dtype": dtype, "shape": list(shape), "values": array.reshape(shape).tolist()}


def _features(raw: Any, frames: list[bytes]) -> list[dict[str, Any]] | None:
    """`mm_features` as the engine decoded them: every tensor's numbers, every field."""
    if raw is None:
        return None
    out = []
    for feature in raw:
        position = dict(feature["mm_position"])
        if position.get("is_embed") is not None:
            position["is_embed"] = _tensor(position["is_embed"], frames)["values"]
        elems = (feature["data"] or {}).items()
        data = {key: {**_tensor(elem["data"], frames), "field": elem["field"]} for key, elem in elems}
        out.append({**feature, "mm_position": position, "data": data})
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class _Running:
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class ZmqEngine:
    index: int
    max_model_len: int
    vocab_size: int
    tokenizer: Any
    eos_token_id: int | None
    scripts: deque[Script] = field(default_factory=deque)
    default: Script | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    running: dict[str, _Running] = field(default_factory=dict)
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    runtime: str = "vllm"  # or "tokenspeed": its native messages on the same transport
    push: zmq.asyncio.Socket | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)  # tokens generated per request (TokenSpeed's counts)
    prompts: dict[str, int] = field(default_factory=dict)

    @property
    def identity(self) -> bytes:
        return self.index.to_bytes(2, "little")

    # -- control ----------------------------------------------------------------------------

    def release(self) -> None:
        self.released.set()
        self.released = asyncio.Event()

    async def control(self, method: str, body: bytes) -> dict[str, Any]:
        payload = json.loads(body) if body else {}
        if not isinstance(payload, dict):
            raise ScriptError("the body must be a JSON object")
        if method == "Script":
            self.scripts.extend(Script.parse(s) for s in payload.get("scripts") or [])
            if payload.get("default") is not None:
                self.default = Script.parse(payload["default"])
            return {"queued": len(self.scripts)}
        if method == "Received":
            return {"requests": list(self.received)}
        if method == "Aborts":
            return {"request_ids": list(self.aborts)}
        if method == "Cancelled":
            return {"request_ids": []}
        if method == "Release":
            self.release()
            return {"released": True}
        if method == "Reset":
            self.scripts.clear()
            self.default = None
            self.received.clear()
            self.aborts.clear()
            self.release()
            return {"reset": True}
        if method == "Die":
            await self.die("told to die")
            return {"dying": True}
        raise ScriptError(f"unknown control method {method}")

    async def die(self, why: str) -> None:
        print(f"scripted zmq engine dies: {why}", flush=True)
        if self.push is not None:
            await self.push.send(ENGINE_CORE_DEAD)
        self.dead.set()

    # -- the engine -------------------------------------------------------------------------

    def ready_response(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "num_gpu_blocks": 512,
            "block_size": 16,
            "dp_stats_address": None,
            "dtype": "bfloat16",
            "vllm_version": "scripted",
            "world_size": 1,
            "data_parallel_size": 1,
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
            "decode_context_parallel_size": 1,
            "data_parallel_rank": self.index,
            "max_num_seqs": 128,
            "max_num_batched_tokens": 2048,
            "instance_id": f"scripted-{os.getpid()}",
            "supports_lora": False,
        }

    def stats(self) -> dict[str, Any]:
        return {"num_running_reqs": len(self.running), "num_waiting_reqs": 0, "kv_cache_usage": 0.0}

    async def send(self, outputs: list[list[Any]]) -> None:
        """vLLM's `EngineCoreOutput`s, sent as the runtime spells a batch."""
        assert self.push is not None
        if self.runtime != "tokenspeed":
            await self.push.send(_pack([self.index, outputs, self.stats(), time.monotonic()]))
            return
        columns: list[list[Any]] = [[] for _ in range(8)]
        for output in outputs:
            request_id, ids = output[0], list(output[1])
            finish = output[5] if len(output) > 5 else None
            count = self.counts.get(request_id, 0) + len(ids)
            self.counts[request_id] = count
            if finish == STOP:
                ids = ids[:-1]  # TokenSpeed trims the EOS or stop token it matched from the ids (still counted)
            reason = "" if finish is None else ("stop" if finish == STOP else "length")
            for column, value in zip(
                columns, (request_id, ids, reason, self.prompts.get(request_id, 0), count, 0, [], []), strict=True
            ):
                column.append(value)
            if finish is not None:
                self.counts.pop(request_id, None)
        await self.push.send(_pack([TOKENSPEED_OUTPUT, *columns, self.index, len(self.running), 0, 10, 1000]))

    def take_script(self, prompt_ids: list[int]) -> Script:
        decoded: list[str] = []

        def prompt() -> str:
            if not decoded:
                decoded.append(str(self.tokenizer.decode(prompt_ids, skip_special_tokens=False)))
            return decoded[0]

        for position, script in enumerate(self.scripts):
            if script.matches(prompt):
                if not script.repeat:
                    del self.scripts[position]
                return script
        return self.default or Script()

    async def add(self, frames: list[bytes]) -> None:
        fields = msgpack.unpackb(frames[0], raw=False, strict_map_key=False)
        if self.runtime == "tokenspeed":
            if fields[0] != TOKENSPEED_REQUEST:
                await self.die(f"not a {TOKENSPEED_REQUEST}: {fields[0]!r}")
                return
            record = {name: fields[i] for i, name in enumerate(TOKENSPEED_FIELDS) if i < len(fields)}
            record["fields"] = len(fields)
            self.received.append(record)
            request_id, prompt, native = fields[1], fields[4] or [], fields[5]
            # The engine knows its own EOS; max_new_tokens and stop_token_ids are positions 0 and 2.
            params = {"_eos_token_id": self.eos_token_id, "stop_token_ids": native[2] or [], "max_tokens": native[0]}
        else:
            record = {name: fields[i] for i, name in enumerate(REQUEST_FIELDS) if i < len(fields)}
            record["fields"] = len(fields)
            try:
                record["mm_features"] = _features(record.get("mm_features"), frames)
            except (ValueError, KeyError, TypeError) as exc:
                await self.die(f"undecodable mm_features: {exc}")  # EngineCore's decoder raises, and it dies
                return
            record["frames"] = len(frames)
            self.received.append(record)
            request_id = fields[0]
            prompt = fields[1] or []
            params = fields[3] or {}
        if len(prompt) > self.max_model_len:
            await self.die(f"a prompt of {len(prompt)} tokens does not fit max_model_len {self.max_model_len}")
            return
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            await self.die("a prompt token id is out of vocabulary")
            return
        structured = params.get("structured_outputs")
        if isinstance(structured, dict) and not structured.get("_backend"):
            print(f"scripted zmq engine: Unsupported structured output backend: None ({request_id})", flush=True)
            await self.send([[request_id, [], None, None, None, FINISH_CODES["error"]]])
            return
        script = self.take_script(prompt)
        self.prompts[request_id] = len(prompt)
        running = self.running[request_id] = _Running()
        task = asyncio.get_running_loop().create_task(self.generate(request_id, script, params, running))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def generate(self, request_id: str, script: Script, params: dict[str, Any], running: _Running) -> None:
        try:
            await self._generate(request_id, script, params, running)
        finally:
            self.running.pop(request_id, None)

    async def _generate(self, request_id: str, script: Script, params: dict[str, Any], running: _Running) -> None:
        if script.token_ids is not None:
            tokens = list(script.token_ids)
        else:
            text = script.text if script.text is not None else DEFAULT_TEXT
            tokens = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]
        if script.eos and self.eos_token_id is not None:
            tokens.append(self.eos_token_id)
        eos = params.get("_eos_token_id")
        stop_ids = set(params.get("stop_token_ids") or [])
        max_tokens = int(params.get("max_tokens", 16))
        sent = 0
        held = False
        while sent < len(tokens):
            if script.hold_after is not None and not held and sent >= script.hold_after:
                held = True
                await self._pause(running, self.released, None)
            if script.exit_after is not None and sent >= script.exit_after:
                exit_now(f"the script exits after {sent} tokens")
            if script.error is not None and sent >= script.error.after_tokens:
                await self.die(script.error.message)
                return
            if sent and script.delay:
                await self._pause(running, None, script.delay)
            if running.aborted.is_set():
                return  # an abort is never acknowledged
            group: list[int] = []
            finish: int | None = None
            stop_reason: int | None = None
            while sent < len(tokens) and len(group) < script.chunk_size:
                token = tokens[sent]
                group.append(token)
                sent += 1
                if token == eos:
                    finish = STOP
                elif token in stop_ids:
                    finish, stop_reason = STOP, token
                elif sent >= max_tokens:
                    finish = LENGTH
                if finish is not None:
                    break
            if finish is None and sent >= len(tokens):
                finish = LENGTH  # out of script: a real engine would go on to max_tokens
            if finish is None:
                await self.send([[request_id, group]])
                continue
            output: list[Any] = [request_id, group, None, None, None, self.finish_code(script, finish)]
            if stop_reason is not None:
                output.append(stop_reason)
            await self.send([output])
            return
        if script.exit_after is not None:
            exit_now(f"the script exits after {sent} tokens")
        await self.send([[request_id, [], None, None, None, self.finish_code(script, LENGTH)]])

    @staticmethod
    def finish_code(script: Script, finish: int) -> int:
        """The `FinishReason` the request ends with: the script's, when it names one."""
        return FINISH_CODES[script.finish_reason] if script.finish_reason in FINISH_CODES else finish

    @staticmethod
    async def _pause(running: _Running, until: asyncio.Event | None, seconds: float | None) -> None:
        waiters = [asyncio.ensure_future(running.aborted.wait())]
        if until is not None:
            waiters.append(asyncio.ensure_future(until.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def abort(self, payload: bytes) -> None:
        for request_id in msgpack.unpackb(payload, raw=False):
            self.aborts.append(request_id)
            running = self.running.get(request_id)
            if running is not None:
                running.aborted.set()


async def handshake(context: zmq.asyncio.Context, engine: ZmqEngine, address: str) -> tuple[str, str]:
    """HELLO, the gateway's INIT, READY: the data-plane addresses."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, engine.identity)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    await dealer.send(_pack({"status": "HELLO", "local": False, "headless": True}))
    init = msgpack.unpackb(await dealer.recv(), raw=False)
    await dealer.send(_pack({"status": "READY", "local": False, "headless": True}))
    dealer.close()
    addresses = init["addresses"]
    return addresses["inputs"][engine.index if len(addresses["inputs"]) > 1 else 0], addresses["outputs"][0]


async def serve_engine(context: zmq.asyncio.Context, engine: ZmqEngine, address: str) -> None:
    inputs_address, outputs_address = await handshake(context, engine, address)
    inputs = context.socket(zmq.DEALER)
    inputs.setsockopt(zmq.IDENTITY, engine.identity)
    inputs.setsockopt(zmq.LINGER, 0)
    inputs.connect(inputs_address)
    await inputs.send(_pack(engine.ready_response()))
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(outputs_address)
    engine.push = push
    print(f"{REGISTERED_LINE}: engine {engine.index}", flush=True)
    while True:
        frames = await inputs.recv_multipart()
        kind, payload = frames[0], frames[1] if len(frames) > 1 else b""
        if kind == b"\x00":
            await engine.add(frames[1:])
        elif kind == b"\x01":
            engine.abort(payload)


def control_server(engine: ZmqEngine, port: int) -> grpc.aio.Server:
    def method(name: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def handle(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                answer = await engine.control(name, body)
            except (ScriptError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return json.dumps(answer).encode()

        return handle

    names = ("Script", "Received", "Aborts", "Cancelled", "Release", "Reset", "Die")
    handlers = {name: grpc.unary_unary_rpc_method_handler(method(name)) for name in names}
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(CONTROL_SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    return server


async def main_async(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    model = Path(args.model_path)
    config = _read_json(model / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    eos = config.get("eos_token_id")
    engine = ZmqEngine(
        index=args.engine_index,
        max_model_len=args.max_model_len,
        vocab_size=int(config.get("vocab_size") or len(tokenizer)),
        tokenizer=tokenizer,
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        runtime=args.runtime,
    )
    address = args.handshake_address or zmq_addresses(f"ipc://{args.path}").handshake
    server = control_server(engine, args.control_port)
    try:
        await server.start()
    except RuntimeError as exc:
        print(f"cannot bind the control port {args.control_port}: address already in use ({exc})", flush=True)
        return 1
    context = zmq.asyncio.Context()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    print(f"{READY_LINE}: dialling {address}, control 127.0.0.1:{args.control_port}", flush=True)
    serving = loop.create_task(serve_engine(context, engine, address))
    died = loop.create_task(engine.dead.wait())
    stop = loop.create_task(stopping.wait())
    await asyncio.wait([serving, died, stop], return_when=asyncio.FIRST_COMPLETED)
    for task in (serving, died, stop, *engine.tasks):
        task.cancel()
    await asyncio.gather(serving, died, stop, *engine.tasks, return_exceptions=True)
    await server.stop(grace=0.2)
    context.destroy(linger=500)
    return 1 if engine.dead.is_set() else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.scripted_zmq_engine", description=__doc__)
    parser.add_argument("--path", required=True, help="the worker's ipc path (its URL without ipc://)")
    parser.add_argument("--model-path", required=True, help="a tokenizer directory with config.json")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--handshake-address", default=None)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument("--runtime", choices=("vllm", "tokenspeed"), default="vllm")
    sys.exit(asyncio.run(main_async(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
