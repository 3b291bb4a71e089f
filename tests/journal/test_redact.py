"""Secrets are hashed, never stored: headers, MCP tokens, and the whole file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from journal.bodies import fingerprint
from journal.events import Completed, Received, Upstream, Validated
from journal.reader import JournalReader
from journal.redact import (
    credential_header,
    minimal_headers,
    redact_body,
    redact_headers,
    redact_query,
    redact_url,
    redact_value,
    redacted,
)
from journal.writer import JournalWriter


def marker(secret: str) -> str:
    return f"[redacted sha256:{hashlib.sha256(secret.encode()).hexdigest()[:12]}]"


def test_redact_headers_case_insensitive() -> None:
    headers = {
        "Authorization": "Bearer a",
        "X-API-Key": "k",
        "proxy-authorization": "Basic p",
        "Cookie": "c=1",
        "set-cookie": "s=2",
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    out = redact_headers(headers)
    assert out == {
        "Authorization": marker("Bearer a"),
        "X-API-Key": marker("k"),
        "proxy-authorization": marker("Basic p"),
        "Cookie": marker("c=1"),
        "set-cookie": marker("s=2"),
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    assert headers["Authorization"] == "Bearer a"  # a copy, the input is untouched
    assert redact_headers(out) == out  # idempotent
    assert redact_value(marker("k")) == marker("k")


def test_same_key_same_marker_different_keys_differ() -> None:
    assert redact_value("sk-1") == redact_value("sk-1") != redact_value("sk-2")


def test_redact_body_replaces_mcp_tokens_in_place() -> None:
    body = (
        '{"model": "m", "mcp_servers": [\n'
        '  {"type": "url", "url": "http://x", "name": "a", "authorization_token": "tok-1"},\n'
        '  {"type": "url", "url": "http://y", "name": "b"}],\n'
        ' "messages": []}'
    )
    out = redact_body(body)
    assert "tok-1" not in out
    assert out == body.replace('"tok-1"', f'"{marker("tok-1")}"')  # the rest byte-for-byte
    assert redact_body(out) == out


def test_redact_body_escaped_token_falls_back_to_reserializing() -> None:
    body = '{"mcp_servers":[{"name":"a","authorization_token":"a\\/b\\u0063"}]}'
    out = redact_body(body)
    assert "a/bc" not in out and "a\\/b" not in out
    assert json.loads(out)["mcp_servers"][0]["authorization_token"] == marker("a/bc")


def test_redact_body_leaves_other_text_alone() -> None:
    plain = '{"model":"m","messages":[]}'
    assert redact_body(plain) is plain
    # Text that may hold a token but does not parse is never stored as it came.
    assert redact_body("authorization_token but not json") == fingerprint("authorization_token but not json")
    assert redact_body("no key here, not json") == "no key here, not json"
    # The key is a secret wherever it is: a misplaced token is redacted too.
    text = "top-level is not an MCP server"
    misplaced = json.dumps({"authorization_token": text})
    assert redact_body(misplaced) == misplaced.replace(f'"{text}"', f'"{marker(text)}"')
    assert redact_body('["authorization_token"]') == '["authorization_token"]'


async def test_no_secret_reaches_the_database_file(tmp_path: Path) -> None:
    secrets = ["sk-ant-SECRET-one", "sk-ant-SECRET-two", "mcp-SECRET-three", "cookie-SECRET-4"]
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "mcp_servers": [{"type": "url", "url": "http://mcp", "name": "s", "authorization_token": secrets[2]}],
        }
    )
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    # The caller forgot to redact: the writer does it anyway.
    await writer.append(
        "req_1",
        0,
        Received(
            method="POST",
            path="/v1/messages",
            headers={
                "Authorization": f"Bearer {secrets[0]}",
                "x-api-key": secrets[1],
                "Cookie": secrets[3],
            },
            body=body,
            ts=1.0,
        ),
    )
    await writer.append(
        "req_1",
        1,
        Validated(
            model="m",
            summary={"mcp_servers": [{"name": "s", "authorization_token": secrets[2]}]},
        ),
    )
    await writer.append("req_1", 2, Upstream(part="head", status=200, headers={"Set-Cookie": secrets[3]}))
    await writer.append("req_1", 3, Completed(status=200, duration_ms=1.0))
    await writer.flush()
    files = [p for p in tmp_path.iterdir() if p.name.startswith("j.db")]
    await writer.close()
    files += [p for p in tmp_path.iterdir() if p.name.startswith("j.db")]

    for file in files:
        if file.exists():
            data = file.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, (file.name, secret)

    with JournalReader(path) as reader:
        (_, received), (_, validated), (_, upstream), _ = reader.events("req_1")
    assert isinstance(received, Received)
    assert received.headers["Authorization"] == marker(f"Bearer {secrets[0]}")
    assert received.headers["x-api-key"] == marker(secrets[1])
    assert received.body is not None
    assert json.loads(received.body)["mcp_servers"][0]["authorization_token"] == marker(secrets[2])
    assert isinstance(validated, Validated)
    assert validated.summary["mcp_servers"][0]["authorization_token"] == marker(secrets[2])
    assert isinstance(upstream, Upstream)
    assert upstream.headers == {"Set-Cookie": marker(secrets[3])}


def test_a_token_key_spelled_with_a_json_escape_is_redacted() -> None:
    body = '{"mcp_servers": [{"name": "a", "authorization\\u005ftoken": "tok-escaped"}], "messages": []}'
    assert json.loads(body)["mcp_servers"][0]["authorization_token"] == "tok-escaped"
    out = redact_body(body)
    assert "tok-escaped" not in out
    assert json.loads(out)["mcp_servers"][0]["authorization_token"] == marker("tok-escaped")


def test_a_token_value_spelled_with_escapes_is_redacted() -> None:
    body = '{"mcp_servers": [{"authorization_token": "tok\\u002dsecret"}], "note": "tok-other"}'
    out = redact_body(body)
    assert "tok\\u002dsecret" not in out and "tok-secret" not in out
    assert json.loads(out)["mcp_servers"][0]["authorization_token"] == marker("tok-secret")


def test_both_values_of_a_duplicated_token_key_are_redacted() -> None:
    body = '{"mcp_servers": [{"authorization_token": "tok-first", "authorization_token": "tok-last"}]}'
    out = redact_body(body)
    assert "tok-first" not in out and "tok-last" not in out
    assert json.loads(out)["mcp_servers"][0]["authorization_token"] == marker("tok-last")


def test_a_token_that_is_not_a_string_is_redacted() -> None:
    out = redact_body('{"mcp_servers": [{"authorization_token": {"bearer": "tok-nested"}}]}')
    assert "tok-nested" not in out


def test_a_body_that_does_not_parse_and_may_hold_a_token_is_fingerprinted() -> None:
    broken = '{"mcp_servers": [{"authorization_token": "tok-broken"}'  # cut short
    assert redact_body(broken) == fingerprint(broken)
    deep = "[" * 100_000 + '{"authorization_token": "tok-deep"}'  # past the parser's recursion limit
    assert "tok-deep" not in redact_body(deep)


def test_query_secrets_are_redacted_and_the_rest_kept() -> None:
    query = "key=sk-1&beta=true&api_key=sk-2&X-Access-Token=t%203&model=m&sig=abc&empty="
    out = redact_query(query)
    assert "sk-1" not in out and "sk-2" not in out and "t%203" not in out and "abc" not in out
    assert out.startswith("key=[redacted%20sha256:") and "&beta=true&" in out and "&model=m&" in out
    assert out.endswith("&empty=")
    assert redact_query(out) == out
    assert "t 3" not in out and marker("t 3").replace(" ", "%20") in out
    assert redact_query("plain") == "plain" and redact_query("") == ""


def test_a_request_refused_before_auth_keeps_only_a_few_headers_clipped() -> None:
    headers = {"content-type": "application/json", "authorization": "Bearer x", "x-junk": "j" * 10_000,
               "user-agent": "u" * 10_000}  # fmt: skip
    kept = minimal_headers(headers)
    assert set(kept) == {"content-type", "authorization", "user-agent"}
    assert len(kept["user-agent"]) == 256 and kept["authorization"] == "Bearer x"


async def test_the_query_string_is_redacted_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    await writer.append("q", 1, Received(method="POST", path="/v1/messages", query="key=sk-in-query&x=1"))
    await writer.close()
    assert b"sk-in-query" not in path.read_bytes()
    with JournalReader(path) as reader:
        received = reader.events("q")[0][1]
    assert isinstance(received, Received) and received.query.endswith("&x=1")


# The rule, against a table: header names that carry credentials, and names that only look so.
CREDENTIAL_HEADERS = (
    "Authorization", "x-api-key", "proxy-authorization", "cookie", "set-cookie", "api-key", "x-goog-api-key",
    "x-auth-token", "anthropic-api-key", "X-Amz-Security-Token", "x-client-secret", "x-apikey", "private-token",
    "x-access-token", "x_auth", "x-session-token", "x-csrf-token", "x-hub-signature-256", "x-password",
    "ocp-apim-subscription-key", "x-vault-token", "openai-api-key", "x-credentials", "x-bearer",
    "x-cache-auth-token", "x-cache-secret",
)  # fmt: skip
PLAIN_HEADERS = (
    "content-type", "content-length", "user-agent", "anthropic-version", "anthropic-beta", "x-request-id",
    "request-id", "x-correlation-id", "x-trace-id", "traceparent", "x-claude-code-session-id", "x-session-id",
    "keep-alive", "accept-encoding", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-input-tokens-limit",
    "idempotency-key", "x-stainless-retry-count", "x-forwarded-for", "host",
    # Routing and cache keys: a replay needs them as sent.
    "x-smg-routing-key", "x-smg-hops", "x-session-affinity", "x-affinity-key", "x-cache-key", "cache-key",
    "x-prompt-cache-key", "x-cachekey", "x-stainless-session", "x-stainless-helper-method",
)  # fmt: skip


@pytest.mark.parametrize("name", CREDENTIAL_HEADERS)
def test_a_header_named_for_a_credential_is_redacted(name: str) -> None:
    assert credential_header(name)
    assert redact_headers({name: "s3cret-value"}) == {name: marker("s3cret-value")}


@pytest.mark.parametrize("name", PLAIN_HEADERS)
def test_a_header_that_only_names_or_counts_is_kept(name: str) -> None:
    assert not credential_header(name)
    assert redact_headers({name: "value"}) == {name: "value"}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://user:pw@mcp.example/sse",
            "https://[redacted%20sha256:" + marker("user:pw")[17:29] + "]@mcp.example/sse",
        ),
        ("https://tok@h.example/x", "https://[redacted%20sha256:" + marker("tok")[17:29] + "]@h.example/x"),
        (
            "http://mcp.example/sse?token=abc&v=1",
            "http://mcp.example/sse?token=[redacted%20sha256:" + marker("abc")[17:29] + "]&v=1",
        ),
        (
            "https://bucket.example/i.png?X-Amz-Signature=f00&X-Amz-Date=1",
            "https://bucket.example/i.png?X-Amz-Signature=[redacted%20sha256:"
            + marker("f00")[17:29]
            + "]&X-Amz-Date=1",
        ),
        ("https://example.com/a@b?page=2#f", "https://example.com/a@b?page=2#f"),  # an @ in the path: no userinfo
        ("see https://u:p@h/ there", "see https://u:p@h/ there"),  # prose, not a URL
        ("ftp://u:p@h/", "ftp://u:p@h/"),
    ],
)
def test_url_credentials_are_redacted(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert redact_url(expected) == expected  # idempotent


def test_a_body_keeps_its_bytes_but_not_the_credentials_of_its_urls() -> None:
    body = json.dumps(
        {
            "model": "m",
            "mcp_servers": [{"type": "url", "url": "https://me:pw@mcp.example/sse?api_key=k1", "name": "s"}],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "https://i.example/a.png?sig=s1"}}],
                }
            ],
        },
        indent=1,
    )
    out = redact_body(body)
    assert "me:pw" not in out and "k1" not in out and "sig=s1" not in out
    assert out.count("\n") == body.count("\n")  # replaced in place, not re-serialized
    assert json.loads(out)["mcp_servers"][0]["url"].startswith("https://[redacted%20sha256:")
    escaped = body.replace("https://me:pw@", "https:\\/\\/me:pw\\u0040")
    assert "me:pw" not in json.dumps(json.loads(redact_body(escaped)))
    plain = json.dumps({"messages": [{"role": "user", "content": "https://example.com/?page=1"}]})
    assert redact_body(plain) is plain


# Whether a body's URLs may hold a credential decides whether it is parsed at all; a body that
# may hold one but does not parse is fingerprinted, so a cut-short body shows the decision.
@pytest.mark.parametrize(
    "url",
    [
        "https://user:pw@mcp.example/sse",
        "HTTPS:\\/\\/me:pw\\u0040h.example\\/x",
        "https://h.example/p?api_key=1",
        "https://h.example/p?a=1&X-Amz-Signature=f",
        "https://h.example/p?sig=1",
        "https://h.example/p?%6Bey=1",
        "https://h.example/p?a=1\\u0026token=2",
        "https://h.example\\/p\\n?token=x",
        'https://u:p\\"w@h.example/',
    ],
)
def test_a_url_that_may_carry_a_credential_is_looked_at(url: str) -> None:
    broken = '{"messages": [{"content": "' + url + '"'
    assert redact_body(broken) == fingerprint(broken)


@pytest.mark.parametrize(
    "url",
    [
        "https://registry.npmjs.org/@types/node/-/node-20.11.0.tgz",  # an @ in the path: no userinfo
        "https://github.com/anthropics/claude-code/blob/main/README.md\\n// see @types/react",
        "https://api.example.com/v1/items?page=2&limit=50",
        "https://h.example/?q=monkey&x=1",  # a secret word in a value, not a name
        'https://api.example.com\\";\\n  a@b',
    ],
)
def test_a_url_that_cannot_carry_a_credential_costs_no_parse(url: str) -> None:
    broken = '{"messages": [{"content": "' + url + '"'
    assert redact_body(broken) == broken


def test_a_body_only_the_standard_parser_takes_is_still_redacted() -> None:
    body = '{"x": NaN, "mcp_servers": [{"url": "https://u:p@mcp.example/sse"}]}'
    out = redact_body(body)
    assert "u:p@" not in out and out.startswith('{"x": NaN')


def _body_ending_in(size: int, url: str) -> str:
    """A request body of about `size` characters whose one message ends in an image at `url`."""
    image = {"type": "image", "source": {"type": "url", "url": url}}
    content = [{"type": "text", "text": "word " * (size // 5)}, image]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


async def test_a_large_body_is_redacted_by_the_writer_thread_not_on_the_callers_time(tmp_path: Path) -> None:
    import tracemalloc

    from journal.writer import INLINE_REDACT_CHARS

    bodies = {
        "big": _body_ending_in(2 * INLINE_REDACT_CHARS, "https://ann:pw-big@host.example/x?token=tok-big"),
        "small": _body_ending_in(1000, "https://bob:pw-small@host.example/x?token=tok-small"),
    }
    path = tmp_path / "j.db"
    key = b"deployment secret"  # the big body's fingerprints are keyed as the small one's are
    writer = JournalWriter(path, secret=key)
    await writer.start()
    tracemalloc.start()
    try:
        assert writer.offer("big", 1, Received(method="POST", path="/v1/messages", body=bodies["big"], ts=1.0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Redacting it there would have parsed and rewritten the body: copies of its size.
    assert peak < len(bodies["big"]) // 8
    await writer.append("small", 1, Received(method="POST", path="/v1/messages", body=bodies["small"], ts=1.0))
    for request_id in bodies:
        await writer.append(request_id, 2, Completed(status=200, duration_ms=1.0))
    await writer.flush()
    for file in [p for p in tmp_path.iterdir() if p.name.startswith("j.db")]:
        data = file.read_bytes()
        for secret in ("pw-big", "tok-big", "pw-small", "tok-small"):
            assert secret.encode() not in data, (file.name, secret)
    await writer.close()
    with JournalReader(path) as reader:
        for request_id, body in bodies.items():
            (_, received), _ = reader.events(request_id)
            assert isinstance(received, Received) and received.body is not None
            assert received.body == redact_body(body, key) != redact_body(body)


@pytest.mark.parametrize("shift", [0, 1, 9, 18, 19, 20])
def test_a_key_across_two_scan_windows_is_found(shift: int) -> None:
    from journal.redact import SCAN_WINDOW_CHARS

    head = '{"pad": "' + "x" * (SCAN_WINDOW_CHARS - 20 + shift) + '", '
    body = head + '"mcp_servers": [{"authorization_token": "tok-straddling"}]}'
    out = redact_body(body)
    assert "tok-straddling" not in out
    assert json.loads(out)["mcp_servers"][0]["authorization_token"] == marker("tok-straddling")


@pytest.mark.parametrize("shift", [0, 2, 3])
def test_a_url_across_two_scan_windows_is_found(shift: int) -> None:
    from journal.redact import SCAN_WINDOW_CHARS

    head = '{"pad": "' + "x" * (SCAN_WINDOW_CHARS - 12 + shift) + '", "u": "https'
    out = redact_body(head + '://u:pw-straddling@h.example/"}')
    assert "pw-straddling" not in out


def test_a_large_body_without_secrets_is_scanned_in_place() -> None:
    """The windows of a body of megabytes are searched where they lie: no copy of a window (a
    copy per window and needle is a megabyte allocated, written and freed each time)."""
    import tracemalloc

    from journal.redact import SCAN_WINDOW_CHARS

    body = json.dumps({"messages": [{"role": "user", "content": "word " * (4 * SCAN_WINDOW_CHARS // 5)}]})
    tracemalloc.start()
    try:
        out = redact_body(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out is body
    assert peak < SCAN_WINDOW_CHARS // 8


def test_a_flat_validated_summary_is_redacted_only_where_it_holds_a_secret() -> None:
    plain = Validated(model="m", summary={"messages": 2, "max_tokens": 64, "tool_choice": "auto"})
    assert redacted(plain) is plain  # nothing to redact: kept, not copied
    token = redacted(Validated(model="m", summary={"messages": 1, "authorization_token": "tok-flat"}))
    assert isinstance(token, Validated) and token.summary["authorization_token"] == marker("tok-flat")
    url = redacted(Validated(model="m", summary={"alias": "https://user:pw-flat@example.test/x"}))
    assert isinstance(url, Validated) and "pw-flat" not in url.summary["alias"]
