"""`journal.export` on hand-built events: what real traffic does not easily produce."""

from __future__ import annotations

import shlex
import subprocess

from journal.events import Completed, Error, Received, Validated
from journal.export import as_curl, as_har
from journal.redact import redact_headers


def test_curl_of_a_get_with_a_query_and_other_secrets() -> None:
    received = Received(
        method="GET",
        path="/v1/models",
        query="limit=5&after=a b",
        headers=redact_headers({"Cookie": "s=1", "Accept": "application/json", "Host": "gw:1"}),
    )
    command = as_curl(received, "https://gw.example/")
    assert command.splitlines()[0] == "curl -sS \\"
    assert "-X" not in command and "--data-binary" not in command
    assert shlex.quote("https://gw.example/v1/models?limit=5&after=a b") in command
    assert '-H "Cookie: ${SMG_COOKIE}"' in command
    assert "Host" not in command


def test_curl_leaves_out_the_hop_chain_the_recorded_request_carried() -> None:
    received = Received(method="POST", path="/v1/messages", headers={"x-smg-hops": "a1b2c3d4e5f60718"}, body="{}")
    assert "x-smg-hops" not in as_curl(received).lower()


def test_curl_keeps_an_unusual_method_and_empty_body() -> None:
    command = as_curl(Received(method="DELETE", path="/v1/x", body=""))
    assert "-X DELETE" in command and "--data-binary" not in command


def test_curl_words_survive_the_shell() -> None:
    body = '{"a": "it\'s $HOME `x` \\" \\\\ \n ☃"}'
    received = Received(method="POST", path="/p", headers={"x-odd": "a'b\"c$d"}, body=body)
    command = as_curl(received)
    # Let a shell split the command and print each word back.
    script = command.replace("curl", "printf '%s\\0'", 1)
    words = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.decode().split("\0")
    assert body in words and "x-odd: a'b\"c$d" in words


def test_har_of_a_request_that_got_no_response() -> None:
    events = [
        Received(method="POST", path="/v1/messages", body="{}", headers={"content-type": "application/json"}, ts=1.5),
        Validated(model="m", stream=True, t=0.001),
        Completed(status=499, duration_ms=12.0, disconnected=True, t=0.012),
    ]
    entry = as_har(events, None)["log"]["entries"][0]
    assert entry["response"]["status"] == 0 and entry["response"]["content"]["size"] == 0
    assert entry["time"] == 12.0 and entry["timings"]["wait"] == 12.0 and entry["timings"]["receive"] == 0
    assert "disconnected" in entry["comment"]
    assert entry["startedDateTime"] == "1970-01-01T00:00:01.500+00:00"


def test_har_wait_ends_at_the_first_response_event() -> None:
    events = [
        Received(method="POST", path="/v1/messages", body="{}"),
        Error(stage="route", status=503, error_type="overloaded_error", message="no worker", t=0.004),
        Completed(status=503, duration_ms=5.0, t=0.005),
    ]
    timings = as_har(events, None)["log"]["entries"][0]["timings"]
    assert timings["wait"] == 4.0 and timings["receive"] == 1.0
