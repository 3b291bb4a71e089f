"""Replay: offline recomputation, replays against a live gateway, the structural diff."""
