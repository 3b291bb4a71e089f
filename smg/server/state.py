"""What every handler shares: the settings, the router, the admission gates, the journal, the
CORS policy, and the request handler (the router inside the gates)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from journal.events import Event
from smg.admission import Gates
from smg.backends.base import Call
from smg.config import GatewayConfig
from smg.routing.router import Router
from smg.server.cors import CorsPolicy


@dataclass
class Gateway:
    config: GatewayConfig
    router: Router
    journal: Any  # journal.writer.JournalWriter | NullJournal
    cors: CorsPolicy
    admission: Gates
    handle: Callable[[Call], AsyncGenerator[Event, None]] = field(init=False)

    def __post_init__(self) -> None:
        self.handle = self.admission.wrap(self.router.handle, self.router.generates)
