"""What every handler shares: the settings, the router, the journal, the CORS policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smg.config import GatewayConfig
from smg.routing.router import Router
from smg.server.cors import CorsPolicy


@dataclass
class Gateway:
    config: GatewayConfig
    router: Router
    journal: Any  # journal.writer.JournalWriter | NullJournal
    cors: CorsPolicy
