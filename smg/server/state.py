"""What every handler shares: the settings, the backend, the journal, the CORS policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smg.backends.base import Backend
from smg.config import GatewayConfig
from smg.server.cors import CorsPolicy


@dataclass
class Gateway:
    config: GatewayConfig
    backend: Backend
    journal: Any  # journal.writer.JournalWriter | NullJournal
    cors: CorsPolicy
