"""`smg engine …`: inference engines smg ships. `smg engine llamacpp` serves a GGUF model on a CPU
over the SGLang scheduler protocol (for `smg launch --worker-urls grpc://… --backend sglang`);
`smg engine export-tokenizer` writes the model's tokenizer directory for `--model-path`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

engine_app = typer.Typer(help="Inference engines smg ships: put a model behind the gateway.", no_args_is_help=True)


@engine_app.command("llamacpp")
def llamacpp(
    gguf: Annotated[Path, typer.Option(help="The GGUF model file.", exists=True, dir_okay=False)],
    host: Annotated[str, typer.Option(help="Address the gRPC service listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the gRPC service.")] = 30001,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model id the gateway serves (default: the file name without .gguf).")
    ] = None,
    ctx_size: Annotated[
        int | None, typer.Option(help="Context length, shared by all slots (default: the model's, at most 8192).")
    ] = None,
    parallel: Annotated[int, typer.Option(help="Generations run at once (llama.cpp slots).", min=1)] = 4,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: half the cores).", min=1)] = None,
    default_sampling_params: Annotated[
        str | None,
        typer.Option(
            help='JSON sampling defaults for requests that name none, e.g. \'{"temperature": 0.2, "top_p": 0.9}\' '
            "(temperature, top_p, top_k, min_p, repetition_penalty)."
        ),
    ] = None,
    tokenizer_dir: Annotated[
        Path | None,
        typer.Option(
            help="A tokenizer directory to report and serve (GetTokenizer); default: exported from the GGUF.",
            exists=True,
            file_okay=False,
        ),
    ] = None,
) -> None:
    """Serve a GGUF model with llama.cpp over the SGLang scheduler gRPC protocol."""
    try:
        from smg.engines.llamacpp.server import EngineConfig, serve
    except ImportError as exc:
        raise typer.BadParameter(
            f"the llama.cpp engine needs the llamacpp extra: pip install 'smg-py[llamacpp]' ({exc})"
        ) from None
    defaults = _sampling_defaults(default_sampling_params)
    config = EngineConfig(
        gguf=gguf,
        host=host,
        port=port,
        served_model_name=served_model_name,
        ctx_size=ctx_size,
        parallel=parallel,
        threads=threads,
        tokenizer_dir=tokenizer_dir,
        default_sampling=defaults,
    )
    asyncio.run(serve(config, ready=lambda line: print(line, flush=True)))


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _sampling_defaults(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"--default-sampling-params is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("--default-sampling-params must be a JSON object")
    out: dict[str, float] = {}
    for key, number in value.items():
        if key not in _SAMPLING_KEYS:
            raise typer.BadParameter(
                f"--default-sampling-params: unknown key {key!r} (known: {', '.join(_SAMPLING_KEYS)})"
            )
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise typer.BadParameter(f"--default-sampling-params: {key} must be a number")
        out[key] = float(number)
    return out


@engine_app.command("export-tokenizer")
def export_tokenizer_command(
    gguf: Annotated[Path, typer.Option(help="The GGUF model file.", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="The directory to write (created if missing).")],
    chat_template: Annotated[
        str,
        typer.Option(
            help="auto: the file's template, or a tool-aware ChatML one when the file's is ChatML without tools; "
            "gguf: always the file's; chatml-tools: always the tool-aware ChatML one."
        ),
    ] = "auto",
) -> None:
    """Write a GGUF model's tokenizer as a directory `smg launch --model-path` loads."""
    from smg.engines.llamacpp.tokenizer import export_tokenizer

    if chat_template not in ("auto", "gguf", "chatml-tools"):
        raise typer.BadParameter("--chat-template is auto, gguf or chatml-tools")
    written = export_tokenizer(gguf, out, template=chat_template)  # type: ignore[arg-type]
    print(f"tokenizer written to {written}")
