"""The cache-hit proxy of a fleet: the share of one prefix's requests that land on one worker
(the worker most of them went to), with one gateway and with three behind a round-robin
balancer. Each replica keeps its own cache-aware tree, so three replicas may send one prefix to
up to three workers; `prefix_hash` over workers of the shared registry (one id each in the
fleet) sends it to one.

Three scripted HTTP workers serve one model; each configuration gets fresh gateways (and, for
the shared registry, a fresh redis-server) and the same traffic: `--prefixes` system prompts,
each followed by `--per-prefix` different user turns, sent one at a time, request i to replica
i mod n. The workers' recorded requests say where each went. Printed, never asserted. Every
process started here is stopped on the way out.

Run: ``python -m tools.bench.fleet_cache [--prefixes 20] [--per-prefix 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import httpx

from tools.servers.redis import RedisServer
from tools.spawn import Spawned, spawn_gateway, spawn_worker

MODEL = "scripted-model"


def _system(prefix: int) -> str:
    # Longer than the 1,024 characters prefix_hash hashes (256 tokens at 4 characters each).
    return f"Conversation {prefix}: " + " ".join(f"context-{prefix}-{i}" for i in range(120))


def _await_ready(gateways: list[Spawned], urls: list[str]) -> None:
    deadline = time.monotonic() + 20
    for gateway in gateways:
        while True:
            workers = httpx.get(f"{gateway.url}/workers", timeout=5).json()["workers"]
            if sum(w["url"] in urls and w["status"] == "ready" for w in workers) == len(urls):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{gateway.url} never had every worker ready: {workers}")
            time.sleep(0.05)


def _run(workers: list[Spawned], replicas: int, policy: str, shared: bool, prefixes: int, per: int) -> float:
    flags = ["--policy", policy]
    for worker in workers:
        httpx.post(f"{worker.url}/_reset").raise_for_status()
    urls = [w.url for w in workers]
    redis = RedisServer().start() if shared else None
    gateways: list[Spawned] = []
    try:
        for _ in range(replicas):
            if redis is not None:
                gateways.append(spawn_gateway([], extra=["--enable-igw", "--worker-registry", redis.url, *flags]))
            else:
                gateways.append(spawn_gateway(urls, extra=flags))
        if redis is not None:
            for url in urls:
                httpx.post(f"{gateways[0].url}/workers", json={"url": url}, timeout=5).raise_for_status()
        _await_ready(gateways, urls)
        sent = 0
        for turn in range(per):
            for prefix in range(prefixes):
                body = {
                    "model": MODEL,
                    "max_tokens": 8,
                    "system": _system(prefix),
                    "messages": [{"role": "user", "content": f"question {turn} of conversation {prefix}"}],
                }
                httpx.post(f"{gateways[sent % replicas].url}/v1/messages", json=body, timeout=30).raise_for_status()
                sent += 1
    finally:
        for gateway in gateways:
            gateway.stop()
        if redis is not None:
            redis.stop()
    landed: dict[int, Counter[str]] = {p: Counter() for p in range(prefixes)}
    for worker in workers:
        for request in httpx.get(f"{worker.url}/_received", timeout=5).json()["requests"]:
            system = (request.get("json") or {}).get("system") or ""
            if request["path"] == "/v1/messages" and system.startswith("Conversation "):
                landed[int(system.split(":", 1)[0].split()[1])][worker.url] += 1
    return statistics.mean(max(c.values()) / sum(c.values()) for c in landed.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=20)
    parser.add_argument("--per-prefix", type=int, default=9)
    args = parser.parse_args()
    workers = [spawn_worker(models=[MODEL]) for _ in range(3)]
    try:
        rows = [
            ("cache_aware, 1 gateway", 1, "cache_aware", False),
            ("cache_aware, 3 replicas (own trees)", 3, "cache_aware", False),
            ("prefix_hash, 1 gateway", 1, "prefix_hash", False),
            ("prefix_hash, 3 replicas, --worker-urls", 3, "prefix_hash", False),
            ("prefix_hash, 3 replicas, shared registry", 3, "prefix_hash", True),
        ]
        print(f"{args.prefixes} prefixes x {args.per_prefix} requests, 3 workers, round-robin over replicas")
        print("share of a prefix's requests on its most used worker (1.00: all on one)")
        for label, replicas, policy, shared in rows:
            share = _run(workers, replicas, policy, shared, args.prefixes, args.per_prefix)
            print(f"  {label:<44} {share:.2f}")
    finally:
        for worker in workers:
            worker.stop()


if __name__ == "__main__":
    main()
