"""What an operator watches: Prometheus metrics (`metrics`), OpenTelemetry traces (`tracing`),
structured log lines (`logs`), and their settings (`config`).

Like `smg.flags`, this package imports nothing of the rest of `smg`, so any layer may count or
open a span where its work runs; the server wires it up at start (`smg.server.observe`).
"""
