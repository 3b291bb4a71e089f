"""The destination policy without sockets: numeric hosts read in every form, the refused ranges
(and the IPv4 an IPv6 address carries), URLs with credentials or another scheme, `--fetch-allow`."""

from __future__ import annotations

import ipaddress

import pytest

from smg.fetch.policy import BadUrl, DestinationPolicy, Refused, classify, numeric_host, parse_allow

LOOPBACK = [
    "http://127.0.0.1/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://0x7f.1/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://127.0.0.1./",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::127.0.0.1]/",
    "http://[2002:7f00:1::]/",
]


@pytest.mark.parametrize("url", LOOPBACK)
def test_every_spelling_of_loopback_is_refused(url: str) -> None:
    with pytest.raises(Refused, match="is a loopback address") as refused:
        DestinationPolicy().target(url)
    assert str(refused.value).endswith("allow it with --fetch-allow")


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),
        ("100.64.0.1", "a shared (CGNAT) address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("255.255.255.255", "a broadcast address"),
        ("240.0.0.1", "a reserved address"),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_each_range_has_its_rule(address: str, rule: str | None) -> None:
    assert classify(ipaddress.ip_address(address)) == rule


@pytest.mark.parametrize(
    ("address", "form"),
    [
        ("64:ff9b::a00:1", "NAT64 10.0.0.1"),
        ("2002:a9fe:a9fe::", "6to4 169.254.169.254"),
        ("::ffff:10.0.0.1", "IPv4-mapped"),
    ],
)
def test_an_ipv6_address_is_judged_by_the_ipv4_it_carries(address: str, form: str) -> None:
    refusal = DestinationPolicy().refusal(ipaddress.ip_address(address))
    assert refusal is not None and form in str(refusal)


def test_a_public_ipv4_carried_in_ipv6_passes() -> None:
    assert DestinationPolicy().refusal(ipaddress.ip_address("64:ff9b::808:808")) is None


@pytest.mark.parametrize(
    ("host", "address"),
    [("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("10.0x10.1", "10.16.0.1"),
     ("0", "0.0.0.0"), ("example.com", None), ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1")],
)  # fmt: skip
def test_numeric_hosts_are_read_like_the_resolver_reads_them(host: str, address: str | None) -> None:
    parsed = numeric_host(host)
    assert (str(parsed) if parsed is not None else None) == (str(ipaddress.ip_address(address)) if address else None)


@pytest.mark.parametrize("url", ["http://1.2.3.4.5/", "http://example.0x1/", "http://256.0.0.1/", "http://[::zz]/"])
def test_a_host_that_looks_numeric_but_is_no_address_is_refused(url: str) -> None:
    with pytest.raises(BadUrl):
        DestinationPolicy().target(url)


@pytest.mark.parametrize("url", ["http://exa mple.com/", "http://ex%41mple.com/", "http://\x00x/", 'http://x"y/'])
def test_a_host_that_is_no_name_is_refused_before_any_lookup(url: str) -> None:
    with pytest.raises(BadUrl, match="not a valid name"):
        DestinationPolicy().target(url)


@pytest.mark.parametrize("url", ["http://user:pw@example.com/a.png", "http://user@example.com/", "https://:x@example.com/"])
def test_credentials_in_a_url_are_refused(url: str) -> None:
    with pytest.raises(BadUrl, match="credentials"):
        DestinationPolicy().target(url)


@pytest.mark.parametrize("url", ["ftp://example.com/a", "file:///etc/passwd", "gopher://127.0.0.1/", "//example.com/"])
def test_only_http_and_https_are_fetched(url: str) -> None:
    with pytest.raises(BadUrl, match="only http"):
        DestinationPolicy().target(url)


def test_the_url_is_rebuilt_with_the_address_checked() -> None:
    allow = DestinationPolicy(parse_allow(["127.0.0.0/8"]))
    assert allow.target("http://2130706433:8080/a.png?x=1#frag").url == "http://127.0.0.1:8080/a.png?x=1"
    assert allow.target("http://[::ffff:127.0.0.1]/").url == "http://[::ffff:7f00:1]/"


def test_fetch_allow_opens_only_its_ranges() -> None:
    policy = DestinationPolicy(parse_allow(["127.0.0.1/32", "10.0.0.0/8,192.168.0.0/16"]))
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None  # the same destination
    assert policy.refusal(ipaddress.ip_address("10.9.9.9")) is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.2")) is not None
    assert policy.refusal(ipaddress.ip_address("::1")) is not None


def test_fetch_allow_takes_only_cidrs() -> None:
    with pytest.raises(ValueError, match="--fetch-allow takes CIDR ranges"):
        parse_allow(["localhost"])
