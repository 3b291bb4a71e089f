"""`make demo`: the gateway on 127.0.0.1:30000 in front of an embedded scripted gRPC engine.

The engine speaks the real SGLang scheduler protocol and serves the Qwen3-style fixture
tokenizer from `tests/fixtures/qwen3`; the gateway renders the chat template, tokenizes,
streams tokens from the engine and builds the Anthropic response itself. Starts both as
real processes, sends one request through to prove the path works, prints a
`curl` and an `anthropic` SDK snippet to try, and serves until interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx

from tools.spawn import Spawned, spawn_engine, spawn_gateway

MODEL = "smg-demo"
TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "qwen3"
PORT = int(os.environ.get("SMG_DEMO_PORT", "30000"))


def _snippets(url: str) -> str:
    return f"""
The gateway is serving {url} (model "{MODEL}": a scripted SGLang engine over gRPC,
with the Qwen3-style fixture tokenizer; it answers with a fixed sentence, token by token).
The journal is ./smg-journal.db; read it with `.venv/bin/smg journal ls` and `.venv/bin/smg journal show ID`.

Try it with curl:

  curl {url}/v1/messages \\
    -H "content-type: application/json" -H "anthropic-version: 2023-06-01" \\
    -d '{{"model": "{MODEL}", "max_tokens": 64, "messages": [{{"role": "user", "content": "Hello, gateway"}}]}}'

Or with the anthropic SDK (.venv/bin/python):

  import anthropic
  client = anthropic.Anthropic(base_url="{url}", api_key="unused")
  message = client.messages.create(model="{MODEL}", max_tokens=64, messages=[{{"role": "user", "content": "Hello"}}])
  print(message.content[0].text)
  stream = client.messages.stream(model="{MODEL}", max_tokens=64, messages=[{{"role": "user", "content": "Hi"}}])
  with stream as s:
      print("".join(s.text_stream))

Press Ctrl-C to stop.
"""


def main() -> int:
    worker: Spawned | None = None
    gateway: Spawned | None = None
    try:
        worker = spawn_engine("sglang", model_path=TOKENIZER, extra=["--served-model-name", MODEL])
        gateway = spawn_gateway(
            [worker.url],
            port=PORT,
            journal=os.path.abspath("smg-journal.db"),
            extra=["--model-path", str(TOKENIZER)],
        )
        answer = httpx.post(
            f"{gateway.url}/v1/messages",
            json={"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "self-check"}]},
            headers={"anthropic-version": "2023-06-01"},
            timeout=10,
        )
        answer.raise_for_status()
        body = answer.json()
        print(f"self-check: {body['content'][0]['text']!r} ({body['usage']['output_tokens']} tokens via {worker.url})")
        print(_snippets(gateway.url), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while gateway.proc.poll() is None and worker.proc.poll() is None:
            time.sleep(0.5)
        print(
            "a demo process exited; see its log:\n"
            + (gateway.log() if gateway.proc.poll() is not None else worker.log())
        )
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        if "in use" in str(exc).lower():
            print(f"port {PORT} is taken; set SMG_DEMO_PORT to use another", file=sys.stderr)
        return 1
    finally:
        for proc in (gateway, worker):
            if proc is not None:
                proc.stop()


if __name__ == "__main__":
    sys.exit(main())
