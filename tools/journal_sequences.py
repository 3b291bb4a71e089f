"""Fixed engine traffic through real gateways, printed as each request's journal events.

Starts scripted engines (a single gRPC SGLang engine, an SGLang prefill/decode pair, a ZMQ
EngineCore) and a gateway in front of each, all on loopback, sends one fixed set of requests
(streamed and not: text, a tool call, thinking, stop sequences, a `max_tokens` cut,
`max_tokens: 0`, count_tokens, a refused body, engine failures before and after the first
token), and prints one JSON line per request: its event kinds in order and every event's
payload with what varies from run to run (ids, rooms, timestamps, durations, ports) replaced by
stable placeholders. Two runs of the same code print the same lines, so the diff of two
checkouts' output shows whether a change altered what the journal records.

    python -m tools.journal_sequences > sequences.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from journal.reader import JournalNotFound, JournalReader
from tools.engine_control import EngineControl
from tools.spawn import REPO_ROOT, Spawned, spawn_engine, spawn_gateway, spawn_zmq_engine

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
# A ZMQ worker's model id is the gateway's --model-path, and it is in every answer: relative to
# the checkout (the gateway runs in it), so two checkouts' answers have the same length.
QWEN3_RELATIVE = "tests/fixtures/qwen3"
MODEL = "qwen3-fixture"  # named so the qwen tool and reasoning parsers are detected
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING = {"type": "enabled", "budget_tokens": 1024}

# name → (engine script, request fields); each is sent streamed and not.
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "text": ({"text": "Hello there, friend. Nice to meet you!"}, {"max_tokens": 64}),
    "stop-token": ({"text": "one two three four"}, {"max_tokens": 64, "stop_sequences": [" three"]}),
    "stop-text": ({"text": "Count: 1, 2, STOP, 3, 4", "chunk_size": 2}, {"max_tokens": 64, "stop_sequences": ["STOP"]}),
    "length": ({"text": "This answer is longer than its budget allows"}, {"max_tokens": 5}),
    "tool": ({"text": "Let me check." + CALL, "chunk_size": 3}, {"max_tokens": 128, "tools": [WEATHER]}),
    "thinking": (
        {"text": "<think>plan</think>\n\nAnswer.", "chunk_size": 2},
        {"max_tokens": 2048, "thinking": THINKING},
    ),
    "refused-by-engine": ({"error": {"code": "INVALID_ARGUMENT", "message": "bad sampling", "after_tokens": 0}}, {}),
    "overloaded": ({"error": {"code": "RESOURCE_EXHAUSTED", "message": "queue full", "after_tokens": 0}}, {}),
    "mid-failure": ({"text": "a b c d e f g", "error": {"code": "INTERNAL", "message": "boom", "after_tokens": 3}}, {}),
    "finish-error": ({"text": "a b c", "finish_reason": "error"}, {}),
}
# A scripted ZMQ engine's `error` is its death: that deployment gets the failed finish alone.
_ZMQ_SKIPPED = {"refused-by-engine", "overloaded", "mid-failure"}

_VOLATILE_KEYS = {"ts", "duration_ms", "elapsed_ms", "first_event_ms", "ttft_ms", "started", "finished", "at"}
_ID = re.compile(r"\b(msg|toolu|req|srvtoolu)_[A-Za-z0-9]+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PORT = re.compile(r"127\.0\.0\.1:\d+")
_TMP = re.compile(r"/tmp/[^\s\"',]+")


class Normaliser:
    """Replaces one request's varying values by placeholders numbered in order of appearance."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def _name(self, value: str, kind: str) -> str:
        number = sum(1 for k in self.seen.values() if k.startswith("<" + kind))
        return self.seen.setdefault(value, f"<{kind}{number}>")

    def text(self, value: str) -> str:
        value = _ID.sub(lambda m: self._name(m.group(0), m.group(1)), value)
        value = _UUID.sub(lambda m: self._name(m.group(0), "uuid"), value)
        value = _PORT.sub(lambda m: self._name(m.group(0), "addr"), value)
        return _TMP.sub("<tmp>", value.replace(str(REPO_ROOT), "<repo>"))

    def value(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self.value(v, k) for k, v in value.items() if k not in _VOLATILE_KEYS}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if key == "room" and isinstance(value, int):
            return "<room>"
        if isinstance(value, str):
            if key == "data" and value.startswith("{"):
                return self.value(json.loads(value))
            return self.text(value)
        return value


def coalesce(events: list[list[Any]]) -> list[list[Any]]:
    """A streamed answer without its chunking, which is timing: the engine client merges the
    chunks that are waiting when it reads. The engine's chunks become one `tokens*` entry (all
    ids, the last counts) where the first was, and each run of deltas to one block one delta."""
    out: list[list[Any]] = []
    merged: dict[str, Any] | None = None
    for kind, payload in events:
        if kind == "tokens" and payload.get("finish_reason") is None:
            if merged is None:
                merged = {**payload, "ids": []}
                out.append(["tokens*", merged])
            merged.update({**payload, "ids": merged["ids"] + payload["ids"]})
            continue
        event = payload.get("event") if kind == "block" else None
        if event is not None and event.get("type") == "content_block_delta" and out:
            last = out[-1][1].get("event") if out[-1][0] == "block" else None
            if (
                last is not None
                and last.get("type") == "content_block_delta"
                and last["index"] == event["index"]
                and last["delta"]["type"] == event["delta"]["type"]
            ):
                delta = last["delta"]
                for key, value in event["delta"].items():
                    if key != "type" and isinstance(value, str):
                        delta[key] = delta.get(key, "") + value
                continue
            out.append([kind, {**payload, "event": {**event, "delta": dict(event["delta"])}}])
            continue
        if kind == "completed":
            payload = {k: v for k, v in payload.items() if k != "bytes_sent"}  # SSE framing of each chunk
        out.append([kind, payload])
    return out


