"""Start-up warnings about tenant names: settings that start fine but charge or ship requests
under names nobody will look for.

* A budget policy still naming the shared key's tenant the old way, `auth:<SHA-256 hex of the
  key>`: the name is now keyed (`tenants.shared_tenant`), so that policy entry never applies.
* `--api-key` on a replica that shares state (a Redis store for budgets, fleet slots or the
  worker registry; a fleet journal sink) without `$SMG_TENANT_SECRET`: each replica keys the
  shared key's tenant name with its own `smg-tenant.key`, so the replicas disagree on it (one
  budget per replica in Redis, one tenant per replica in the fleet journal).

Each is one warning at start, logged the way `smg.cli.launch` logs its others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

from smg.admission import Gates
from smg.admission.fleet import FleetLimiter
from smg.admission.redis_ledger import RedisLedger
from smg.admission.tenants import TENANT_SECRET_ENV

log = logging.getLogger("smg.launch")  # beside launch's other start-up warnings

_UNKEYED = re.compile(r"auth:[0-9a-f]{64}")


def warn_about_tenant_names(
    api_key: str | None, gates: Gates | None, *, worker_registry: str | None, journal_sink: str | None
) -> None:
    """Both warnings of this module, for `smg launch`."""
    warn_unkeyed_policy_tenants(api_key, gates)
    shared_with = [
        flag
        for flag, shared in (
            ("--tenant-rate-limit-state redis://", gates is not None and isinstance(_ledger(gates), RedisLedger)),
            ("--fleet-concurrency", gates is not None and isinstance(gates.limiter, FleetLimiter)),
            ("--worker-registry", worker_registry is not None),
            ("--journal-sink", journal_sink is not None),
        )
        if shared
    ]
    warn_unshared_tenant_secret(api_key, shared_with)


def _ledger(gates: Gates) -> object:
    return gates.budgets.ledger if gates.budgets is not None else None


def warn_unkeyed_policy_tenants(api_key: str | None, gates: Gates | None) -> bool:
    """One warning when the budget policy has `auth:<64 hex>` tenant keys other than the shared
    key's name today: the unkeyed form of a key's name. True when it warned."""
    if gates is None or gates.budgets is None:
        return False
    current = gates.keys.shared_tenant
    old = [key for key in gates.budgets.policy.tenants if _UNKEYED.fullmatch(key) and key != current]
    if not old:
        return False
    shared = "auth:" + hashlib.sha256(api_key.encode()).hexdigest() if api_key else None
    names = ", ".join(f"{key[:17]}… (the shared key's old name)" if key == shared else f"{key[:17]}…" for key in old)
    log.warning(
        "the budget policy names %d tenant(s) by an unkeyed SHA-256 of a key (%s): tenant names are"
        " keyed with the tenant secret now (smg-tenant.key beside the journal, or $%s), so these"
        " entries never apply; the shared key's tenant is %s",
        len(old),
        names,
        TENANT_SECRET_ENV,
        current or "not set (no --api-key)",
    )
    return True


def warn_unshared_tenant_secret(api_key: str | None, shared_with: list[str]) -> bool:
    """One warning when `--api-key` is set, state is shared with other replicas (`shared_with`:
    the flags that share it) and `$SMG_TENANT_SECRET` is not set. True when it warned."""
    if not api_key or not shared_with or os.environ.get(TENANT_SECRET_ENV):
        return False
    log.warning(
        "--api-key with %s but $%s is not set: each replica names the shared key's tenant with a secret"
        " of its own (smg-tenant.key beside its journal), so replicas do not agree on it (budgets and"
        " the fleet journal count one tenant per replica); set $%s to the same value on every replica",
        " and ".join(shared_with),
        TENANT_SECRET_ENV,
        TENANT_SECRET_ENV,
    )
    return True
