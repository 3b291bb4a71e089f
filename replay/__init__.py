"""Replay of journaled requests and the terminal inspector.

This package reads the journal (`journal`) and reuses the gateway's pipeline and protocol
models (`smg.pipeline`, `smg.protocol`, the sans-IO `smg.projection`), never the server or
the backends. `smg replay`: `replay.offline` recomputes a gRPC generation from its recorded
engine tokens, `replay.remote` sends a recorded request to a live gateway or worker, and
`replay.diff` compares two responses. `smg inspect`: `replay.inspector`.
"""
