"""The operator's price table, and what a request cost by it.

A price table names models (exactly, or by a `*`/`?` glob pattern, matched case-sensitively)
and their prices in US dollars per million tokens: `input`, `output`, `cache_read` (cached
prompt tokens read) and `cache_write` (prompt tokens written to the cache). A TOML or JSON file:

    [models."claude-sonnet-4*"]
    input = 3.0
    output = 15.0
    cache_read = 0.3
    cache_write = 3.75

An exact name wins over a pattern; among patterns, the first in the file. A price left out is
0. A model the table does not name has no price, and its requests no cost (NULL, never 0): there
is no default table. The cost of a request is its usage (`input_tokens` being the prompt tokens
not read from or written to the cache, as the Messages API counts them) times those prices.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_KINDS = ("input", "output", "cache_read", "cache_write")


class PriceTableError(ValueError):
    """The price table cannot be read or says something that is not a price."""


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per million tokens of each kind."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        """What these token counts cost, in dollars."""
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_read * self.cache_read
            + cache_write * self.cache_write
        ) / 1_000_000


@dataclass(frozen=True)
class PriceTable:
    """Models (names or glob patterns, in file order) and their prices."""

    exact: Mapping[str, Price]
    patterns: tuple[tuple[str, Price], ...] = ()

    def price(self, model: str | None) -> Price | None:
        """The price of `model`, None when the table does not name it."""
        if not model:
            return None
        found = self.exact.get(model)
        if found is not None:
            return found
        for pattern, price in self.patterns:
            if fnmatch.fnmatchcase(model, pattern):
                return price
        return None

    def cost(self, model: str | None, usage: Mapping[str, Any]) -> float | None:
        """What a request of `model` with `usage` (`input_tokens`, `output_tokens`,
        `cache_read_input_tokens`, `cache_creation_input_tokens`; absent counts are 0) cost,
        in dollars; None when the model has no price."""
        price = self.price(model)
        if price is None:
            return None
        return price.cost(
            _count(usage.get("input_tokens")),
            _count(usage.get("output_tokens")),
            _count(usage.get("cache_read_input_tokens")),
            _count(usage.get("cache_creation_input_tokens")),
        )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def parse(data: Mapping[str, Any], source: str = "price table") -> PriceTable:
    """A `PriceTable` from the decoded file (`{"models": {name: {kind: price}}}`)."""
    models = data.get("models")
    if not isinstance(models, Mapping) or set(data) - {"models"}:
        raise PriceTableError(f"{source}: expected a `models` table of model names and their prices, and nothing else")
    exact: dict[str, Price] = {}
    patterns: list[tuple[str, Price]] = []
    for name, prices in models.items():
        if not isinstance(prices, Mapping):
            raise PriceTableError(f"{source}: {name!r}: expected a table of prices ({', '.join(_KINDS)})")
        unknown = set(prices) - set(_KINDS)
        if unknown:
            raise PriceTableError(
                f"{source}: {name!r}: unknown price {sorted(unknown)[0]!r}; one of {', '.join(_KINDS)}"
            )
        values: dict[str, float] = {}
        for kind, value in prices.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or value != value:
                raise PriceTableError(f"{source}: {name!r}: {kind} must be a number of dollars, 0 or more")
            values[kind] = float(value)
        price = Price(**values)
        if any(c in name for c in "*?["):
            patterns.append((name, price))
        else:
            exact[name] = price
    return PriceTable(exact, tuple(patterns))


def load(path: str | Path) -> PriceTable:
    """Read a price table file: TOML, or JSON when its name ends in `.json`. Raises `PriceTableError`."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise PriceTableError(f"cannot read the price table {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PriceTableError(
            f"{path} is not a {'JSON' if path.suffix.lower() == '.json' else 'TOML'} price table: {exc}"
        ) from None
    if not isinstance(data, Mapping):
        raise PriceTableError(f"{path}: expected a `models` table")
    return parse(data, str(path))
