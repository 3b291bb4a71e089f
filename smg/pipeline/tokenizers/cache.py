"""Encode caches (`--tokenizer-cache-enable-l0`, `--tokenizer-cache-enable-l1`): token ids a
tokenizer has computed, served again instead of tokenizing the same text twice.

A conversation's prompt is re-rendered and re-tokenized on every turn, and an agent's system
prompt and tool definitions (thousands of tokens) open every one of its requests.

* **L0** maps a whole text (by its digest) to its ids, up to `l0_max_entries` texts, the least
  recently used given up first: a text seen again (a retry, `count_tokens` then the request)
  costs a digest.
* **L1** maps a text's prefixes that end right after a special token (`<|im_end|>`,
  `<|im_start|>`, …) to their ids, up to `l1_max_bytes` of ids: a text that begins with one is
  tokenized from there on only. That is exact because a tokenizer splits its text at added
  tokens before anything else and encodes each piece on its own: the ids of `prefix + rest`
  are the prefix's ids followed by the rest's. Not every tokenizer and token keeps that
  promise (a token that strips the whitespace beside it, a normalizer that treats the text's
  first piece apart), so each special token is probed when the cache is made, and only those
  whose split gives the very ids of the whole are used as boundaries. Cached or not, a text
  has the same ids: counts do not change.

Each prefix entry holds its ids as 32-bit integers; the lookups and inserts take a lock (long
texts are tokenized on worker threads).
"""

from __future__ import annotations

import hashlib
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

MIN_CHARS = 256
"""Shorter texts are tokenized about as fast as they are looked up, and are not cached."""
_STORED_PER_TEXT = 4
"""Prefixes of one text kept in L1: its last boundaries (where the next turn continues)…"""
_SHARED_PREFIX_CHARS = 1024
"""…and its first boundary past this many characters (a system prompt with its tools)."""
_PROBES = (("Hello", " world\n"), ("a\n\n", "\n b"), ("x", "y"), ("", " z "), ("1 ", "  2"))

