"""The bounded, guarded fetcher over loopback, against origins that count their connections: a
refusal is made before any connect (a name after resolution, a redirect at its hop, at the
socket even when the URL check is skipped), the request's deadline and byte budget hold, and
no error repeats what a destination answered."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx2
import pytest

from smg.fetch import Budget, Fetcher, FetchError, guarded_transport
from smg.fetch.fetcher import MAX_REDIRECTS
from smg.fetch.policy import BadAnswer, DestinationPolicy, OverLimit, Refused, TimedOut, Unreachable, parse_allow
from tools.origin import SECRET_BODY, SECRET_REASON, Origin
from tools.spawn import free_port

# 127.0.0.1 is opened; 127.0.0.2 (loopback too) stays refused.
ONE = DestinationPolicy(parse_allow(["127.0.0.1/32"]))


@pytest.fixture
def origin() -> Iterator[Origin]:
    with Origin("127.0.0.1") as served:
        yield served


@pytest.fixture
def other() -> Iterator[Origin]:
    with Origin("127.0.0.2") as served:
        yield served


def budget(timeout: float = 5.0, max_bytes: int = 1 << 20, parallel: int = 4) -> Budget:
    return Budget(timeout_secs=timeout, max_bytes=max_bytes, parallel=parallel, label="media")


async def fetch(policy: DestinationPolicy, url: str, within: Budget | None = None, max_bytes: int = 1 << 20) -> bytes:
    fetcher = Fetcher(policy)
    try:
        return (await fetcher.get(url, within or budget(), max_bytes=max_bytes)).data
    finally:
        await fetcher.aclose()


def clean(message: str) -> None:
    """No answer of the destination and no object address in a message."""
    assert SECRET_REASON not in message and SECRET_BODY.decode() not in message
    assert not re.search(r"0x[0-9a-f]{6,}", message) and "object at" not in message


async def test_an_allowed_origin_is_fetched(origin: Origin) -> None:
    url = origin.serve("a.png", b"PNG", "image/png")
    assert await fetch(ONE, url) == b"PNG"
    assert origin.connections == 1


@pytest.mark.parametrize(
    "spelling",
    ["127.0.0.1", "localhost", "2130706433", "0x7f.1", "127.1", "0177.0.0.1", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"],
)
async def test_loopback_in_any_spelling_is_refused_before_any_connect(origin: Origin, spelling: str) -> None:
    with pytest.raises(Refused, match="loopback address") as refused:
        await fetch(DestinationPolicy(), f"http://{spelling}:{origin.port}/file/a.png")
    assert origin.connections == 0
    if spelling == "localhost":  # refused after resolution: the name is said, and what it resolves to
        assert "destination localhost resolves to a loopback address" in str(refused.value)


async def test_credentials_are_refused_before_any_connect(origin: Origin) -> None:
    url = origin.serve("a.png", b"PNG", "image/png").replace("http://", "http://user:pw@")
    with pytest.raises(FetchError, match="credentials"):
        await fetch(ONE, url)
    assert origin.connections == 0


async def test_a_redirect_to_a_refused_destination_is_refused_at_that_hop(origin: Origin, other: Origin) -> None:
    target = other.serve("a.png", b"PNG", "image/png")
    with pytest.raises(Refused, match="127.0.0.2 is a loopback address"):
        await fetch(ONE, f"{origin.url}/redirect?to={target}")
    assert (origin.connections, other.connections) == (1, 0)
    numeric = target.replace("127.0.0.2", "2130706434")  # the same, as a number
    with pytest.raises(Refused):
        await fetch(ONE, f"{origin.url}/redirect?to={numeric}")
    assert other.connections == 0


async def test_redirects_are_followed_a_few_hops_only(origin: Origin) -> None:
    url = origin.serve("a.png", b"PNG", "image/png")
    assert await fetch(ONE, f"{origin.url}/redirect?to={url}") == b"PNG"
    for _ in range(MAX_REDIRECTS + 1):
        url = f"{origin.url}/redirect?to={url}"
    with pytest.raises(BadAnswer, match=f"more than {MAX_REDIRECTS} redirects"):
        await fetch(ONE, url)


async def test_the_socket_itself_refuses_what_the_policy_refuses(origin: Origin) -> None:
    """A client on the guarded transport, given a URL nobody checked, still never connects."""
    async with httpx2.AsyncClient(transport=guarded_transport(DestinationPolicy())) as client:
        with pytest.raises(Refused):
            await client.get(f"http://localhost:{origin.port}/file/a.png")
    assert origin.connections == 0


async def test_a_trickled_body_is_cut_at_the_requests_deadline(origin: Origin) -> None:
    with pytest.raises(TimedOut) as timed_out:
        await fetch(ONE, f"{origin.url}/trickle", budget(timeout=1.0))
    assert str(timed_out.value) == "URL fetch timed out after 1 s for the request"


async def test_a_closed_port_and_a_silent_one_look_the_same(origin: Origin) -> None:
    with pytest.raises(Unreachable) as closed:
        await fetch(ONE, f"http://127.0.0.1:{free_port()}/a.png", budget(timeout=1.0))
    with pytest.raises(Unreachable) as silent:
        await fetch(ONE, f"{origin.url}/silent", budget(timeout=1.0))
    assert str(closed.value) == str(silent.value)
    clean(str(closed.value))


async def test_an_error_status_is_said_without_the_answer(origin: Origin) -> None:
    with pytest.raises(BadAnswer) as failed:
        await fetch(ONE, f"{origin.url}/status/404")
    message = failed.value.describe("image")
    assert message == (
        "image URL could not be fetched: the destination did not answer with the content (status other than 200)"
    )
    clean(message)
    assert "404" not in message  # not even the status: it would tell which internal paths exist


@pytest.mark.parametrize("chunked", [False, True])
async def test_one_item_is_capped(origin: Origin, chunked: bool) -> None:
    url = f"{origin.url}/bytes/{200_000}" + ("?chunked=1" if chunked else "")
    with pytest.raises(OverLimit, match="larger than the 65536 bytes limit for one item"):
        await fetch(ONE, url, max_bytes=65536)


async def test_the_requests_fetches_share_one_byte_budget(origin: Origin) -> None:
    shared = budget(max_bytes=100_000)
    fetcher = Fetcher(ONE)
    try:
        await fetcher.get(f"{origin.url}/bytes/60000", shared, max_bytes=1 << 20)
        with pytest.raises(OverLimit) as over:
            await fetcher.get(f"{origin.url}/bytes/60000?chunked=1", shared, max_bytes=1 << 20)
        with pytest.raises(OverLimit):  # nothing is left: refused on the announced length
            await fetcher.get(f"{origin.url}/bytes/60000", shared, max_bytes=1 << 20)
    finally:
        await fetcher.aclose()
    assert over.value.describe("image") == "image fetch exceeded the request's 100000 bytes media budget"
