"""Secrets written to the fleet's shared state: sealed (AES-256-GCM) under a key every replica
derives from `$SMG_TENANT_SECRET` (HKDF-SHA256, one key per purpose), so the server and its
change feed hold only ciphertext. Without the variable nothing can be sealed, and callers
refuse to write the secret at all."""

from __future__ import annotations

import base64
import os

TENANT_SECRET_ENV = "SMG_TENANT_SECRET"  # the fleet secret tenants are named with (smg.admission.tenants)


class Unsealable(ValueError):
    """No fleet secret to seal with, or a value this replica's secret does not open."""


def _key(purpose: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = os.environ.get(TENANT_SECRET_ENV)
    if not secret or len(secret.encode()) < 16:
        raise Unsealable(f"${TENANT_SECRET_ENV} (at least 16 bytes, the same on every replica) is not set")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"smg sealed: " + purpose).derive(secret.encode())


def seal(value: str, purpose: bytes, context: str) -> str:
    """`value` sealed for `purpose`, bound to `context` (opened only with the same). Raises Unsealable."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    sealed = AESGCM(_key(purpose)).encrypt(nonce, value.encode(), context.encode())
    return base64.b64encode(nonce + sealed).decode()


def unseal(token: str, purpose: bytes, context: str) -> str:
    """Raises Unsealable."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        raw = base64.b64decode(token, validate=True)
        return AESGCM(_key(purpose)).decrypt(raw[:12], raw[12:], context.encode()).decode()
    except (InvalidTag, ValueError) as exc:
        if isinstance(exc, Unsealable):
            raise
        raise Unsealable(f"a sealed value this replica's ${TENANT_SECRET_ENV} does not open") from None
