"""Which destinations the gateway may fetch from on a client's behalf (pure: no I/O).

A URL a client hands the gateway must not reach what only the gateway can reach: its own
admin routes, a metrics port, anything on loopback or the internal network. So a destination
is refused when its address is loopback, link-local, private (RFC 1918, ULA, CGNAT),
unspecified, multicast, broadcast or otherwise reserved; an IPv6 address that carries an IPv4
one (mapped, compatible, 6to4, NAT64, Teredo) is judged by the address it carries as well. The
check is made on addresses, never on names: `smg.fetch.dial` resolves a name and checks every
address before it connects to one of them (and only to one it checked). An operator opens
ranges with `--fetch-allow CIDR…`.

Numeric hosts are read the way browsers and the C resolver read them (`2130706433`, `0x7f.1`,
`127.1`, `0177.0.0.1` are all 127.0.0.1), so the address checked is the one that would be
dialled. URLs carrying credentials (`user:pw@host`) and schemes other than http/https are
refused outright.

Errors are values (`FetchError` and its kinds) whose text names the rule that refused, never
what a destination answered; callers prefix their subject ("image", "MCP server").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import SplitResult, urlsplit, urlunsplit

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_HINT = "allow it with --fetch-allow"


class FetchError(Exception):
    """A fetch that did not happen or did not finish; `str()` is the rule, without a subject."""

    def describe(self, subject: str) -> str:
        """The client's message, e.g. `describe("image")` → "image URL refused: …"."""
        return f"{subject} {self}"


class BadUrl(FetchError):
    """The URL itself is not one the gateway fetches (scheme, credentials, malformed host)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"URL refused: {detail}")


class Refused(FetchError):
    """The destination's address is one the policy refuses."""

    def __init__(self, detail: str, hint: str = ALLOW_HINT) -> None:
        self.detail = detail
        super().__init__(f"URL refused: {detail}; {hint}")


class Unreachable(FetchError):
    """No answer: name not found, connection refused or reset, TLS failed, no response head in
    time. One text for all of them, so a closed port and a filtered one look alike."""

    def __init__(self, deadline_secs: float) -> None:
        super().__init__(
            f"URL could not be fetched: the destination did not answer (no connection, or no response "
            f"within the request's {deadline_secs:g} s fetch deadline)"
        )


class TimedOut(FetchError):
    def __init__(self, deadline_secs: float) -> None:
        super().__init__(f"URL fetch timed out after {deadline_secs:g} s for the request")


class OverLimit(FetchError):
    """A size or count limit of the request's fetches."""

    def __init__(self, text: str) -> None:
        super().__init__(text)


class BadAnswer(FetchError):
    """The destination answered, but not with what was asked for (status, redirects)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"URL could not be fetched: {detail}")


def _nets(*cidrs: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# In order: the first rule an address falls under names the refusal.
_RULES: tuple[tuple[str, tuple[Network, ...]], ...] = (
    ("a loopback address", _nets("127.0.0.0/8", "::1/128")),
    ("an unspecified address", _nets("0.0.0.0/8", "::/128")),
    ("a link-local address", _nets("169.254.0.0/16", "fe80::/10")),
    ("a private address", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10")),
    ("a shared (CGNAT) address", _nets("100.64.0.0/10")),
    ("a multicast address", _nets("224.0.0.0/4", "ff00::/8")),
    ("a broadcast address", _nets("255.255.255.255/32")),
    ("a reserved address", _nets("240.0.0.0/4", "192.0.0.0/24", "198.18.0.0/15", "100::/64")),
    ("a documentation address", _nets("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")),
)
_NOT_IN_NAMES = frozenset(" %/\\@[]<>\"'`{}|^")
_NAT64 = _nets("64:ff9b::/96", "64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")


def classify(address: Address) -> str | None:
    """The rule that refuses `address` ("a loopback address", …), or None for a public one."""
    for name, networks in _RULES:
        if any(address in n for n in networks if n.version == address.version):
            return name
    if not address.is_global:
        return "a non-public address"
    return None


def embedded_ipv4(address: Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 one carries, and the form that carries it."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    if address.teredo is not None:
        return "Teredo", address.teredo[1]
    low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in n for n in _NAT64):
        return "NAT64", low
    if address in _IPV4_TRANSLATED:
        return "IPv4-translated", low
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return "IPv4-compatible", low
    return None


def parse_allow(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """`--fetch-allow` values as networks (an address alone is its /32 or /128). Raises `ValueError`."""
    out: list[Network] = []
    for value in cidrs:
        for part in value.replace(",", " ").split():
            try:
                out.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"--fetch-allow takes CIDR ranges (e.g. 10.0.0.0/8), got {part!r}") from None
    return tuple(out)


def _ipv4_part(text: str) -> int | None:
    """One part of a numeric IPv4 host: decimal, 0x hex or 0-prefixed octal (as inet_aton reads it)."""
    lower = text.lower()
    try:
        if lower.startswith("0x"):
            return int(lower[2:] or "0", 16)
        if len(lower) > 1 and lower.startswith("0"):
            return int(lower[1:], 8)
        return int(lower, 10) if lower.isdigit() else None
    except ValueError:
        return None


def numeric_host(host: str) -> Address | None:
    """The address a numeric host names, in any form; None for a name. Raises `BadUrl` for a
    host that ends in a number but is no address (`1.2.3.4.5`, `foo.0x1`)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise BadUrl("the host is not a valid IPv6 address") from None
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not parts or _ipv4_part(parts[-1]) is None:
        return None
    values = [_ipv4_part(p) for p in parts]
    if len(parts) > 4 or any(v is None for v in values):
        raise BadUrl("a host that ends in a number must be an IPv4 address")
    numbers = [v for v in values if v is not None]
    *front, last = numbers
    if any(v > 255 for v in front) or last >= 256 ** (5 - len(numbers)):
        raise BadUrl("the host is not a valid IPv4 address")
    value = last
    for i, v in enumerate(front):
        value += v << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


