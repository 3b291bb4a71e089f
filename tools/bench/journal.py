"""The journal bench: the writer's own throughput, and what the journal costs the gateway.

Two measurements in one run, one after the other (never overlapping, they share the cores):

1. Writer throughput, in this process: producer coroutines append the events of realistic
   streamed requests (a relayed stream of the bench's 32-word echo: `received` with its body,
   `validated`, `routed`, the upstream head, one `upstream` chunk per SSE event, `completed`:
   42 events, about 6 KB of JSON) to a `JournalWriter` on a fresh file, as the gateway's
   handlers would; the clock stops when `flush()` returns, i.e. when the last event is
   committed. Reported as events/s (and requests/s), once per `--journal-bodies` mode;
   medians over the rounds.
2. The gateway's req/s with the journal on and with `--no-journal` at concurrency 64, JSON
   and streamed, with `tools.bench.relay`'s machinery (scripted worker, gateways started
   once, a load generator in its own process, on/off runs interleaved round after round, so
   each ratio compares neighbours in time).

Run: ``python -m tools.bench.journal [--quick] [--reps R] [--requests N] [--json PATH]``.
Exit status 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from rich import box
from rich.console import Console
from rich.table import Table

from journal.bodies import MODES
from journal.events import Completed, Event, Received, Routed, Upstream, Validated
from journal.writer import JournalWriter
from tools.bench import relay
from tools.bench.common import csv_list
from tools.bench.load import MODEL, request_body
from tools.bench.report import Run, group, paired_ratio, scenario_table

ON, OFF = "aiohttp+J", "aiohttp-J"
CONCURRENCY = 64
QUICK = {"requests": 300, "reps": 1, "duration": 0.3, "warmup": 0.1}
DEFAULTS = {"requests": 5000, "reps": 3, "duration": 1.0, "warmup": 0.3}


def streamed_request(words: int = 32) -> list[Event]:
    """The events of one relayed stream of the scripted worker's echo, as the gateway emits them."""
    body = request_body(MODEL, True, words).decode()
    text = orjson.loads(body)["messages"][0]["content"]
    sse: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": words, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f" {word}"}}
            for word in text.split()
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": words},
        },
        {"type": "message_stop"},
    ]
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "sk-bench"}
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", headers=headers, body=body, client="127.0.0.1", ts=0.0),
        Validated(model=MODEL, stream=True, summary={"messages": 1, "max_tokens": 256}),
        Routed(backend="http", worker="http://127.0.0.1:8000", model=MODEL, policy="round_robin"),
        Upstream(
            part="head", status=200, headers={"content-type": "text/event-stream"}, worker="http://127.0.0.1:8000"
        ),
    ]
    for payload in sse:
        events.append(
            Upstream(part="chunk", data=f"event: {payload['type']}\ndata: {orjson.dumps(payload).decode()}\n\n")
        )
    events.append(
        Completed(
            status=200,
            duration_ms=12.5,
            usage={"input_tokens": words, "output_tokens": words},
            stop_reason="end_turn",
            bytes_sent=6000,
        )
    )
    for i, event in enumerate(events):
        event.t = i / 1000
    return events


