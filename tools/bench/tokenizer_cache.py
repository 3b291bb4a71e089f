"""The tokenizer caches bench: an agent's conversations through a gRPC worker, with the encode
caches (`--tokenizer-cache-enable-l0 --tokenizer-cache-enable-l1`) and without them.

One scripted SGLang engine (the qwen3 fixture) and two gateways in front of it. Each round
sends the same conversations to both, turn by turn (`/v1/messages`, 16 output tokens): a long
system prompt and `--tools` tools, each turn the previous one's messages, its answer and a new
user message. Round 1 is what a gateway meets first (L1 serves every shared prefix it has seen);
round 2 sends the same requests again (L0). Reported: each gateway's CPU and wall time per
request, and the prompt's size; the two gateways' prompt sizes must agree (exit 1 otherwise).

Run: ``python -m tools.bench.tokenizer_cache [--conversations N] [--turns N] [--tools N]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from tools.bench.load import _cpu_seconds
from tools.spawn import REPO_ROOT, Spawned, spawn_engine, spawn_gateway

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
MODEL = "qwen3"
FLAGS = ["--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]


def tools(count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"tool_{i}",
            "description": "Reads and writes files under the project, runs commands, reports what it did. " * 3,
            "input_schema": {
                "type": "object",
                "properties": {f"arg{j}": {"type": "string", "description": f"argument {j}"} for j in range(4)},
                "required": ["arg0"],
            },
        }
        for i in range(count)
    ]


WORDS = ("alpha", "beta", "gamma", "file.py", "\n", "fix", "the", "test")


def conversation(turns: int, seed: int, words: Sequence[str] = WORDS) -> list[list[dict[str, Any]]]:
    """The message lists of one conversation's requests, turn by turn: each the last one's, its
    answer and one more user message, of `words` drawn at random."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}: " + " ".join(rng.choice(words) for _ in range(40))})
        out.append(list(messages))
        answer = f"answer {turn}: " + " ".join(rng.choice(words) for _ in range(20))
        messages.append({"role": "assistant", "content": answer})
    return out


def _round(gateway: Spawned, bodies: list[dict[str, Any]]) -> tuple[float, float, list[int]]:
    """(CPU ms, wall ms) per request and the prompt sizes, for `bodies` sent one by one."""
    counts = []
    with httpx.Client(timeout=60.0) as http:
        cpu0, wall0 = _cpu_seconds(gateway.proc.pid), time.perf_counter()
        for body in bodies:
            reply = http.post(f"{gateway.url}/v1/messages", json=body)
            reply.raise_for_status()
            counts.append(int(reply.json()["usage"]["input_tokens"]))
        wall = time.perf_counter() - wall0
        cpu = (_cpu_seconds(gateway.proc.pid) or 0.0) - (cpu0 or 0.0)
    return cpu / len(bodies) * 1e3, wall / len(bodies) * 1e3, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.tokenizer_cache", description=__doc__)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tools", type=int, default=24)
    args = parser.parse_args(argv)
    system = "You are a coding agent working in a repository.\n" * 50
    bodies = [
        {"model": MODEL, "max_tokens": 16, "system": system, "messages": messages, "tools": tools(args.tools)}
        for seed in range(args.conversations)
        for messages in conversation(args.turns, seed)
    ]
    engine = spawn_engine("sglang", QWEN3, ["--served-model-name", MODEL])
    started = [engine]
    try:
        gateways = {
            "caches on": spawn_gateway([engine.url], extra=["--model-path", str(QWEN3), *FLAGS]),
            "caches off": spawn_gateway([engine.url], extra=["--model-path", str(QWEN3)]),
        }
        started += gateways.values()
        sizes: dict[str, list[int]] = {}
        shape = f"{args.conversations} conversations x {args.turns} turns, {args.tools} tools"
        print(f"{len(bodies)} requests per round ({shape})")
        for number in (1, 2):
            for name, gateway in gateways.items():
                cpu, wall, counts = _round(gateway, bodies)
                sizes.setdefault(name, counts)
                print(
                    f"round {number}  {name:10s}  CPU {cpu:6.2f} ms/request  wall {wall:6.2f} ms/request  "
                    f"prompt {min(counts):,}-{max(counts):,} tokens"
                )
        if len({tuple(v) for v in sizes.values()}) != 1:
            print("the gateways counted different prompts", file=sys.stderr)
            return 1
        return 0
    finally:
        for process in started:
            process.stop()


if __name__ == "__main__":
    sys.exit(main())
