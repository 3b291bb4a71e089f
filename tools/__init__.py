"""Developer tools: the scripted worker, process helpers, benchmarks."""
