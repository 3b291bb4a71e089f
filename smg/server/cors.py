"""CORS. Without `--cors-allowed-origins` any origin, method and header is allowed; with it,
only the listed origins, and only the headers a browser client of the Messages API needs
(`x-api-key` deliberately not among them)."""

from __future__ import annotations

from collections.abc import Mapping

_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
_HEADERS = "Content-Type, Authorization, anthropic-version, anthropic-beta"


class CorsPolicy:
    def __init__(self, allowed_origins: tuple[str, ...]) -> None:
        self._origins = frozenset(allowed_origins)
        self._open = not allowed_origins or "*" in self._origins

    def response_headers(self, request_headers: Mapping[str, str], preflight: bool) -> dict[str, str]:
        origin = request_headers.get("origin")
        if not origin:
            return {}
        if self._open:
            headers = {"access-control-allow-origin": "*", "access-control-expose-headers": "*"}
            if preflight:
                headers["access-control-allow-methods"] = request_headers.get("access-control-request-method") or "*"
                headers["access-control-allow-headers"] = request_headers.get("access-control-request-headers") or "*"
                headers["access-control-max-age"] = "3600"
            return headers
        if origin not in self._origins:
            return {}
        headers = {
            "access-control-allow-origin": origin,
            "access-control-expose-headers": "x-request-id",
            "vary": "Origin",
        }
        if preflight:
            headers["access-control-allow-methods"] = _METHODS
            headers["access-control-allow-headers"] = _HEADERS
            headers["access-control-max-age"] = "3600"
        return headers
