"""The tokenizer registry: which tokenizer serves which model, and why one is missing.

Entries are keyed by a time-ordered UUID and indexed by a unique name (the canonical model
id, or whatever name an operator registers through `POST /v1/tokenizers`). Loads run in a
thread and are deduplicated per name. A model without a usable tokenizer is answered per
the spec's three states: still loading (503 `tokenizer_not_ready`, `Retry-After: 1`), will
not load on its own (503 `tokenizer_load_failed`, naming the reason), or, with autoload
disabled, simply absent (500 `tokenizer_not_found`).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import secrets
import shutil
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.errors import ApiError

log = logging.getLogger("smg.tokenizers")

PENDING, PROCESSING, COMPLETED, FAILED = "pending", "processing", "completed", "failed"


def uuid7() -> str:
    """A UUID version 7 (time-ordered), as the reference gateway keys its tokenizers."""
    ms = time.time_ns() // 1_000_000
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= secrets.randbits(12) << 64
    value |= 0b10 << 62
    value |= secrets.randbits(62)
    return str(uuid.UUID(int=value))


@dataclass
class TokenizerEntry:
    id: str
    name: str
    source: str
    chat_template: str | None = None
    status: str = PENDING
    error: str | None = None
    tokenizer: Tokenizer | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "source": self.source}
        if self.tokenizer is not None:
            out["vocab_size"] = self.tokenizer.vocab_size
        return out

    def status_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "name": self.name, "status": self.status, "source": self.source}
        if self.tokenizer is not None:
            body["vocab_size"] = self.tokenizer.vocab_size
        if self.error:
            body["message"] = self.error
        return body


class TokenizerRegistry:
    """Every tokenizer the gateway holds or is loading, and the last failure per name."""

    def __init__(
        self,
        *,
        autoload: bool = True,
        bundle_dir: str | None = None,
        cache: tuple[int | None, int | None] = (None, None),
    ) -> None:
        """`bundle_dir`: where tokenizers fetched from workers are kept, by content hash, so a
        journaled request's tokenizer is still there to replay it (default: the user cache).
        `cache`: every loaded tokenizer's encode caches, `(L0 entries, L1 bytes)` (None: off;
        `smg.pipeline.tokenizers.cache`)."""
        self.autoload = autoload
        self._cache = cache
        self._entries: dict[str, TokenizerEntry] = {}  # by id
        self._by_name: dict[str, str] = {}  # name → id
        self._failures: dict[str, str] = {}  # name → why no tokenizer will load on its own
        self._tasks: set[asyncio.Task[None]] = set()
        self._bundle_dir = bundle_dir or default_bundle_dir()

    # lookups

    def lookup(self, key: str) -> TokenizerEntry | None:
        """By name first, then by id."""
        entry_id = self._by_name.get(key)
        if entry_id is not None:
            return self._entries.get(entry_id)
        return self._entries.get(key)

    def entries(self) -> list[TokenizerEntry]:
        return sorted(self._entries.values(), key=lambda e: e.name)

    def has(self, name: str) -> bool:
        entry = self.lookup(name)
        return entry is not None and entry.status == COMPLETED

    def get(self, model: str) -> Tokenizer:
        """The tokenizer for a served model, or the spec's refusal for its state."""
        entry = self.lookup(model)
        if entry is not None and entry.tokenizer is not None:
            return entry.tokenizer
        if entry is not None and entry.status in (PENDING, PROCESSING):
            raise ApiError(
                503,
                f"Tokenizer for model '{model}' is still loading; retry shortly",
                code="tokenizer_not_ready",
                headers={"Retry-After": "1"},
            )
        reason = self._failures.get(model)
        if reason is not None:
            raise ApiError(
                503,
                f"Tokenizer for model '{model}' is unavailable: {reason}. Register one with POST /v1/tokenizers "
                "or restart the worker with a usable tokenizer path",
                code="tokenizer_load_failed",
            )
        if not self.autoload:
            raise ApiError(500, f"Tokenizer not found for model: {model}", code="tokenizer_not_found")
        # Autoload is on and nothing has been tried yet: the worker's registration is on its way.
        raise ApiError(
            503,
            f"Tokenizer for model '{model}' is not loaded yet; retry shortly",
            code="tokenizer_not_ready",
            headers={"Retry-After": "1"},
        )

    # changes

    def note_failure(self, name: str, reason: str) -> None:
        """Record why `name` has no tokenizer and none will load without an operator."""
        if self.has(name):
            return
        self._failures[name] = reason
        log.warning("tokenizer for %s: %s", name, reason)

    def submit(self, name: str, source: str, chat_template: str | None = None) -> tuple[TokenizerEntry, bool]:
        """Start loading `source` under `name` in the background. Returns the entry and whether
        it is new (False: the name was already registered or loading — the load is shared)."""
        existing = self.lookup(name)
        if existing is not None and existing.name == name and existing.status != FAILED:
            return existing, False
        if existing is not None and existing.name == name:
            self._drop(existing)
        if os.path.exists(source):
            source = os.path.abspath(source)  # journaled as the tokenizer's source: replay loads it
        entry = TokenizerEntry(id=uuid7(), name=name, source=source, chat_template=chat_template)
        self._entries[entry.id] = entry
        self._by_name[name] = entry.id
        task = asyncio.get_running_loop().create_task(self._load(entry), name=f"smg-tokenizer-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return entry, True

    async def load(self, name: str, source: str, chat_template: str | None = None) -> TokenizerEntry:
        """Load and wait; a concurrent load of the same name is awaited, not repeated."""
        entry, _ = self.submit(name, source, chat_template)
        await entry.done.wait()
        return entry

    async def load_bundle(
        self, name: str, bundle: bytes, origin: str, chat_template: str | None = None
    ) -> TokenizerEntry:
        """Register a tokenizer from a worker's `GetTokenizer` zip."""
        existing = self.lookup(name)
        if existing is not None and existing.name == name and existing.status != FAILED:
            await existing.done.wait()
            return existing
        try:
            directory = await asyncio.to_thread(self._unpack, bundle)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            self.note_failure(name, f"the tokenizer bundle from {origin} could not be unpacked ({exc})")
            raise
        return await self.load(name, directory, chat_template)

    def remove(self, key: str) -> TokenizerEntry | None:
        entry = self.lookup(key)
        if entry is None:
            return None
        self._drop(entry)
        self._failures[entry.name] = "the tokenizer was removed"
        return entry

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # internals

    def _drop(self, entry: TokenizerEntry) -> None:
        self._entries.pop(entry.id, None)
        if self._by_name.get(entry.name) == entry.id:
            del self._by_name[entry.name]

    def _loaded(self, source: str, template: Path | None) -> Tokenizer:
        tokenizer = Tokenizer.load(source, template)
        tokenizer.enable_cache(*self._cache)  # its boundary probe tokenizes: on this thread too
        return tokenizer

    async def _load(self, entry: TokenizerEntry) -> None:
        entry.status = PROCESSING
        try:
            template = Path(entry.chat_template) if entry.chat_template else None
            entry.tokenizer = await asyncio.to_thread(self._loaded, entry.source, template)
        except asyncio.CancelledError:
            entry.status, entry.error = FAILED, "cancelled"
            raise
        except Exception as exc:  # a tokenizer directory can fail in many ways; all mean "did not load"
            entry.status, entry.error = FAILED, f"{type(exc).__name__}: {exc}"
            if self._by_name.get(entry.name) == entry.id:
                self._failures[entry.name] = f"loading from {entry.source} failed ({entry.error})"
            log.warning("tokenizer %s: loading from %s failed: %s", entry.name, entry.source, entry.error)
        else:
            entry.status = COMPLETED
            self._failures.pop(entry.name, None)
            log.info("tokenizer %s loaded from %s (vocab %d)", entry.name, entry.source, entry.tokenizer.vocab_size)
        finally:
            entry.done.set()

    def _unpack(self, bundle: bytes) -> str:
        digest = hashlib.sha256(bundle).hexdigest()[:32]
        directory = os.path.join(self._bundle_dir, digest)
        if not os.path.isdir(directory):
            os.makedirs(self._bundle_dir, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=f".{digest}-", dir=self._bundle_dir)
            try:
                root = os.path.realpath(staging)
                with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
                    for member in archive.infolist():
                        target = os.path.realpath(os.path.join(staging, member.filename))
                        if not target.startswith(root + os.sep):
                            raise ValueError(f"bundle member escapes its directory: {member.filename!r}")
                    archive.extractall(staging)
                os.replace(staging, directory)  # atomic: a concurrent unpack of the same bundle wins or loses whole
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not os.path.isdir(directory):
                    raise
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        # Bundles zip either the files or one directory holding them.
        entries = os.listdir(directory)
        if len(entries) == 1 and os.path.isdir(os.path.join(directory, entries[0])):
            return os.path.join(directory, entries[0])
        return directory


def default_bundle_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "smg", "tokenizers")