Encode = Callable[[str], list[int]]


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def safe_boundaries(encode: Encode, special: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The special tokens after which `encode` splits exactly (see the module docstring)."""
    safe: dict[str, int] = {}
    for text, token_id in special:
        if not text or encode(text) != [token_id]:
            continue
        for before, after in _PROBES:
            whole = encode(before + text + after)
            if whole != encode(before + text) + encode(after):
                break
            if encode(before + text + text + after) != encode(before + text) + [token_id] + encode(after):
                break
        else:
            safe[text] = token_id
    return safe


class EncodeCache:
    """The L0 and L1 caches of one tokenizer (either may be off: None)."""

    def __init__(
        self,
        encode: Encode,
        *,
        l0_max_entries: int | None,
        l1_max_bytes: int | None,
        added: Sequence[tuple[str, int]] = (),
        boundaries: dict[str, int] | None = None,
    ) -> None:
        """`encode`: the tokenizer's own. `added`: every added token (text, id), which the
        tokenizer matches before anything else; `boundaries`: those of them L1 may split after
        (`safe_boundaries`)."""
        self._encode = encode
        self._l0_max = l0_max_entries if l0_max_entries and l0_max_entries > 0 else None
        self._l1_max = l1_max_bytes if l1_max_bytes and l1_max_bytes > 0 else None
        self._l0: OrderedDict[bytes, array[int]] = OrderedDict()
        self._l1: OrderedDict[bytes, array[int]] = OrderedDict()
        self._l1_bytes = 0
        self._lock = threading.Lock()
        self._boundaries = boundaries or {}
        added_texts = sorted({t for t, _ in added if t} | set(self._boundaries), key=len, reverse=True)
        # Leftmost, longest first, as the tokenizer matches its added tokens.
        self._added = re.compile("|".join(map(re.escape, added_texts))) if added_texts else None
        self._id_of = {t: i for t, i in added if t} | self._boundaries
        self._added_ids = frozenset(self._id_of.values())
        self.hits_l0 = 0
        self.hits_l1 = 0
        self.misses = 0

    @property
    def l1_bytes(self) -> int:
        return self._l1_bytes

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, from the caches where they hold it or its longest prefix."""
        if len(text) < MIN_CHARS:
            return self._encode(text)
        key = b""
        if self._l0_max is not None:
            key = _digest(text.encode("utf-8", "surrogatepass"))
            with self._lock:
                found = self._l0.get(key)
                if found is not None:
                    self._l0.move_to_end(key)
                    self.hits_l0 += 1
                    return found.tolist()
        ids = self._l1_encode(text) if self._l1_max is not None and self._boundaries else None
        if ids is None:
            self.misses += 1
            ids = self._encode(text)
        if self._l0_max is not None:
            self._keep_l0(key, ids)
        return ids

    def _keep_l0(self, key: bytes, ids: list[int]) -> None:
        try:
            stored = array("i", ids)
        except OverflowError:  # an id past 32 bits: not kept
            return
        with self._lock:
            self._l0[key] = stored
            self._l0.move_to_end(key)
            while len(self._l0) > self._l0_max:  # type: ignore[operator]
                self._l0.popitem(last=False)

    def _l1_encode(self, text: str) -> list[int] | None:
        """`text`'s ids through L1, keeping its boundary prefixes; None when it has no boundary."""
        assert self._added is not None
        ends: list[int] = []  # where each boundary prefix ends, in characters
        keys: list[bytes] = []
        rolling = hashlib.blake2b(digest_size=16)
        last = 0
        added: list[str] = []  # every added token the text holds, in order
        for match in self._added.finditer(text):
            added.append(match.group())
            if match.group() in self._boundaries:
                end = match.end()
                rolling.update(text[last:end].encode("utf-8", "surrogatepass"))
                last = end
                ends.append(end)
                keys.append(rolling.copy().digest())
        if not ends:
            return None
        start, prefix = 0, array("i")
        with self._lock:
            for index in range(len(keys) - 1, -1, -1):
                found = self._l1.get(keys[index])
                if found is not None:
                    self._l1.move_to_end(keys[index])
                    start, prefix = index + 1, found
                    break
        if start:
            self.hits_l1 += 1
            rest = self._encode(text[ends[start - 1] :])
            ids = prefix.tolist() + rest
        else:
            self.misses += 1
            rest = ids = self._encode(text)
        self._keep_l1(text, ids, ends, keys, start, len(ids) - len(rest), added)
        return ids

    def _keep_l1(
        self,
        text: str,
        ids: list[int],
        ends: list[int],
        keys: list[bytes],
        start: int,
        offset: int,
        added: list[str],
    ) -> None:
        """Keep the prefixes of `text` past its cached one (boundaries `start` on), their ids
        found after the matching added tokens' ids in `ids` (from `offset`: the rest's)."""
        chosen = set(range(max(start, len(ends) - _STORED_PER_TEXT), len(ends)))
        shared = next((i for i, end in enumerate(ends) if end >= _SHARED_PREFIX_CHARS), None)
        if shared is not None and shared >= start:
            chosen.add(shared)
        if not chosen:
            return
        # The added tokens past the cached prefix, in order, as the text and as the ids hold them:
        # they must be the same, one for one, or nothing is kept.
        tail = added[self._index_of_boundary(added, start) :]
        positions = [i + 1 for i in range(offset, len(ids)) if ids[i] in self._added_ids]
        if len(positions) != len(tail) or any(
            ids[p - 1] != self._id_of.get(t) for p, t in zip(positions, tail, strict=True)
        ):
            return
        cuts = [p for p, t in zip(positions, tail, strict=True) if t in self._boundaries]
        if len(cuts) != len(ends) - start:
            return
        entries: list[tuple[bytes, array[int]]] = []
        for index in sorted(chosen):
            try:
                entries.append((keys[index], array("i", ids[: cuts[index - start]])))
            except OverflowError:  # an id past 32 bits: not kept
                return
        with self._lock:
            for key, value in entries:
                if key in self._l1:
                    continue
                self._l1[key] = value
                self._l1_bytes += value.itemsize * len(value)
            while self._l1_bytes > self._l1_max and self._l1:  # type: ignore[operator]
                _, dropped = self._l1.popitem(last=False)
                self._l1_bytes -= dropped.itemsize * len(dropped)

    def _index_of_boundary(self, added: list[str], count: int) -> int:
        """How many of `added` come up to and including the `count`-th boundary token."""
        if count == 0:
            return 0
        seen = 0
        for index, token in enumerate(added):
            if token in self._boundaries:
                seen += 1
                if seen == count:
                    return index + 1
        return len(added)
