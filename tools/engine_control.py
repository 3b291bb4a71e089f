"""The test's handle on a scripted gRPC engine: queue scripts, read what it received, steer it.

Speaks the engine's `tools.ScriptedEngine` control service (JSON bytes over unary gRPC calls)
on a synchronous channel, so tests and fixtures can use it outside an event loop.
"""

from __future__ import annotations

import json
from typing import Any, cast

import grpc

from tools.scripted_engine import CONTROL_SERVICE


class EngineControl:
    """Control calls to the scripted engine at `target` (`host:port` or `grpc://host:port`)."""

    def __init__(self, target: str, *, timeout: float = 10.0) -> None:
        self.target = target.removeprefix("grpc://").rstrip("/")
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.target)

    def _call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        rpc = self._channel.unary_unary(f"/{CONTROL_SERVICE}/{method}")
        answer = rpc(json.dumps(body or {}).encode(), timeout=self.timeout)
        return cast(dict[str, Any], json.loads(answer))

    def script(self, *scripts: dict[str, Any], default: dict[str, Any] | None = None) -> None:
        """Queue `scripts` for the next Generate calls; `default` answers once they run out.

        A script with `"when_prompt_contains": str` answers only a Generate whose prompt (decoded
        with special tokens kept) contains that string; with `"repeat": True` it stays queued
        after use. Each Generate takes the first queued script that matches, else `default`.
        """
        body: dict[str, Any] = {"scripts": list(scripts)}
        if default is not None:
            body["default"] = default
        self._call("Script", body)

    def received(self) -> list[dict[str, Any]]:
        """Every GenerateRequest the engine received, as dicts, in order."""
        return cast(list[dict[str, Any]], self._call("Received")["requests"])

    def encoded(self) -> list[dict[str, Any]]:
        """Every EncodeRequest an encode worker (`--role encode`) received, as dicts, in order."""
        return cast(list[dict[str, Any]], self._call("Encoded")["requests"])

    def fail_encode(self, code: str = "INTERNAL", message: str = "", *, accepted: bool = True) -> None:
        """Make the next Encode fail with `code` (`accepted=False`: answer it not accepted)."""
        self._call("EncodeFailure", {"code": code, "message": message} if accepted else {"accepted": False})

    def aborts(self) -> list[str]:
        """The request ids named by Abort calls, in order."""
        return cast(list[str], self._call("Aborts")["request_ids"])

    def cancelled(self) -> list[str]:
        """The request ids of Generate calls the client cancelled, in order."""
        return cast(list[str], self._call("Cancelled")["request_ids"])

    def trace_context(self) -> list[dict[str, str]]:
        """The `traceparent`/`tracestate` metadata of each Generate call, in order."""
        return cast(list[dict[str, str]], self._call("TraceContext")["metadata"])

    def reset(self) -> None:
        """Clear scripts, records and health, and release held streams."""
        self._call("Reset")

    def release(self) -> None:
        """Let streams waiting at `hold_after` go on."""
        self._call("Release")

    def health(self, healthy: bool) -> None:
        """Make HealthCheck answer healthy or not."""
        self._call("SetHealth", {"healthy": healthy})

    def die(self) -> None:
        """The scripted ZMQ engine: send `ENGINE_CORE_DEAD` and exit."""
        self._call("Die")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EngineControl:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
