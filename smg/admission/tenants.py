"""Who is asking: the gateway keys (`--api-key`, `--tenant-api-key TENANT:KEY`) and the tenant
each request is charged to.

A request authenticates with `Authorization: Bearer <key>` (the scheme in any case; `x-api-key`
is never read: it belongs to the Anthropic API). Keys are compared by the SHA-256 of the
presented token, looked up in a table, so no byte of a key leaks through timing. The tenant, as
the reference gateway names it: a tenant key → `auth:<tenant_id>`; the shared key →
`auth:<HMAC-SHA256 hex of the key>`, keyed with the deployment's tenant secret
(`load_tenant_secret`: a random file beside the journal, so names stay stable across restarts
and processes, and a name is no offline oracle for a weak key the way a bare SHA-256 was);
no auth configured → the trusted tenant header
(`--trust-tenant-header`) as `header:<id>`, else `ip:<client address>`, else `anonymous`.

Admin routes (`/workers`, `/v1/tokenizers`) take the shared key only; with only tenant keys
configured nothing opens them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from journal.redact import SECRET_ENV, SECRET_FILE
from smg.flags import option
from smg.protocol.errors import ApiError
from smg.protocol.headers import bearer_token

_CHALLENGE = 'Bearer realm="data-plane"'
DEFAULT_TENANT_HEADER = "x-smg-tenant-id"
TENANT_SECRET_FILE = SECRET_FILE  # beside the journal, which keys its fingerprints with it too
# Replicas of a fleet keep journals of their own, so they share the secret through this instead:
# each would otherwise make its own file and the shared key would be a different tenant on each
# (three budgets in Redis, three names in the fleet journal).
TENANT_SECRET_ENV = SECRET_ENV


def load_tenant_secret(journal: Path | None) -> bytes:
    """The deployment's tenant secret: `smg-tenant.key` in the journal's directory (32 random
    bytes, created mode 0600 by the first gateway to start, read by every later one and by the
    other processes and gateways sharing that journal); without a journal, one per process.
    `$SMG_TENANT_SECRET`, when set, is the secret instead (every replica of a fleet sets the same
    one). Raises ValueError when the file cannot be made or read, or the variable is too short."""
    configured = os.environ.get(TENANT_SECRET_ENV)
    if configured is not None:
        if len(configured.encode()) < 16:
            raise ValueError(f"${TENANT_SECRET_ENV} is too short: give it at least 16 bytes (e.g. 32 random hex bytes)")
        return configured.encode()
    if journal is None:
        return secrets.token_bytes(32)
    path = Path(journal).resolve().parent / TENANT_SECRET_FILE
    try:
        if not path.exists():
            draft = path.with_name(f".{TENANT_SECRET_FILE}.{os.getpid()}")
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, secrets.token_bytes(32))
            finally:
                os.close(fd)
            try:
                os.link(draft, path)  # atomic: a gateway starting beside this one keeps the first file
            except FileExistsError:
                pass
            finally:
                draft.unlink()
        secret = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot keep the tenant secret {path}: {exc.strerror or exc}") from None
    if len(secret) < 16:
        raise ValueError(f"the tenant secret {path} is too short: remove it to have a new one made")
    return secret


def shared_tenant(api_key: str, secret: bytes) -> str:
    """The tenant of the shared key: `auth:` and the key's HMAC-SHA256 under `secret`."""
    return "auth:" + hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class TenantConfig:
    """`--tenant-api-key TENANT:KEY` (repeatable), `--trust-tenant-header`, `--tenant-header-name`."""

    api_keys: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "--tenant-api-key",
            "A tenant's own key, as TENANT:KEY, beside --api-key (repeatable). Its requests are "
            "charged to auth:TENANT; it does not open the admin routes.",
        ),
    )
    trust_header: bool = field(
        default=False,
        metadata=option(
            "--trust-tenant-header",
            "Without gateway keys, take the tenant from the --tenant-header-name header (behind a trusted proxy).",
        ),
    )
    header_name: str = field(
        default=DEFAULT_TENANT_HEADER, metadata=option("--tenant-header-name", "The trusted tenant header.")
    )


