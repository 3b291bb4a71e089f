"""State the replicas of a fleet share in Redis: the connection and its health (`link`).

Its users live with their concern: tenant budgets (`smg.admission.redis_ledger`), fleet-wide
concurrency slots (`smg.admission.fleet`), the worker registry (`smg.routing.shared_registry`).
This package imports nothing of the gateway but `smg.flags`, so any layer may use it.
"""
