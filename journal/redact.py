"""Secrets never reach the journal in clear.

Secrets are, by rule rather than by list: the values of headers whose name says they carry a
credential (`credential_header`: a word of the name is `auth`, `key`, `token`, `secret`,
`password`, `cookie`, `credential`, `session`, `signature`…, unless the name ends in `-id`, an
identifier such as a session or request id), query parameters that look like credentials
(`redact_query`), and in request bodies the MCP servers' `authorization_token` and the
credentials of every http(s) URL in a string (userinfo, credential-like query parameters;
`redact_url`). A secret is replaced by
`[redacted sha256:<12 hex>]`: the first 12 hex digits of the HMAC-SHA256 of the value keyed
with the deployment's secret (`key`: `smg-tenant.key` beside the journal or
`$SMG_TENANT_SECRET`, the secret tenant names are keyed with; `read_secret`), or of its bare
SHA-256 without one (files written before), so an operator can tell two keys apart (or match
one they hold, `key_fingerprints`) without the journal storing anything usable, nor anything
a weak key could be guessed from offline. `redacted(event)` is applied once, by the writer, before an
event is queued (a `received` body over the writer's bound is left to `redacted_body`, which its
thread applies before the event is stored): whoever emits events needs no redaction of their own. The functions are
idempotent (a redacted value is left as it is).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

import orjson

from journal.bodies import fingerprint
from journal.events import Event, Received, Upstream, Validated

SCAN_WINDOW_CHARS = 1 << 20
"""How much of a body one substring search of the redaction covers at most."""
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie"})
"""The credential headers every client and worker kind uses; `credential_header` covers the rest."""
# A word of a header name (split at `-`, `_`, `.`) that says the value opens something.
_CREDENTIAL_WORDS = frozenset(
    {
        "auth", "authorization", "authentication", "key", "apikey", "token", "secret", "password", "passwd",
        "pwd", "cookie", "credential", "credentials", "session", "signature", "sig", "jwt", "bearer", "csrf",
        "xsrf", "otp",
    }
)  # fmt: skip
# Inside a word run together (`x-apikey`, `accesstoken`, `clientsecret`).
_CREDENTIAL_PARTS = ("authoriz", "apikey", "secret", "passw", "cookie", "credential", "bearer")
_CREDENTIAL_ENDINGS = ("key", "token")
# Named like credentials, but the gateway (and its readers) need them as sent.
_NOT_CREDENTIALS = frozenset({"idempotency-key"})
# Named like credentials, but they only route or describe: the gateway's own headers
# (`x-smg-routing-key`), the SDKs' telemetry (`x-stainless-session`), session affinity
# (`x-session-affinity`) and cache keys (`x-cache-key`). A replay must send them as recorded, or
# it lands on another worker and its diff misleads.
_NOT_CREDENTIAL_PREFIXES = ("x-smg-", "x-stainless-")
_ROUTING_WORD = "affinity"
_CACHE_WORD = "cache"
_WORD_SPLIT = re.compile(r"[-_.\s]+")
_PREFIX = "[redacted sha256:"
_TOKEN_KEY = "authorization_token"
# The key as a JSON string with any of its characters escaped (`\\u0061` for `a`); IGNORECASE
# is for the hex digits, and the over-match it allows only costs a parse.
_ESCAPED_KEY = re.compile('"' + "".join(f"(?:{c}|\\\\u00{ord(c):02x})" for c in _TOKEN_KEY) + '"', re.IGNORECASE)


SECRET_FILE = "smg-tenant.key"
"""The deployment's secret, in the journal's directory (made by the gateway, `smg.admission.tenants`)."""
SECRET_ENV = "SMG_TENANT_SECRET"
"""The secret instead of the file: every replica of a fleet sets the same one."""
_KEY_HEADER_PREFIXES = ("", "Bearer ")  # how a caller's key appears in `x-api-key` / `authorization`


def _digest(value: str, key: bytes | None) -> str:
    data = value.encode("utf-8", "surrogatepass")
    if key is None:
        return hashlib.sha256(data).hexdigest()[:12]
    return hmac.new(key, data, hashlib.sha256).hexdigest()[:12]


def redact_value(value: str, key: bytes | None = None) -> str:
    """The redacted form of one secret value (unchanged if already redacted), keyed with `key`."""
    if value.startswith(_PREFIX):
        return value
    return f"{_PREFIX}{_digest(value, key)}]"


def read_secret(journal: str | os.PathLike[str]) -> bytes | None:
    """The secret fingerprints of `journal` are keyed with, for a reader: `$SMG_TENANT_SECRET`,
    else `smg-tenant.key` beside the file; None when neither is there (or readable). Never
    creates it."""
    configured = fleet_secret()
    if configured is not None:
        return configured
    try:
        return (Path(journal).resolve().parent / SECRET_FILE).read_bytes() or None
    except OSError:
        return None


def fleet_secret() -> bytes | None:
    """`$SMG_TENANT_SECRET`, what every replica of a fleet keys fingerprints with (so a reader of
    the fleet journal, which has no file beside it, keys as they do); None when unset."""
    configured = os.environ.get(SECRET_ENV)
    return configured.encode() if configured else None


def key_fingerprints(value: str, key: bytes | None) -> list[str]:
    """The fingerprints (`key:` in a query) a caller's key `value` can be stored under: keyed
    with `key` and, for files written before keying, bare; in `x-api-key` or as a bearer token."""
    keys = [key, None] if key is not None else [None]
    return list(dict.fromkeys(_digest(prefix + value, k) for k in keys for prefix in _KEY_HEADER_PREFIXES))


@functools.lru_cache(maxsize=1024)
def credential_header(name: str) -> bool:
    """Whether a header (any case) carries a credential, judged by its name: one of
    `SECRET_HEADERS`, or a name with a word that says so (`api-key`, `x-goog-api-key`,
    `x-auth-token`, `anthropic-api-key`, `x-amz-security-token`, `x-client-secret`…). A name
    whose last word is `id` is an identifier (`x-claude-code-session-id`, `x-request-id`), and
    words that only count (`anthropic-ratelimit-tokens-remaining`) are not credentials; nor are
    routing and cache keys (`x-smg-*`, `x-stainless-*`, `*-affinity*`, `cache-key`)."""
    lowered = name.strip().lower()
    if lowered in SECRET_HEADERS:
        return True
    if lowered in _NOT_CREDENTIALS or lowered.startswith(_NOT_CREDENTIAL_PREFIXES):
        return False
    words = [w for w in _WORD_SPLIT.split(lowered) if w]
    if not words or words[-1] == "id" or _ROUTING_WORD in words:
        return False
    # A cache key names a cached answer, not a door (`x-cache-key`, `x-prompt-cache-key`).
    words = [w for i, w in enumerate(words) if not (w == "key" and i and words[i - 1] == _CACHE_WORD)]
    words = [w for w in words if w not in (_CACHE_WORD, _CACHE_WORD + "key")]
    return any(
        w in _CREDENTIAL_WORDS or w.endswith(_CREDENTIAL_ENDINGS) or any(p in w for p in _CREDENTIAL_PARTS)
        for w in words
    )


def redact_headers(headers: Mapping[str, str], key: bytes | None = None) -> dict[str, str]:
    """A copy of `headers` with the values of credential headers (`credential_header`) redacted."""
    return {name: redact_value(value, key) if credential_header(name) else value for name, value in headers.items()}


# An http(s) URL, as it can appear in a JSON text (`\/` escapes included), that may carry a
# credential: an `@` in its authority (userinfo), a query parameter whose name says secret
# (`_secret_param`, loosely: any name holding one of its words, or escaped), or a `\u` escape
# that may spell either. Other JSON escapes (`\n`, `\"`) neither end it nor hide a separator.
# One search in C, no match per URL handed to Python: the literal `:` is searched fast, every
# run is a possessive character class (no backtracking), and a path full of `@types/...` or the
# prose after a URL costs nothing. Anything it lets through is settled by `redact_url`.
_URL_AUTHORITY = r':(?:\\?/){2}(?:(?<=[pPsS]://)|(?<=[pPsS]:\\/\\/))[^/?#\s"\\@]*+(?:\\[^/u][^/?#\s"\\@]*+)*+'
_URL_PATH = r'(?:\\?/[^?#\s"\\]*+(?:\\[^u][^?#\s"\\]*+)*+)?'
_QUERY_VALUE = r'[^&#\s"\\]*+(?:\\[^u][^&#\s"\\]*+)*+'
# A query parameter's name holding a word of `_secret_param` (the guard of first letters keeps
# the lazy scan from trying every word at every character), escaped, or one of its exact names.
_SECRET_NAME = (
    r'(?=[^=&#\s"\\]*?(?=[kKtTsSpPaAcC%\\])(?:(?i:key|token|secret|passw|auth|signature|credential|session)|%|\\))'
    r"|(?=\+*(?i:sig|pwd|jwt|code)\+*(?:=|&|$))"
)
_URL_SECRET = re.compile(
    _URL_AUTHORITY
    + r"(?:@|\\u|"
    + _URL_PATH
    + r"(?:\\u|\?(?:[^=&#\s\"\\]*+(?:="
    + _QUERY_VALUE
    + r")?(?:&|(?=\\u)))*?(?:"
    + _SECRET_NAME
    + r"|\\u)))"
)


def redact_url(text: str, key: bytes | None = None) -> str:
    """`text`, when it is an http(s) URL, with its credentials redacted: the userinfo
    (`user:password@`) as one secret, and the values of credential-like query parameters
    (`redact_query`); anything else unchanged."""
    if "://" not in text:
        return text
    stripped = text.strip()
    if not stripped[:8].lower().startswith(("http://", "https://")):
        return text
    try:
        parts = urlsplit(stripped)
    except ValueError:
        return text
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at:
        plain = unquote(userinfo)
        if not plain.startswith(_PREFIX):
            netloc = f"{quote(redact_value(plain, key), safe='[]:')}@{host}"
    query = redact_query(parts.query, key)
    if netloc == parts.netloc and query == parts.query:
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


@functools.lru_cache(maxsize=8)
def _literal(needle: str) -> re.Pattern[str]:
    return re.compile(re.escape(needle))


def _contains(text: str, needle: str) -> bool:
    """`needle in text`, a window at a time over a text of megabytes (windows overlap by the
    needle's length less one): the writer thread scans a body while the event loop waits for
    the GIL, and a window is as long as the loop waits. The windows are searched in place (a
    pattern's `pos`/`endpos`), with no copy of the text; and `re`'s literal search is several
    times faster than `in` for needles of a few characters."""
    if len(text) <= SCAN_WINDOW_CHARS:
        return needle in text
    search = _literal(needle).search
    step = SCAN_WINDOW_CHARS - len(needle) + 1
    return any(search(text, at, at + SCAN_WINDOW_CHARS) is not None for at in range(0, len(text), step))


def _may_hold_url_secret(text: str) -> bool:
    """Whether an http(s) URL in `text` may carry a credential (one scan; bodies without one
    cost no parse)."""
    if not _contains(text, "://") and not _contains(text, ":\\/\\/"):
        return False
    return _URL_SECRET.search(text) is not None


def _redact_urls(value: Any, key: bytes | None) -> Any:
    if isinstance(value, str):
        return redact_url(value, key)
    if isinstance(value, dict):
        return {k: _redact_urls(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_urls(v, key) for v in value]
    return value


def _secret_urls(value: Any, found: dict[str, str], key: bytes | None = None) -> dict[str, str]:
    """Every string in `value` that `redact_url` changes, with its redacted form."""
    if isinstance(value, str):
        if "://" in value and (redacted_url := redact_url(value, key)) != value:
            found[value] = redacted_url
    elif isinstance(value, dict):
        for item in value.values():
            _secret_urls(item, found, key)
    elif isinstance(value, list):
        for item in value:
            _secret_urls(item, found, key)
    return found


def _may_hold_token(text: str) -> bool:
    if _contains(text, _TOKEN_KEY):
        return True
    # The key may be spelled with JSON escapes (`authorization\\u005ftoken`); one regex search,
    # and only bodies with an escape pay for it.
    return _contains(text, "\\u") and _ESCAPED_KEY.search(text) is not None


def _tokens_in(text: str, may_hold_token: bool = True) -> tuple[Any, list[Any], bool] | None:
    """The parsed body, every `authorization_token` value in it not redacted yet (duplicate
    keys included: the standard parser keeps only the last) and whether a key repeats;
    None when `text` does not parse. A body that cannot hold the key is parsed by orjson
    (the standard parser with a Python hook costs ten times more on a large body)."""
    if not may_hold_token:
        try:
            return orjson.loads(text), [], False
        except orjson.JSONDecodeError:
            pass  # what orjson refuses (`NaN`, a lone surrogate) the standard parser may take
    found: list[Any] = []
    repeated = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        count = 0
        for key, value in items:
            if key == _TOKEN_KEY:
                count += 1
                if not (isinstance(value, str) and value.startswith(_PREFIX)):
                    found.append(value)
        repeated = repeated or count > 1
        return dict(items)

    try:
        body = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return body, found, repeated


def redact_body(text: str, key: bytes | None = None) -> str:
    """`text` with every `authorization_token` value redacted (the MCP servers' tokens), and the
    credentials of every http(s) URL in its strings (`redact_url`: `mcp_servers[].url`, image
    and document URLs, anything else).

    Redaction works on the parsed value, whatever the spelling: a key or a token written
    with JSON escapes, a key given twice (both values go), a token that is not a string.
    Bodies that cannot hold the key (nearly all) cost one substring search. When each token
    appears in the text as plain JSON, it is replaced in place so the rest of the body stays
    byte-for-byte as the client sent it (checked by parsing the result); otherwise the body
    is re-serialized from its parsed form (duplicate keys collapse). A body that may hold a
    token but does not parse is stored as a fingerprint (`[text sha256:… len=…]`), never as
    it came.
    """
    may_hold_token = _may_hold_token(text)
    if not may_hold_token and not _may_hold_url_secret(text):
        return text
    parsed = _tokens_in(text, may_hold_token)
    if parsed is None:
        return fingerprint(text)
    body, tokens, repeated = parsed
    urls = _secret_urls(body, {}, key)
    if not tokens and not urls:
        return text
    if not repeated and all(isinstance(t, str) for t in tokens):
        out = text
        swaps = [(token, redact_value(token, key)) for token in tokens] + list(urls.items())
        for old, new in swaps:
            for quoted in {json.dumps(old), json.dumps(old, ensure_ascii=False)}:
                out = out.replace(quoted, json.dumps(new, ensure_ascii=False))
        again = _tokens_in(out, may_hold_token)
        if again is not None and not again[1] and not _secret_urls(again[0], {}):
            return out
    return json.dumps(_redact_urls(_redact_tokens(body, key), key), ensure_ascii=False, separators=(",", ":"))


_SECRET_PARAMS = ("key", "token", "secret", "passw", "auth", "signature", "credential", "session")
_SECRET_PARAMS_EXACT = frozenset({"sig", "pwd", "jwt", "code"})


def _secret_param(name: str) -> bool:
    lowered = unquote_plus(name).strip().lower()
    return lowered in _SECRET_PARAMS_EXACT or any(part in lowered for part in _SECRET_PARAMS)


def redact_query(query: str, key: bytes | None = None) -> str:
    """A query string with the values of secret-looking parameters (`key`, `api_key`,
    `token`, `access_token`, `secret`, `password`, `auth`, `sig`, …) redacted; the names,
    the order and every other parameter are kept as sent."""
    if not query or "=" not in query:
        return query
    out = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        if eq and value and _secret_param(name):
            plain = unquote_plus(value)
            if not plain.startswith(_PREFIX):
                value = quote(redact_value(plain, key), safe="[]:")
        out.append(f"{name}{eq}{value}")
    return "&".join(out)


_REFUSED_KEEP = frozenset(
    {
        "content-type",
        "content-length",
        "user-agent",
        "anthropic-version",
        "x-request-id",
        "request-id",
        "x-correlation-id",
        "x-trace-id",
        *SECRET_HEADERS,
    }
)
MINIMAL_VALUE_CHARS = 256
"""How much of each header (and of the query string) a request refused before auth keeps."""


def minimal_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What the journal keeps of the headers of a request that did not carry the gateway key:
    the few that explain the refusal, each clipped (secrets are redacted later, as always)."""
    return {
        name: value if credential_header(name) else value[:MINIMAL_VALUE_CHARS]
        for name, value in headers.items()
        if name.lower() in _REFUSED_KEEP or credential_header(name)
    }


def redacted_body(event: Event, longer_than: int, key: bytes | None = None) -> Event:
    """A `received` event whose body is over `longer_than` characters with that body redacted
    (`redacted(event, body_up_to=longer_than)` left it); any other event as it is."""
    if isinstance(event, Received) and event.body and len(event.body) > longer_than:
        return replace(event, body=redact_body(event.body, key))
    return event


def _redact_tokens(value: Any, key: bytes | None) -> Any:
    if isinstance(value, dict):
        return {k: _redact_token(v, key) if k == _TOKEN_KEY else _redact_tokens(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tokens(v, key) for v in value]
    return value


def _redact_token(value: Any, key: bytes | None) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return redact_value(value, key)
    return redact_value(json.dumps(value, sort_keys=True, default=str), key)


def redacted(event: Event, key: bytes | None = None, *, body_up_to: int | None = None) -> Event:
    """The event as the journal may keep it: a copy with its secrets redacted, fingerprints
    keyed with `key` (the caller's event is left alone, e.g. an upstream head whose headers the
    response still needs), or the event itself when it carries none.

    `body_up_to`: a `received` body longer than that many characters is left as it is, for
    `redacted_body` to redact later (the journal writer does, in its thread, before the event
    is stored); its headers and query are redacted here all the same."""
    if isinstance(event, Received):
        body = event.body
        if body and (body_up_to is None or len(body) <= body_up_to):
            body = redact_body(body, key)
        headers, query = redact_headers(event.headers, key), redact_query(event.query, key)
        return replace(event, headers=headers, query=query, body=body)
    if isinstance(event, Upstream) and event.headers:
        return replace(event, headers=redact_headers(event.headers, key))
    if isinstance(event, Validated) and event.summary and not _plain(event.summary):
        return replace(event, summary=_redact_urls(_redact_tokens(event.summary, key), key))
    return event


def _plain(summary: dict[str, Any]) -> bool:
    """Whether a validated summary holds nothing to redact, without a copy: only counts and
    names (what validation puts there for every request), none of them a token or a URL."""
    if _TOKEN_KEY in summary:
        return False
    for value in summary.values():
        if isinstance(value, dict | list) or (isinstance(value, str) and "://" in value):
            return False
    return True
