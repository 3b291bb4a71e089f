"""How fast can the gateway read an engine's Generate stream? The read paths of `grpc.aio`
side by side, on the asyncio and uvloop event loops, against one scripted SGLang engine.

Each variant runs in a fresh process (an event loop policy is per process): `concurrency`
streams at a time of `tokens` one-token chunks each, built with the gateway's own client
(`smg.backends.grpc.engines`), and reports the reader's CPU time per message (its
`process_time`, which other load on the machine disturbs less than wall time) and messages/s.

- `iter`: `async for response in call` (what `EngineClient.generate` does)
- `read`: `await call.read()` until `grpc.aio.EOF`
- `thread`: the synchronous stub iterated in a thread per stream (grpc-core waits without the
  GIL), messages handed to the loop in batches: one wake-up for what arrived while it was busy
- `wire`: `smg.backends.grpc.wire`, HTTP/2 on asyncio with no gRPC library (what
  `EngineClient.generate` uses); each message parsed into its protobuf class, as the others are
- `h2`: the same reader with the `h2` library's sans-IO state machine doing the HTTP/2 part
  (`tools.bench.h2_read`; needs `pip install h2`, which the gateway does not depend on); the
  table ends with its CPU per message over `wire`'s, per loop

Run: ``python -m tools.bench.grpc_read [--tokens N] [--requests N] [--concurrency N] [--reads wire,h2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from typing import Any

from tools.bench.common import csv_list
from tools.bench.grpc import MODEL, QWEN3, WINDOW, answer_ids
from tools.engine_control import EngineControl
from tools.spawn import spawn_engine

READS = ("iter", "read", "thread", "wire", "h2")
LOOPS = ("asyncio", "uvloop")


async def _client(url: str, read: str, tokens: int, requests: int, concurrency: int) -> dict[str, Any]:
    import grpc.aio

    from smg.backends.grpc import wire
    from smg.backends.grpc.engines import connect
    from smg.backends.grpc.types import GenerateCall

    client: Any = connect("sglang", url)
    prompt = answer_ids(32)
    messages = 0

    channel: Any = wire.Channel(client.target)
    if read == "h2":
        from tools.bench import h2_read

        channel = h2_read.Channel(client.target)
    path, parse = wire.method_path(client.pb, "Generate")

    async def one(i: int) -> None:
        nonlocal messages
        request = client.generate_request(GenerateCall(request_id=f"r{i}", input_ids=prompt, max_tokens=tokens))
        if read in ("wire", "h2"):
            stream = await channel.stream(path, request.SerializeToString())
            while (data := await stream.read()) is not None:
                parse(data)
                messages += 1
            return
        call = client.stub().Generate(request)
        if read == "iter":
            async for _ in call:
                messages += 1
        else:
            while (message := await call.read()) is not grpc.aio.EOF:
                messages += 1
                del message

    if read == "thread":
        one = _threaded(url, client, prompt, tokens, lambda n: _count(n))

    def _count(n: int) -> None:
        nonlocal messages
        messages += n

    await one(-1)  # warm: channel up, code paths loaded
    messages = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    pending = iter(range(requests))

    async def worker() -> None:
        for i in pending:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await client.close()
    channel.close()
    return {"us_per_message": round(cpu * 1e6 / messages, 2), "messages_per_s": round(messages / wall), "n": messages}


def _threaded(url: str, client: Any, prompt: list[int], tokens: int, count: Any) -> Any:
    import threading

    import grpc

    from smg.backends.grpc.types import GenerateCall

    channel = grpc.insecure_channel(url.removeprefix("grpc://"))
    stub = client._make_stub(channel)

    async def one(i: int) -> None:
        loop = asyncio.get_running_loop()
        request = client.generate_request(GenerateCall(request_id=f"t{i}", input_ids=prompt, max_tokens=tokens))
        box: list[Any] = []
        lock = threading.Lock()
        ready = asyncio.Event()
        finished = False

        def wake() -> None:
            ready.set()

        def pump() -> None:
            nonlocal finished
            for message in stub.Generate(request):
                with lock:
                    first = not box
                    box.append(message)
                if first:
                    loop.call_soon_threadsafe(wake)
            with lock:
                finished = True
            loop.call_soon_threadsafe(wake)

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                got, box[:] = list(box), []
                done = finished
            count(len(got))
            if done and not got:
                break
            if done:
                with lock:
                    if not box:
                        break
        thread.join()

    return one


def _child(argv: list[str]) -> None:
    url, loop, read, tokens, requests, concurrency = argv
    if loop == "uvloop":
        import uvloop

        uvloop.install()
    result = asyncio.run(_client(url, read, int(tokens), int(requests), int(concurrency)))
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m tools.bench.grpc_read", description=__doc__)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--reads", type=csv_list, default=list(READS), help=f"of {','.join(READS)}")
    parser.add_argument("--loops", type=csv_list, default=list(LOOPS), help=f"of {','.join(LOOPS)}")
    args = parser.parse_args(argv)
    if "h2" in args.reads and importlib.util.find_spec("h2") is None:
        print("no h2 installed (pip install h2): its variant is left out", file=sys.stderr)
        args.reads.remove("h2")
    variants = [(loop, read) for loop in args.loops for read in args.reads]
    engine = spawn_engine("sglang", QWEN3, ["--served-model-name", MODEL, "--max-context-length", str(WINDOW)])
    try:
        with EngineControl(engine.url) as control:
            control.script(default={"token_ids": answer_ids(args.tokens), "eos": False, "chunk_size": 1})
            results: dict[tuple[str, str], list[dict[str, Any]]] = {v: [] for v in variants}
            for _ in range(args.reps):
                for loop, read in variants:
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "tools.bench.grpc_read",
                            "--child",
                            engine.url,
                            loop,
                            read,
                            str(args.tokens),
                            str(args.requests),
                            str(args.concurrency),
                        ],  # fmt: skip
                        capture_output=True,
                        check=True,
                        text=True,
                    )
                    results[(loop, read)].append(json.loads(out.stdout.strip().splitlines()[-1]))
                    control.reset()
                    control.script(default={"token_ids": answer_ids(args.tokens), "eos": False, "chunk_size": 1})
    finally:
        engine.stop()
    print(f"{args.requests} streams of {args.tokens} one-token chunks, {args.concurrency} at a time", end="")
    print(f"; median of {args.reps}")
    print(f"{'loop':8} {'read':5} {'CPU us/msg':>11} {'msg/s':>9}")
    medians: dict[tuple[str, str], float] = {}
    for (loop, read), runs in results.items():
        us = medians[(loop, read)] = sorted(r["us_per_message"] for r in runs)[len(runs) // 2]
        rate = sorted(r["messages_per_s"] for r in runs)[len(runs) // 2]
        print(f"{loop:8} {read:5} {us:11.2f} {rate:9,}")
    for loop in args.loops:
        if (loop, "wire") in medians and (loop, "h2") in medians:
            ratio = medians[(loop, "h2")] / medians[(loop, "wire")]
            print(f"{loop:8} h2/wire CPU per message: {ratio:.2f}x ({(ratio - 1) * 100:+.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
