"""Replay of journaled requests and the terminal inspector.

This package reads the journal (`journal`) and reuses the gateway's pipeline and protocol
models (`smg.pipeline`, `smg.protocol`), never the server. `smg replay` and `smg inspect` are
built here with the journal-as-a-product work; until then the journal is read with
`smg journal ls` and `smg journal show`.
"""
