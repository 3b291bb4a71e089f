"""`make fleet`: two gateway replicas side by side, one fleet journal in PostgreSQL, shared state in Redis.

Starts a PostgreSQL server in a temp dir (`tools.servers.postgres`), creates the fleet
journal's schema in it (`smg journal-sink init`), a scripted SGLang engine (as `make
demo-scripted` does), and two `smg launch` replicas in front of it, each with its own local
journal and `--journal-sink` to the one database (`--replica-name replica-a`/`replica-b`).
Sends some traffic to both, waits until both have shipped it, and shows the one journal with
both replicas in it (`smg journal ls --journal postgresql://…`, or a query, when this checkout's
read commands do not open PostgreSQL). Then serves until interrupted, printing the URLs; on
the way out it stops everything and deletes the temp dirs.

A Redis server in a temp dir (`tools.servers.redis`) holds what the replicas agree on: the
worker registry (`--worker-registry`) and fleet-wide admission (`--max-concurrent-requests`
counted across both with `--fleet-concurrency`). A worker added with `POST /workers` on one
replica is routed to by the other (the demo prints the second replica's `GET /workers`).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from tools.demo import SCRIPTED_MODEL, SCRIPTED_TOKENIZER
from tools.servers.postgres import PostgresServer
from tools.servers.redis import RedisServer
from tools.spawn import Spawned, spawn_engine, spawn_gateway

REPLICAS = ("replica-a", "replica-b")
REQUESTS_EACH = 12


FLEET_SLOTS = 32


def _shared_state(redis: RedisServer) -> list[str]:
    """The flags every replica gets for the state the fleet shares in Redis."""
    url = redis.url
    return ["--worker-registry", url, "--max-concurrent-requests", str(FLEET_SLOTS), "--fleet-concurrency", url]


def _show_registry(adder: Spawned, other: Spawned, engine_url: str) -> None:
    """Add the engine once more through the worker API of one replica (as a second URL of it,
    `localhost` for `127.0.0.1`), and show that the other replica has it within a second."""
    url = engine_url.replace("127.0.0.1", "localhost")
    added = httpx.post(f"{adder.url}/workers", json={"url": url}, timeout=10)
    print(f"\n$ POST {adder.url}/workers {{url: {url}}} -> {added.status_code}")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        listed = httpx.get(f"{other.url}/workers", timeout=10).json()
        urls = [w.get("url") for w in listed.get("workers", [])]
        if url in urls:
            print(f"$ GET {other.url}/workers -> {urls}  (the other replica routes to it too)")
            return
        time.sleep(0.1)
    print(f"the other replica did not list {url} within 5 s")


def _traffic(replica: Spawned, name: str) -> int:
    sent = 0
    with httpx.Client(base_url=replica.url, timeout=30) as http:
        for i in range(REQUESTS_EACH):
            body = {
                "model": SCRIPTED_MODEL,
                "max_tokens": 32,
                "stream": i % 2 == 0,
                "messages": [{"role": "user", "content": f"hello from the fleet demo, request {i} to {name}"}],
            }
            http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).raise_for_status()
            sent += 1
    return sent


def _wait_shipped(url: str, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM requests").fetchone()
            if row and row[0] >= expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {row[0] if row else 0} of {expected} requests shipped in {timeout}s")
            time.sleep(0.2)


def _show(url: str) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "ls", "--journal", url, "-n", str(2 * REQUESTS_EACH)],
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0:
        print(f"\n$ smg journal ls --journal {url}\n{listed.stdout}")
        return
    print("\none journal, both replicas (SELECT replica, id, model, status, stop_reason, duration_ms FROM requests):")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT replica, id, model, status, stop_reason, round(duration_ms::numeric, 1) FROM requests ORDER BY ts"
        ).fetchall()
        for row in rows:
            print("  " + "  ".join(str(v) for v in row))
        counts = conn.execute("SELECT replica, count(*) FROM requests GROUP BY replica ORDER BY replica").fetchall()
    print("  per replica: " + ", ".join(f"{name}: {n}" for name, n in counts))


def main() -> int:
    started: list[Spawned] = []
    workdir = Path(tempfile.mkdtemp(prefix="smg-fleet-"))
    server = PostgresServer()
    redis = RedisServer(workdir / "redis", appendonly=True)
    try:
        server.start()
        redis.start()
        url = server.create_database("fleet")
        subprocess.run([sys.executable, "-m", "smg", "journal-sink", "init", url], check=True)
        engine = spawn_engine("sglang", model_path=SCRIPTED_TOKENIZER, extra=["--served-model-name", SCRIPTED_MODEL])
        started.append(engine)
        shared = _shared_state(redis)
        replicas = []
        for name in REPLICAS:
            replica = spawn_gateway(
                [engine.url],
                journal=workdir / f"{name}.db",
                extra=["--model-path", str(SCRIPTED_TOKENIZER), "--journal-sink", url, "--replica-name", name, *shared],
            )
            started.append(replica)
            replicas.append(replica)
        sent = sum(_traffic(replica, name) for replica, name in zip(replicas, REPLICAS, strict=True))
        _wait_shipped(url, sent)
        _show(url)
        _show_registry(replicas[0], replicas[1], engine.url)
        print("The fleet is serving:")
        for replica, name in zip(replicas, REPLICAS, strict=True):
            print(f"  {name}: {replica.url} (local journal {workdir / f'{name}.db'})")
        print(f"  fleet journal: {url}\n  read it with: .venv/bin/smg journal ls --journal {url}")
        print(f"  shared state: {redis.url} (worker registry, {FLEET_SLOTS} fleet-wide slots)")
        print("Press Ctrl-C to stop.")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while all(s.proc.poll() is None for s in started):
            time.sleep(0.5)
        print("a fleet process exited")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for spawned in reversed(started):
            spawned.stop()
        server.close()
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