async def _writer_run(path: Path, requests: int, concurrency: int, mode: str) -> dict[str, Any]:
    template = streamed_request()
    writer = JournalWriter(path, bodies=mode)
    await writer.start()
    next_request = 0

    async def producer() -> None:
        nonlocal next_request
        while next_request < requests:
            n = next_request
            next_request += 1
            request_id = f"req_{n:08d}"
            for seq, event in enumerate(template, 1):
                if seq == 1:
                    event = Received(**{**template[0].to_dict(), "ts": time.time()})
                await writer.append(request_id, seq, event)
                await asyncio.sleep(0)  # a handler yields between events

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(concurrency)))
    await writer.flush()
    elapsed = time.perf_counter() - started
    stats = writer.stats
    await writer.close()
    events = requests * len(template)
    assert stats["events_written"] == events, stats
    return {
        "mode": mode,
        "requests": requests,
        "events": events,
        "elapsed_s": round(elapsed, 4),
        "events_per_s": round(events / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
        "batches": stats["batches"],
        "mean_batch": round(events / max(1, stats["batches"]), 1),
        "bytes_per_event": round(os.path.getsize(path) / events, 1),
    }


def writer_bench(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """`reps` rounds, each writing `requests` requests once per mode, to fresh files."""
    runs = []
    for rep in range(args.reps):
        for mode in args.bodies:
            path = workdir / f"writer-{mode}-{rep}.db"
            result = asyncio.run(_writer_run(path, args.requests, CONCURRENCY, mode))
            runs.append({"rep": rep, **result})
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    return runs


def gateway_bench(args: argparse.Namespace, console: Console) -> tuple[list[Run], list[str]]:
    relay_args = argparse.Namespace(
        targets=[ON, OFF],
        modes=["json", "stream"],
        concurrency=[CONCURRENCY],
        reps=args.reps,
        duration=args.duration,
        warmup=args.warmup,
        requests=None,
        prompt_words=32,
        pin=False,
    )
    return relay.run_bench(relay_args, console)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(writer_runs: list[dict[str, Any]], gateway_runs: list[Run]) -> dict[str, Any]:
    writer = {
        mode: {
            "events_per_s": _median([r["events_per_s"] for r in writer_runs if r["mode"] == mode]),
            "requests_per_s": _median([r["requests_per_s"] for r in writer_runs if r["mode"] == mode]),
            "mean_batch": _median([r["mean_batch"] for r in writer_runs if r["mode"] == mode]),
            "bytes_per_event": _median([r["bytes_per_event"] for r in writer_runs if r["mode"] == mode]),
        }
        for mode in dict.fromkeys(r["mode"] for r in writer_runs)
    }
    gateway = {}
    for (stream, conc), cells in group(gateway_runs).items():
        on, off = cells.get(ON), cells.get(OFF)
        gateway[f"{'stream' if stream else 'json'} c={conc}"] = {
            "journal_on_rps": on.median("rps") if on else None,
            "journal_off_rps": off.median("rps") if off else None,
            "on_off": paired_ratio(cells, ON, OFF, "rps"),
            "gateway_cpu_us_on": on.median("gw_cpu") if on else None,
            "gateway_cpu_us_off": off.median("gw_cpu") if off else None,
        }
    return {"writer": writer, "gateway": gateway}


def render(console: Console, header: list[str], figures: dict[str, Any], gateway_runs: list[Run]) -> None:
    for line in header:
        console.print(line, highlight=False)
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", title="journal writer", title_justify="left"
    )
    for title in ("bodies", "events/s", "requests/s", "mean batch", "bytes/event"):
        table.add_column(title, justify="right")
    for mode, w in figures["writer"].items():
        table.add_row(
            mode,
            f"{w['events_per_s']:,.0f}",
            f"{w['requests_per_s']:,.0f}",
            f"{w['mean_batch']:,.0f}",
            f"{w['bytes_per_event']:,.0f}",
        )
    console.print(table)
    for (stream, conc), cells in group(gateway_runs).items():
        console.print(scenario_table(stream, conc, cells))
    ratios = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", title="gateway", title_justify="left")
    titles = ("scenario", "journal on req/s", "--no-journal req/s", "on/off (run by run)", "gwCPU µs/req on", "off")
    for title in titles:
        ratios.add_column(title, justify="right")

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    for name, g in figures["gateway"].items():
        ratio = g["on_off"]
        ratios.add_row(
            name,
            num(g["journal_on_rps"]),
            num(g["journal_off_rps"]),
            "-" if ratio is None else f"{ratio[0]:.2f} [{ratio[1]:.2f}-{ratio[2]:.2f}]",
            num(g["gateway_cpu_us_on"]),
            num(g["gateway_cpu_us_off"]),
        )
    console.print(ratios)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.journal", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small runs, one round (~15 s)")
    parser.add_argument("--requests", type=int, help=f"requests per writer run (default {DEFAULTS['requests']})")
    parser.add_argument("--reps", type=int, help=f"rounds (default {DEFAULTS['reps']})")
    parser.add_argument("--duration", type=float, help=f"seconds per gateway run (default {DEFAULTS['duration']})")
    parser.add_argument(
        "--warmup", type=float, help=f"seconds of warm-up per gateway run (default {DEFAULTS['warmup']})"
    )
    parser.add_argument(
        "--bodies",
        type=csv_list,
        default=list(MODES),
        help="writer runs per --journal-bodies mode: full,redacted,none",
    )
    parser.add_argument("--json", type=Path, help="write the raw runs and the summary here")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if set(args.bodies) - set(MODES) or not args.bodies:
        parser.error(f"--bodies: choose from {', '.join(MODES)}")
    if args.requests < 1 or args.reps < 1:
        parser.error("--requests and --reps need positive values")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 140)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="smg-journal-bench-"))
    try:
        writer_runs = writer_bench(args, workdir)
        gateway_runs, relay_header = gateway_bench(args, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every process started was stopped[/]")
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cores = os.cpu_count()
    header = [
        f"[bold]smg journal bench[/] - {cores} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        f"writer: {args.requests} streamed requests of {len(streamed_request())} events per run, "
        f"{CONCURRENCY} producers, {args.reps} round(s), medians",
        *relay_header[1:],
    ]
    figures = summarize(writer_runs, gateway_runs)
    render(console, header, figures, gateway_runs)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        payload = {"header": header, "settings": settings, "writer_runs": writer_runs, "gateway_runs": gateway_runs}
        args.json.write_bytes(orjson.dumps({**payload, "summary": figures}, option=orjson.OPT_INDENT_2))
        console.print(f"raw figures written to {args.json}", highlight=False)
    return 1 if any(r["errors"] or r.get("warmup", {}).get("errors") for r in gateway_runs) else 0


if __name__ == "__main__":
    sys.exit(main())