def _line(group: str, name: str, reader: JournalReader, rid: str) -> dict[str, Any]:
    events = reader.raw_events(reader.resolve(rid))
    norm = Normaliser()
    out = []
    for _, kind, _, payload in events:
        if kind == "received":
            payload = {"method": payload.get("method"), "path": payload.get("path"), "body": payload.get("body")}
        out.append([kind, norm.value(payload)])
    if name.endswith("-stream"):
        out = coalesce(out)
    return {"group": group, "request": name, "kinds": [k for k, _ in out], "events": out}


def _send(client: httpx.Client, rid: str, path: str, body: dict[str, Any]) -> None:
    with client.stream("POST", path, json=body, headers={"x-request-id": rid}) as response:
        response.read()


def traffic(client: httpx.Client, control: EngineControl | None, model: str, group: str) -> list[str]:
    """Send the fixed set; the engine is scripted per request. Returns the request ids in order."""
    sent: list[str] = []
    for name, (script, fields) in SCENARIOS.items():
        if group == "zmq" and name in _ZMQ_SKIPPED:
            continue
        for stream in (False, True):
            rid = f"{group}-{name}-{'stream' if stream else 'plain'}"
            if control is not None:
                control.reset()
                control.script(script)
            body = {"model": model, "max_tokens": 32, "temperature": 0, **fields, "stream": stream,
                    "messages": [{"role": "user", "content": f"[{name}] please answer"}]}
            _send(client, rid, "/v1/messages", body)
            sent.append(rid)
    user = [{"role": "user", "content": "hi"}]
    for rid, path, body in (
        (f"{group}-zero", "/v1/messages", {"model": model, "max_tokens": 0, "messages": user}),
        (f"{group}-count", "/v1/messages/count_tokens", {"model": model, "messages": user}),
        (f"{group}-rejected", "/v1/messages", {"model": model}),
    ):
        _send(client, rid, path, body)
        sent.append(rid)
    return sent


def _wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 60
    while client.get("/readiness").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("gateway not ready")
        time.sleep(0.1)


def _wait_completed(journal: Path, rid: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with JournalReader(journal) as reader:
                events = reader.raw_events(rid)
        except JournalNotFound:
            events = []
        if events and events[-1][1] == "completed":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{rid} not completed in the journal")
        time.sleep(0.05)


def _report(journal: Path, group: str, rids: list[str]) -> Iterator[dict[str, Any]]:
    for rid in rids:
        _wait_completed(journal, rid)
    with JournalReader(journal) as reader:
        for rid in rids:
            yield _line(group, rid.removeprefix(group + "-"), reader, rid)


def run_grpc(stack: ExitStack, tmp: Path) -> Iterator[dict[str, Any]]:
    extra = ["--served-model-name", MODEL, "--max-context-length", "4096"]
    engine = stack.enter_context(spawn_engine("sglang", model_path=QWEN3, extra=extra))
    journal = tmp / "grpc.db"
    gateway = stack.enter_context(spawn_gateway([engine.url], journal=journal,
                                                extra=["--model-path", str(QWEN3), "--disable-retries"]))
    control = stack.enter_context(EngineControl(engine.url.split("://", 1)[1]))
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        _wait_ready(client)
        rids = traffic(client, control, MODEL, "grpc")
    yield from _report(journal, "grpc", rids)


def run_pd(stack: ExitStack, tmp: Path) -> Iterator[dict[str, Any]]:
    legs: dict[str, Spawned] = {}
    for role in ("prefill", "decode"):
        extra = ["--served-model-name", MODEL, "--role", role, "--max-context-length", "4096"]
        legs[role] = stack.enter_context(spawn_engine("sglang", model_path=QWEN3, extra=extra))
    journal = tmp / "pd.db"
    gateway = stack.enter_context(spawn_gateway(
        [], journal=journal,
        extra=["--pd-disaggregation", "--prefill", legs["prefill"].url, "9123", "--decode", legs["decode"].url,
               "--model-path", str(QWEN3), "--disable-retries"],
    ))
    control = stack.enter_context(EngineControl(legs["decode"].url.split("://", 1)[1]))
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        _wait_ready(client)
        rids = traffic(client, control, MODEL, "pd")
    yield from _report(journal, "pd", rids)


def run_zmq(stack: ExitStack, tmp: Path) -> Iterator[dict[str, Any]]:
    sockets = Path(tempfile.mkdtemp(prefix="smg-seq-"))
    stack.callback(shutil.rmtree, sockets, True)
    path = sockets / "w0"
    journal = tmp / "zmq.db"
    gateway = stack.enter_context(spawn_gateway(
        [f"ipc://{path}"], journal=journal,
        extra=["--backend", "vllm", "--model-path", QWEN3_RELATIVE, "--model-alias", f"{MODEL}={QWEN3_RELATIVE}",
               "--disable-retries"],
    ))
    engine = stack.enter_context(spawn_zmq_engine(path, QWEN3, ["--max-model-len", "4096"]))
    control = stack.enter_context(EngineControl(engine.url.split("://", 1)[1]))
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        _wait_ready(client)
        rids = traffic(client, control, MODEL, "zmq")
    yield from _report(journal, "zmq", rids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--groups", default="grpc,pd,zmq", help="which deployments to run (comma-separated)")
    args = parser.parse_args(argv)
    runs = {"grpc": run_grpc, "pd": run_pd, "zmq": run_zmq}
    tmp = Path(tempfile.mkdtemp(prefix="smg-seq-journal-"))
    try:
        for group in args.groups.split(","):
            with ExitStack() as stack:
                for line in runs[group](stack, tmp):
                    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
