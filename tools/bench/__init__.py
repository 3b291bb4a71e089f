"""Benchmarks for the relay: ``load`` generates the traffic, ``relay`` runs the scenarios and reports."""
