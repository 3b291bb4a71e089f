"""The engine connector for ZMQ workers: the gRPC path's pipeline with ZMQ clients (`name = "zmq"`);
vLLM pools take images of the families `features` lays out."""

from __future__ import annotations

from smg.backends.base import Target, WorkerUnreachable
from smg.backends.grpc.backend import EngineConnector
from smg.backends.grpc.types import EngineClient
from smg.backends.zmq import features
from smg.backends.zmq.client import ZmqEngineClient
from smg.config import GatewayConfig
from smg.pipeline.tokenizers.registry import TokenizerRegistry


def zmq_connector(config: GatewayConfig, tokenizers: TokenizerRegistry | None = None) -> EngineConnector:
    """The connector serving `ipc://` workers; the model id is `--model-path`, as the reference's."""

    async def clients(target: Target) -> tuple[str, EngineClient]:
        runtime = target.runtime or config.backend or "vllm"
        if not config.model_path:
            raise WorkerUnreachable("a ZMQ worker's model id is --model-path, and none was given")
        try:
            client = ZmqEngineClient(
                target.url,
                model_id=config.model_path,
                runtime=runtime,
                engine_count=config.zmq_engine_count,
                ipc_dirs=config.router.urls.ipc_dirs,
            )
        except ValueError as exc:
            raise WorkerUnreachable(str(exc)) from None
        return runtime, client

    # vLLM's EngineCoreRequest carries the images as `mm_features`, for the families whose layout
    # `features` knows; TokenSpeed's request has no such field, so its pools refuse images.
    return EngineConnector(
        config,
        tokenizers,
        name="zmq",
        clients=clients,
        live_loads=True,
        image_runtimes=frozenset({"vllm"}),
        sends_images=features.sends_images,
    )
