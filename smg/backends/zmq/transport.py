"""The sockets of one ZMQ worker and the engines on them: handshake, registrations, outputs, deaths.

The gateway binds the input ROUTER, the output PULL and the handshake ROUTER, then keeps
answering the handshake for as long as it runs: an engine that dials in (`HELLO`) is sent the
data-plane addresses, says `READY` once its model is loaded, and registers on the input socket
with its ready response; from then on it takes requests. A restarted engine dials again and is
taken back the same way. An engine is dead when it says so (`ENGINE_CORE_DEAD` on the output
socket) or when its input connection goes away (a killed process): every request in flight on
the worker then ends with an `EngineError("UNAVAILABLE", …)` that says what happened, and the
worker is down until every engine has registered again. The PULL socket merges all engines'
outputs, so one engine's death takes the whole worker down, as in the reference gateway.

Outputs are routed to per-request queues by request id; an ABORT is not acknowledged by the
engine, so a request ends for the gateway when it stops reading, whatever the engine does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from smg.backends.grpc.types import EngineError
from smg.backends.zmq import wire
from smg.backends.zmq.addresses import DEFAULT_IPC_DIRS, ZmqAddresses, prepare_socket_dir

log = logging.getLogger("smg.zmq")


@dataclass
class EngineRank:
    """One engine (data-parallel rank) on the worker, by its 2-byte identity."""

    identity: bytes
    ready: wire.ReadyResponse | None = None  # its registration; None until it registers
    said_ready: bool = False
    in_flight: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def index(self) -> int:
        return int.from_bytes(self.identity, "little") if len(self.identity) == 2 else -1


Delivery = wire.Output | EngineError


class Transport:
    """The worker's three sockets and the engines registered on them."""

    def __init__(
        self,
        addresses: ZmqAddresses,
        engine_count: int = 1,
        decode: Callable[[bytes], wire.Outputs] = wire.outputs,
        ipc_dirs: Sequence[str] = DEFAULT_IPC_DIRS,
    ) -> None:
        if engine_count < 1:
            raise ValueError("a ZMQ worker has at least one engine")
        self.addresses = addresses
        self._ipc_dirs = tuple(ipc_dirs)  # where its sockets may be (--ipc-dir)
        self._decode = decode  # the engine protocol's output frames (vLLM's or TokenSpeed's)
        self.engine_count = engine_count
        self.engines: dict[bytes, EngineRank] = {}
        self.death: str | None = None  # why the worker is down, once an engine died
        self._requests: dict[str, asyncio.Queue[Delivery]] = {}
        self._owners: dict[str, bytes] = {}
        self._connections = 0  # live engine connections on the input socket
        self._context: zmq.asyncio.Context | None = None
        self._input: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the sockets and start answering the engines (in the running loop). Raises
        `EngineError("UNAVAILABLE")` when a socket cannot be bound."""
        if self._started:
            return
        try:
            prepare_socket_dir(self.addresses, self._ipc_dirs)
        except (ValueError, OSError) as exc:
            raise EngineError("UNAVAILABLE", str(exc)) from None
        context = zmq.asyncio.Context()
        try:
            inputs = context.socket(zmq.ROUTER)
            inputs.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone engine fails instead of vanishing
            inputs.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted engine reuses its identity
            inputs.setsockopt(zmq.LINGER, 0)
            inputs.bind(self.addresses.inputs)
            outputs = context.socket(zmq.PULL)
            outputs.setsockopt(zmq.LINGER, 0)
            outputs.bind(self.addresses.outputs)
            handshake = context.socket(zmq.ROUTER)
            handshake.setsockopt(zmq.LINGER, 0)
            handshake.bind(self.addresses.handshake)
            monitor = inputs.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        except zmq.ZMQError as exc:
            context.destroy(linger=0)
            raise EngineError("UNAVAILABLE", f"cannot bind the ZMQ sockets of {self.addresses.path}: {exc}") from None
        self._context, self._input, self._started = context, inputs, True
        self._spawn(self._handshakes(handshake), "handshake")
        self._spawn(self._registrations(inputs), "registrations")
        self._spawn(self._outputs(outputs), "outputs")
        self._spawn(self._connections_of(monitor), "monitor")
        log.info(
            "ZMQ worker %s: waiting for %d engine(s) to dial %s", self.addresses.path, self.engine_count,
            self.addresses.handshake,
        )

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"smg-zmq-{name}-{self.addresses.path}")
        self._tasks.append(task)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._fail_all("the gateway is shutting down")
        if self._context is not None:
            self._context.destroy(linger=0)
        self._context, self._input, self._started = None, None, False

    # -- state ------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Every engine has registered and none has died since."""
        registered = [e for e in self.engines.values() if e.ready is not None]
        return self.death is None and len(registered) >= self.engine_count

    def waiting_reason(self) -> str:
        registered = sum(e.ready is not None for e in self.engines.values())
        if self.death is not None:
            return f"{self.death}; waiting for the engine to dial {self.addresses.handshake} again"
        if not self._started:
            return "the ZMQ sockets are not bound yet"
        return (
            f"waiting for the engine handshake on {self.addresses.handshake} ({registered} of {self.engine_count} "
            "engine(s) registered)"
        )

    @property
    def max_model_len(self) -> int | None:
        lengths = [e.ready.max_model_len for e in self.engines.values() if e.ready is not None]
        return min(lengths) if lengths else None

    def _died(self, reason: str) -> None:
        if self.death is None:
            log.warning("ZMQ worker %s: %s", self.addresses.path, reason)
        self.death = reason
        for engine in self.engines.values():
            engine.ready = None
            engine.said_ready = False
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        error = EngineError("UNAVAILABLE", reason)
        for queue in self._requests.values():
            queue.put_nowait(error)
        self._requests.clear()
        self._owners.clear()
        for engine in self.engines.values():
            engine.in_flight = 0

    # -- requests ---------------------------------------------------------------------------

    @property
    def engine_dtype(self) -> str:
        """The engines' model dtype as their ready responses name it (`torch.bfloat16`)."""
        return next((e.ready.dtype for e in self.engines.values() if e.ready is not None), "")

    async def submit(self, request_id: str, payload: bytes, aux: Sequence[bytes] = ()) -> asyncio.Queue[Delivery]:
        """Send an ADD (its tensors' `aux` frames after the payload) to the least busy engine;
        the queue receives the request's outputs."""
        if not self.serving or self._input is None:
            raise EngineError("UNAVAILABLE", self.waiting_reason())
        if request_id in self._requests:
            raise EngineError("ALREADY_EXISTS", f"request {request_id} is already running on this engine")
        engine = min((e for e in self.engines.values() if e.ready is not None), key=lambda e: e.in_flight)
        queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._requests[request_id] = queue
        self._owners[request_id] = engine.identity
        try:
            await self._input.send_multipart([engine.identity, wire.ADD, payload, *aux])
        except zmq.ZMQError as exc:
            self._requests.pop(request_id, None)
            self._owners.pop(request_id, None)
            raise EngineError("UNAVAILABLE", f"the engine cannot be reached: {exc}") from None
        engine.in_flight += 1
        return queue

    def finish(self, request_id: str) -> bytes | None:
        """The gateway stops reading the request; its engine's identity if it was still running."""
        self._requests.pop(request_id, None)
        identity = self._owners.pop(request_id, None)
        if identity is not None and identity in self.engines:
            engine = self.engines[identity]
            engine.in_flight = max(0, engine.in_flight - 1)
        return identity

    async def abort(self, identity: bytes, request_id: str) -> None:
        if self._input is None or identity not in self.engines:
            return
        try:
            await self._input.send_multipart([identity, wire.ABORT, wire.abort_request([request_id])])
        except zmq.ZMQError as exc:
            raise EngineError("UNAVAILABLE", f"the abort could not be sent: {exc}") from None
        # The engine never confirms one: this line is the only trace an abort leaves.
        log.info("ZMQ worker %s: ABORT of %s sent to engine %d", self.addresses.path, request_id,
                 self.engines[identity].index)

    def loads(self) -> tuple[int, int, float] | None:
        """Running and waiting requests, and the mean KV-cache use, from the engines' last stats."""
        stats = [e.stats for e in self.engines.values() if e.ready is not None and e.stats]
        if not stats:
            return None
        running = sum(int(s.get("num_running_reqs") or 0) for s in stats)
        waiting = sum(int(s.get("num_waiting_reqs") or 0) for s in stats)
        usage = sum(float(s.get("kv_cache_usage") or 0.0) for s in stats) / len(stats)
        return running, waiting, usage

    # -- the loops --------------------------------------------------------------------------

    async def _handshakes(self, socket: zmq.asyncio.Socket) -> None:
        init = wire.init_message(self.addresses.inputs, self.addresses.outputs)
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 2:
                log.warning("ZMQ worker %s: a handshake message of %d frames ignored", self.addresses.path, len(frames))
                continue
            identity, payload = frames
            status = wire.handshake_status(payload)
            engine = self.engines.get(identity)
            if status == "HELLO":
                if engine is not None and engine.ready is not None:
                    # The engine started again while we held it as registered: it died unseen.
                    self._died(f"engine {engine.index} restarted")
                self.engines[identity] = EngineRank(identity)
                await socket.send_multipart([identity, init])
                log.info("ZMQ worker %s: engine %d said HELLO", self.addresses.path, self.engines[identity].index)
            elif status == "READY" and engine is not None:
                engine.said_ready = True
            else:
                log.warning("ZMQ worker %s: unexpected handshake message %r", self.addresses.path, status or payload)

    async def _registrations(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            engine = self.engines.get(frames[0])
            if engine is None or len(frames) < 2:
                continue
            try:
                ready = wire.ready_response(frames[1])
            except ValueError as exc:
                log.warning("ZMQ worker %s: engine %d: %s", self.addresses.path, engine.index, exc)
                continue
            engine.ready = ready
            if sum(e.ready is not None for e in self.engines.values()) >= self.engine_count:
                self.death = None
            log.info(
                "ZMQ worker %s: engine %d registered (vLLM %s, max_model_len %d)", self.addresses.path,
                engine.index, ready.vllm_version or "?", ready.max_model_len,
            )

    async def _outputs(self, socket: zmq.asyncio.Socket) -> None:
        errors = 0
        while True:
            frames = await socket.recv_multipart(copy=True)
            if frames[0] == wire.ENGINE_CORE_DEAD:
                self._died("the engine died (ENGINE_CORE_DEAD)")
                continue
            try:
                batch = self._decode(frames[0])
            except ValueError as exc:
                errors += 1
                log.warning("ZMQ worker %s: %s", self.addresses.path, exc)
                if errors >= 8:  # not a stray frame: the engine speaks something else
                    self._died(f"the engine's outputs cannot be read ({exc})")
                continue
            errors = 0
            if batch.scheduler_stats is not None:
                for engine in self.engines.values():
                    if engine.index == batch.engine_index:
                        engine.stats = batch.scheduler_stats
            for output in batch.outputs:
                queue = self._requests.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)
                    if output.finish_reason is not None:
                        self.finish(output.request_id)

    async def _connections_of(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._connections += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._connections = max(0, self._connections - 1)
                registered = sum(e.ready is not None for e in self.engines.values())
                if registered and self._connections < registered:
                    self._died("the engine's connection closed (the engine process is gone)")
