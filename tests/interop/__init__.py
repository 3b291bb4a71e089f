"""Opt-in interop tests against real inference engines (``make test-vllm``)."""
