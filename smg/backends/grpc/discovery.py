"""What a gRPC engine serves and whether it is up, and getting its model a tokenizer.

An engine whose runtime was not configured is first asked which protocol it speaks
(`engines.detect`); its client is made once that is known. At start and on a schedule each
engine is asked `GetModelInfo` (model id, context window, eos ids, sampling defaults) and
`HealthCheck`. The first time a model is seen, its tokenizer is registered: from
`--tokenizer-path`/`--model-path` when given, else (autoload) from the engine's own
`tokenizer_path`/`model_path` when that directory exists here, else from the engine's
`GetTokenizer` bundle.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from smg.backends.grpc.engines import connect
from smg.backends.grpc.engines.detect import detect_runtime
from smg.backends.grpc.types import EngineClient, EngineError, EngineInfo
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.routing.workers import Worker

log = logging.getLogger("smg.grpc.discovery")


@dataclass
class EngineWorker:
    """A gRPC worker: its registry entry, its runtime and protocol client (None until the
    runtime is detected, when it was not configured) and what it last told us."""

    worker: Worker
    client: EngineClient | None = None
    runtime: str | None = None
    info: EngineInfo | None = None
    sampling_defaults: dict[str, float] = field(default_factory=dict)


def _note_failure(worker: Worker, error: str) -> None:
    if error != worker.last_error:
        log.warning("worker %s: %s (retrying every 2 s)", worker.url, error)
    worker.last_error = error
    worker.healthy = False


async def detect(engine: EngineWorker) -> bool:
    """Give the engine its client, detecting its runtime first if none was configured; True
    when it has one."""
    if engine.client is not None:
        return True
    target = engine.worker.url.split("://", 1)[1].rstrip("/")
    if engine.runtime is None:
        try:
            engine.runtime = await detect_runtime(target)
        except EngineError as exc:
            _note_failure(engine.worker, f"runtime detection failed: {exc.message or exc.code}")
            return False
        log.info("worker %s speaks the %s engine protocol", engine.worker.url, engine.runtime)
    engine.client = connect(engine.runtime, target)
    return True


async def discover(engine: EngineWorker) -> bool:
    """Ask the engine what it serves; True when it answered."""
    worker = engine.worker
    if not await detect(engine):
        return False
    assert engine.client is not None
    try:
        info = await engine.client.model_info()
        healthy = await engine.client.health()
    except EngineError as exc:
        _note_failure(worker, f"model discovery failed: {exc.message or exc.code}")
        return False
    engine.info = info
    worker.models = {info.model_id}
    worker.context_windows = {info.model_id: info.max_context_length} if info.max_context_length else {}
    worker.discovered = True
    worker.healthy = healthy
    worker.last_error = None if healthy else "health check answered unhealthy"
    if healthy:
        worker.consecutive_failures = 0
    log.info(
        "worker %s (%s) serves %s, context window %s",
        worker.url,
        engine.runtime,
        info.model_id,
        info.max_context_length or "not advertised",
    )
    return True


async def check_health(engine: EngineWorker) -> bool:
    if engine.client is None:
        return engine.worker.record_health(False, "runtime not detected yet")
    try:
        ok = await engine.client.health()
    except EngineError as exc:
        return engine.worker.record_health(False, f"health check failed: {exc.message or exc.code}")
    return engine.worker.record_health(ok, "health check answered unhealthy")


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
    if engine.client is None:
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
        await registry.load_bundle(model, bundle, engine.worker.url, chat_template)
    except Exception:  # recorded by the registry as the model's load failure
        return
