"""The routing bench: how each policy spreads real traffic over a pool, and what a worker killed
under load costs the clients.

For each policy a gateway starts in front of the same scripted HTTP workers; a thread pool sends
a fixed number of requests (a mix of short answers and streams held for a while, so the load
policies have something to see), with conversations that repeat a prefix (so `cache_aware` and
`prefix_hash` have something to match) and a routing key per conversation. Halfway through one
worker is killed. Printed per policy: the share of requests each worker answered, the requests
that failed (the gateway retries a refused connection on another worker and takes the dead one
out, so the figure to watch is 0). Every process is stopped on the way out.

Run: ``python -m tools.bench.routing [--requests N] [--concurrency C] [--workers W]
[--policies a,b,…]``. Exit status 1 when any request failed.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from rich.console import Console
from rich.table import Table

from tools.bench.common import csv_list, load_average
from tools.spawn import Spawned, spawn_gateway, spawn_worker

MODEL = "bench-model"
POLICIES = ["round_robin", "random", "power_of_two", "least_load", "cache_aware", "consistent_hashing", "prefix_hash"]


@dataclass
class Outcome:
    workers: list[str] = field(default_factory=list)  # in start order; the last one is killed
    routed: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    statuses: Counter[int] = field(default_factory=Counter)


def _request(client: httpx.Client, n: int, conversations: int) -> tuple[int, str | None]:
    conversation = n % conversations
    stream = n % 4 == 0
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "stream": stream,
        "messages": [{"role": "user", "content": f"conversation {conversation} shared context " * 16 + str(n)}],
    }
    headers = {"x-smg-routing-key": f"conv-{conversation}"}
    try:
        if stream:
            with client.stream("POST", "/v1/messages", json=body, headers=headers) as response:
                text = response.read().decode()
                ok = response.status_code == 200 and "message_stop" in text
                return (200 if ok else response.status_code or 599), response.headers.get("x-smg-routed-worker-id")
        response = client.post("/v1/messages", json=body, headers=headers)
        return response.status_code, response.headers.get("x-smg-routed-worker-id")
    except httpx.HTTPError:
        return 599, None


def run_policy(policy: str, args: argparse.Namespace) -> Outcome:
    workers = [spawn_worker(models=[MODEL]) for _ in range(args.workers)]
    started: list[Spawned] = list(workers)
    outcome = Outcome(workers=[w.url for w in workers])
    try:
        gateway = spawn_gateway(
            [w.url for w in workers], extra=["--policy", policy, "--health-check-interval-secs", "1"]
        )
        started.append(gateway)
        victim = workers[-1]
        killed = threading.Event()
        lock = threading.Lock()
        done = 0

        def one(n: int) -> None:
            nonlocal done
            status, worker = _request(client, n, args.conversations)
            with lock:
                done += 1
                outcome.statuses[status] += 1
                if status != 200:
                    outcome.failed += 1
                if worker:
                    outcome.routed[worker] += 1
                if done == args.requests // 2 and not killed.is_set():
                    victim.kill()
                    killed.set()

        limits = httpx.Limits(max_connections=args.concurrency)
        with httpx.Client(base_url=gateway.url, timeout=30.0, limits=limits) as client:
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(one, range(args.requests)))
        return outcome
    finally:
        for spawned in reversed(started):
            spawned.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.routing", description=__doc__)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--policies", type=csv_list, default=POLICIES)
    args = parser.parse_args(argv)
    console = Console()
    console.print(
        f"routing bench: {args.requests} requests at c={args.concurrency} over {args.workers} workers, "
        f"one killed halfway; load {load_average()}",
        highlight=False,
    )
    columns = [f"w{i}" for i in range(args.workers - 1)] + [f"w{args.workers - 1} (killed)"]
    table = Table("policy", *columns, "requests", "failed", "s")
    any_failed = False
    for policy in args.policies:
        t0 = time.monotonic()
        outcome = run_policy(policy, args)
        total = sum(outcome.routed.values()) or 1
        shares = [outcome.routed.get(url, 0) / total for url in outcome.workers]
        any_failed = any_failed or outcome.failed > 0
        table.add_row(
            policy,
            *(f"{share:.0%}" for share in shares),
            str(sum(outcome.statuses.values())),
            str(outcome.failed),
            f"{time.monotonic() - t0:.1f}",
        )
    console.print(table)
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
