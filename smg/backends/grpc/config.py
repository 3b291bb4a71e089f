"""The engine connector's settings that `smg launch` exposes (gRPC and ZMQ workers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from smg.flags import option


@dataclass(frozen=True)
class EngineConfig:
    # A worker just added (or just started) is still having its tokenizer fetched and loaded;
    # a request for its model that arrives meanwhile waits for it rather than being turned
    # away, within the request's own deadline. Past this wait it gets the spec's 503.
    tokenizer_wait_secs: float = field(
        default=10.0,
        metadata=option(
            "--tokenizer-wait-secs",
            "A request for a model whose tokenizer is still loading waits this long for it (within its deadline), "
            "then is answered 503 tokenizer_not_ready; 0 answers at once.",
        ),
    )
    # Encode caches (`smg.pipeline.tokenizers.cache`), off by default as in the reference.
    tokenizer_cache_l0: bool = field(
        default=False,
        metadata=option(
            "--tokenizer-cache-enable-l0",
            "Keep the token ids of whole prompt texts: a text seen again is not tokenized again.",
        ),
    )
    tokenizer_cache_l0_max_entries: int = field(
        default=10000,
        metadata=option("--tokenizer-cache-l0-max-entries", "Texts the L0 cache keeps (least recently used out)."),
    )
    tokenizer_cache_l1: bool = field(
        default=False,
        metadata=option(
            "--tokenizer-cache-enable-l1",
            "Keep the token ids of prompt prefixes that end at a special token: a prompt that starts with one "
            "(the next turn of a conversation, an agent's system prompt and tools) is tokenized from there on.",
        ),
    )
    tokenizer_cache_l1_max_memory: int = field(
        default=52428800,
        metadata=option("--tokenizer-cache-l1-max-memory", "Bytes of token ids the L1 cache keeps at most."),
    )

    def tokenizer_cache(self) -> tuple[int | None, int | None]:
        """`(L0 entries, L1 bytes)` for `TokenizerRegistry`; None where that cache is off."""
        return (
            self.tokenizer_cache_l0_max_entries if self.tokenizer_cache_l0 else None,
            self.tokenizer_cache_l1_max_memory if self.tokenizer_cache_l1 else None,
        )
