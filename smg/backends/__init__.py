"""Backend adapters, one per worker kind. Each turns a validated call into events; none knows
about the HTTP server in front of it."""
