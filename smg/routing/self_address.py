"""Whether a worker URL leads to the gateway itself: a gateway registered as its own worker
relays every request to itself, each relayed request again, until descriptors run out.

The URL's port is compared with the port the gateway listens on first (no name is resolved
for a worker on another port); then its host, resolved, with the address the gateway binds:
the same address when it binds one, any of the host's own addresses when it binds the
wildcard (`0.0.0.0`: IPv4, `::`: both). An address is the host's own when it is a loopback
address or one the host can bind (an interface address: binding sends nothing), which covers
the host's names, its interface addresses and any name that resolves to them. A loop this cannot
see (a proxy, a DNS name of a load balancer in front of the gateway) is cut by the hop header
(`smg.protocol.hops`).
"""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv6Address, ip_address
from urllib.parse import urlsplit

IPAddress = IPv4Address | IPv6Address

_DEFAULT_PORTS = {"http": 80, "https": 443, "grpc": 443}
_WILDCARDS = {"": (4, 6), "0.0.0.0": (4,), "::": (4, 6), "[::]": (4, 6)}


def _normal(ip: IPAddress) -> IPAddress:
    """One spelling per address: IPv4-mapped IPv6 as IPv4; the unspecified address as the
    loopback one (a connect to it reaches this host)."""
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return ip_address("127.0.0.1") if ip.version == 4 else ip_address("::1")
    return ip


def resolve(host: str, port: int) -> set[IPAddress]:
    """The addresses `host` resolves to (none when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    out: set[IPAddress] = set()
    for info in infos:
        try:
            out.add(_normal(ip_address(str(info[4][0]).split("%", 1)[0])))
        except ValueError:
            continue
    return out


def is_own_address(ip: IPAddress) -> bool:
    """Whether `ip` is one of this host's addresses."""
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


class ListeningAddress:
    """Where the gateway listens (`--host`, `--port`)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._families = _WILDCARDS.get(host)
        self._bound = set() if self._families is not None else resolve(host, port)

    @property
    def loopback_only(self) -> bool:
        """Whether only this host can connect (every address bound is a loopback one)."""
        return self._families is None and bool(self._bound) and all(ip.is_loopback for ip in self._bound)

    def _reaches(self, ip: IPAddress) -> bool:
        if self._families is None:
            return ip in self._bound
        return ip.version in self._families and is_own_address(ip)

    def leads_here(self, url: str) -> bool:
        """Whether a request to `url` (an http(s):// or grpc:// worker's) reaches this gateway.
        May resolve the URL's host: call it off the event loop."""
        try:
            parts = urlsplit(url)
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
        except ValueError:
            return False
        if port != self.port or not parts.hostname:
            return False
        return any(self._reaches(ip) for ip in resolve(parts.hostname, port))