def parse_tenant_keys(entries: tuple[str, ...], api_key: str | None) -> dict[str, str]:
    """`TENANT:KEY` entries → {key: tenant id}. Raises ValueError (never echoing a key)."""
    out: dict[str, str] = {}
    shared = hashlib.sha256(api_key.encode()).digest() if api_key else None
    seen: dict[bytes, str] = {}
    for index, entry in enumerate(entries, 1):
        tenant, sep, key = entry.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not sep:
            raise ValueError(f"--tenant-api-key #{index}: expected TENANT:KEY (missing ':')")
        if not tenant:
            raise ValueError(f"--tenant-api-key #{index}: the tenant id is empty")
        if not key:
            raise ValueError(f"--tenant-api-key {tenant}: the key is empty")
        digest = hashlib.sha256(key.encode()).digest()
        if digest == shared:
            raise ValueError(f"--tenant-api-key {tenant}: the key is the shared --api-key")
        if digest in seen:
            raise ValueError(f"--tenant-api-key {tenant}: the same key as tenant {seen[digest]}")
        seen[digest] = tenant
        out[key] = tenant
    return out


@dataclass(frozen=True)
class Caller:
    """An authenticated (or, without keys, an identified) caller."""

    tenant: str
    shared: bool  # presented the shared key (or no auth is configured): may use admin routes


class Keys:
    """The gateway's keys, by SHA-256 digest."""

    def __init__(
        self, api_key: str | None, tenant_keys: Mapping[str, str], config: TenantConfig, secret: bytes | None = None
    ) -> None:
        """`secret`: the tenant secret the shared key's tenant name is keyed with
        (`load_tenant_secret`; None: one for this object alone)."""
        self._table: dict[bytes, Caller] = {}
        for key, tenant in tenant_keys.items():
            self._table[hashlib.sha256(key.encode()).digest()] = Caller("auth:" + tenant, shared=False)
        self.shared_tenant: str | None = None
        """The shared key's tenant name (None without `--api-key`)."""
        if api_key:
            digest = hashlib.sha256(api_key.encode()).digest()
            tenant = shared_tenant(api_key, secret if secret is not None else secrets.token_bytes(32))
            self._table[digest] = Caller(tenant, shared=True)
            self.shared_tenant = tenant
        self._config = config

    @property
    def enabled(self) -> bool:
        return bool(self._table)

    def caller(self, headers: Mapping[str, str], client_ip: str | None) -> Caller:
        """The caller of a serving route (Messages, models). Raises the 401."""
        if not self._table:
            return Caller(self._anonymous(headers, client_ip), shared=True)
        token = bearer_token(headers.get("authorization"))
        if token is None:
            hint = (
                " This request carried only `x-api-key`, which the gateway does not read; "
                "the gateway key goes in `Authorization: Bearer <key>`."
                if headers.get("x-api-key")
                else ""
            )
            raise ApiError(
                401,
                "Missing API key: send it as `Authorization: Bearer <key>`." + hint,
                code="invalid_api_key",
                minted=False,
                headers={"WWW-Authenticate": _CHALLENGE},
            )
        found = self._table.get(hashlib.sha256(token.encode()).digest())
        if found is None:
            raise _invalid()
        return found

    def admin(self, headers: Mapping[str, str]) -> None:
        """Admin routes: the shared key only. A tenant key is refused like a wrong one, so with
        only tenant keys configured no credential opens them."""
        if not self._table:
            return
        if not self.caller(headers, None).shared:
            raise _invalid()

    def tenant(self, headers: Mapping[str, str], client_ip: str | None) -> str:
        """The tenant to journal a request under; an unauthenticated one is known by its address."""
        try:
            return self.caller(headers, client_ip).tenant
        except ApiError:
            return f"ip:{client_ip}" if client_ip else "anonymous"

    def _anonymous(self, headers: Mapping[str, str], client_ip: str | None) -> str:
        if self._config.trust_header:
            value = (headers.get(self._config.header_name.lower()) or "").strip()
            if value:
                return "header:" + value
        return f"ip:{client_ip}" if client_ip else "anonymous"


def _invalid() -> ApiError:
    return ApiError(
        401,
        "Invalid API key",
        code="invalid_api_key",
        minted=False,
        headers={"WWW-Authenticate": _CHALLENGE + ', error="invalid_token"'},
    )
