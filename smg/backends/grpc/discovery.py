"""What a gRPC engine serves and whether it is up, and getting its model a tokenizer.

At start and on a schedule each engine is asked `GetModelInfo` (model id, context window,
eos ids, sampling defaults) and `HealthCheck`. The first time a model is seen, its tokenizer
is registered: from `--tokenizer-path`/`--model-path` when given, else (autoload) from the
engine's own `tokenizer_path`/`model_path` when that directory exists here, else from the
engine's `GetTokenizer` bundle.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

from smg.backends.base import Discovery, WorkerUnreachable
from smg.backends.grpc.types import EngineClient, EngineError, EngineInfo
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


async def describe(engine: EngineWorker, timeout: float = 5.0) -> Discovery:
    """Ask the engine what it serves and whether it is up. Raises `WorkerUnreachable`."""
    try:
        info = await asyncio.wait_for(engine.client.model_info(), timeout)
        healthy = await asyncio.wait_for(engine.client.health(), timeout)
    except EngineError as exc:
        raise WorkerUnreachable(exc.message or exc.code) from None
    except TimeoutError:
        raise WorkerUnreachable(f"no answer within {timeout:g} s") from None
    engine.info = info
    return Discovery(models={info.model_id: info.max_context_length}, healthy=healthy, runtime=engine.runtime)


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
