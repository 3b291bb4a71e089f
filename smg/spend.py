"""Spend settings: the operator's price table (`journal.prices`), declared once as a flag.

The table gives every completed request its cost in the journal (the writer's fold), which
`smg journal stats` sums and the inspector shows. No table, no cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from journal.prices import PriceTable, PriceTableError, load
from smg.flags import option


@dataclass(frozen=True)
class SpendConfig:
    """Where the price table is (a TOML or JSON file the operator keeps)."""

    price_table: str | None = field(
        default=None,
        metadata=option(
            "--price-table",
            "TOML or JSON file of prices per model (exact names or glob patterns) in dollars per million input,"
            " output, cache-read and cache-write tokens: every completed request's cost_usd in the journal."
            " Without it no request has a cost.",
        ),
    )

    def load(self) -> PriceTable | None:
        """The table, None without one. Raises ValueError (a `PriceTableError`) for a bad file."""
        return load(self.price_table) if self.price_table else None


__all__ = ["PriceTableError", "SpendConfig"]