@dataclass(frozen=True)
class Target:
    """A URL the gateway may try, with its host normalised (a numeric host as its address)."""

    url: str
    scheme: str
    host: str  # a name, or an address's canonical text (IPv6 without brackets)
    port: int
    address: Address | None  # set when the host was numeric


@dataclass(frozen=True)
class DestinationPolicy:
    """The refused ranges, less what the operator allowed (`--fetch-allow`)."""

    allow: tuple[Network, ...] = ()
    hint: str = ALLOW_HINT

    def with_hint(self, hint: str) -> DestinationPolicy:
        return DestinationPolicy(self.allow, hint)

    def allowed(self, address: Address) -> bool:
        candidates: list[Address] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)  # the kernel dials the IPv4 address itself
        return any(a in n for a in candidates for n in self.allow if n.version == a.version)

    def refusal(self, address: Address, host: str | None = None) -> Refused | None:
        """Why `address` (reached through `host`, a name, if any) is refused, or None."""
        if self.allowed(address):
            return None
        shown = f"{host} resolves to" if host else f"{address} is"
        carried = embedded_ipv4(address)
        if carried is not None:
            form, inner = carried
            rule = classify(inner)
            if rule is not None:
                return Refused(f"destination {shown} {rule} ({form} {inner})", self.hint)
        rule = classify(address)
        if rule is not None:
            return Refused(f"destination {shown} {rule}", self.hint)
        return None

    def check(self, address: Address, host: str | None = None) -> None:
        refusal = self.refusal(address, host)
        if refusal is not None:
            raise refusal

    def target(self, url: str) -> Target:
        """`url` checked for what needs no resolution: scheme, credentials, a numeric host's
        address. Raises `BadUrl` or `Refused`."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise BadUrl("the URL is malformed") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise BadUrl("only http:// and https:// URLs are fetched")
        if "@" in parts.netloc:
            raise BadUrl("URLs with credentials (user:password@) are not fetched")
        raw = parts.netloc.rsplit(":", 1)[0] if port is not None or parts.netloc.endswith(":") else parts.netloc
        if not raw or not parts.hostname:
            raise BadUrl("the URL has no host")
        address = numeric_host(raw.lower())
        host = str(address) if address is not None else parts.hostname.rstrip(".")
        if not host:
            raise BadUrl("the URL has no host")
        if address is None and (not host.isprintable() or any(c in _NOT_IN_NAMES for c in host)):
            raise BadUrl("the host is not a valid name")
        if address is not None:
            self.check(address)
        port = port if port is not None else (443 if scheme == "https" else 80)
        return Target(_rebuild(parts, scheme, host, port, address), scheme, host, port, address)


def _rebuild(parts: SplitResult, scheme: str, host: str, port: int, address: Address | None) -> str:
    """The URL with its host as checked, so what is dialled is what was checked."""
    shown = f"[{host}]" if isinstance(address, ipaddress.IPv6Address) else host
    default = 443 if scheme == "https" else 80
    netloc = shown if port == default else f"{shown}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
