"""What a gRPC engine serves and whether it is up, and getting its model a tokenizer.

At start and on a schedule each engine is asked `GetModelInfo` (model id, context window,
eos ids, sampling defaults) and `HealthCheck`; under `--dp-aware`, `GetServerInfo` too, for the
data-parallel ranks the router expands the worker into. The first time a model is seen, its tokenizer
is registered: from `--tokenizer-path`/`--model-path` when given, else (autoload) from the
engine's own `tokenizer_path`/`model_path` when that directory exists here, else from the
engine's `GetTokenizer` bundle.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from smg.backends.base import Discovery, WorkerUnreachable
from smg.backends.grpc.types import EngineClient, EngineError, EngineInfo, EngineLoad
from smg.pipeline.tokenizers.registry import TokenizerRegistry

log = logging.getLogger("smg.grpc.discovery")


@dataclass
class EngineWorker:
    """A gRPC worker as its connector keeps it: its protocol client and what it last told us."""

    url: str
    client: EngineClient
    runtime: str
    info: EngineInfo | None = None
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    loads: EngineLoad | None = None  # its last GetLoads answer, every rank's


def dp_size_of(server_info: dict[str, Any]) -> int | None:
    """The data-parallel ranks a `GetServerInfo` answer names: SGLang's and TokenSpeed's
    `server_args.dp_size`, vLLM's `data_parallel_size`; None when it names none (TRT-LLM, MLX,
    a ZMQ worker, whose engines are its ranks already)."""
    args = server_info.get("server_args")
    value = args.get("dp_size") if isinstance(args, dict) else None
    if value is None:
        value = server_info.get("data_parallel_size")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1 or value != int(value):
        return None
    return int(value)


async def describe(engine: EngineWorker, timeout: float = 5.0, *, dp_aware: bool = False) -> Discovery:
    """Ask the engine what it serves and whether it is up (`dp_aware`: and how many
    data-parallel ranks it has). Raises `WorkerUnreachable`."""
    try:
        info = await asyncio.wait_for(engine.client.model_info(), timeout)
        healthy = await asyncio.wait_for(engine.client.health(), timeout)
    except EngineError as exc:
        raise WorkerUnreachable(exc.message or exc.code) from None
    except TimeoutError:
        raise WorkerUnreachable(f"no answer within {timeout:g} s") from None
    engine.info = info
    dp_size = await _dp_size(engine, timeout) if dp_aware else None
    return Discovery(
        models={info.model_id: info.max_context_length}, healthy=healthy, runtime=engine.runtime, dp_size=dp_size
    )


async def _dp_size(engine: EngineWorker, timeout: float) -> int | None:
    try:
        return dp_size_of(await asyncio.wait_for(engine.client.server_info(), timeout))
    except (EngineError, TimeoutError) as exc:
        # Served as one worker, as an HTTP worker whose /server_info does not answer is.
        log.warning("worker %s: GetServerInfo not read (%s); its data-parallel ranks are not known", engine.url, exc)
        return None


async def check_health(engine: EngineWorker, timeout: float) -> bool:
    try:
        return await asyncio.wait_for(engine.client.health(), timeout)
    except EngineError as exc:
        raise WorkerUnreachable(exc.message or exc.code) from None
    except TimeoutError:
        raise WorkerUnreachable(f"no answer within {timeout:g} s") from None


async def register_tokenizer(
    engine: EngineWorker,
    registry: TokenizerRegistry,
    *,
    configured_path: str | None,
    chat_template: str | None,
) -> None:
    """Give the engine's model a tokenizer, unless it has one or one is loading."""
    info = engine.info
    if info is None:
        return
    model = info.model_id
    existing = registry.lookup(model)
    if existing is not None and existing.name == model and existing.status != "failed":
        return
    if configured_path:
        await registry.load(model, configured_path, chat_template)
        return
    if not registry.autoload:
        return
    for label in (info.tokenizer_path, info.model_path):
        if label and os.path.isdir(label):
            await registry.load(model, label, chat_template)
            return
    try:
        bundle = await engine.client.tokenizer_bundle()
    except EngineError as exc:
        registry.note_failure(
            model,
            f"no path to load it from (the engine's tokenizer path is not on this machine and GetTokenizer "
            f"failed: {exc.message or exc.code})",
        )
        return
    try:
        await registry.load_bundle(model, bundle, engine.url, chat_template)
    except Exception:  # recorded by the registry as the model's load failure
        return
