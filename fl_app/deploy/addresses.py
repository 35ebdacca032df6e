"""Checks of the addresses an operator types: host names, loopback, and the insecure local-test mode's limits."""

from __future__ import annotations

import ipaddress
import re
import sys

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
INSECURE_REMOTE_FLAG = "--insecure-allow-remote"


def check_host(host: str, what: str = "--host") -> str:
    """A DNS name (labels of letters, digits and '-', 1-63 characters each, at most 253 in all) or an IP address;
    raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(host, str) and host:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            if len(host) <= 253 and all(DNS_LABEL.fullmatch(label) for label in host.split(".")):
                return host
    raise ValueError(
        f"{what} {host!r}: not a DNS name or an IP address (DNS names: labels of letters, digits and "
        "'-', 1-63 characters each, at most 253 characters in all)"
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_insecure_address(host: str, what: str, allow_remote: bool) -> None:
    """The insecure local-test mode sends everything in plain text without authentication: loopback only, unless
    the operator says otherwise in so many words (``allow_remote``), and then it is said loudly."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ValueError(
            f"{what} {host!r}: the insecure local-test mode (no TLS, no SuperNode authentication) only "
            f"uses loopback addresses ({', '.join(LOOPBACK_NAMES)}); for anything else set up TLS "
            f"(certs, keys) or pass {INSECURE_REMOTE_FLAG}"
        )
    print(
        f"WARNING: {what} {host!r} is not a loopback address: traffic is unencrypted and any host that reaches it "
        "can join or submit runs",
        file=sys.stderr,
        flush=True,
    )


def split_address(address: str) -> str:
    """The host of HOST:PORT or [IPv6]:PORT."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


# counts and ports an operator types, checked before anything is generated, written or printed
MAX_NODES = 10_000  # SuperNodes (key pairs, partitions) of one deployment
PORTS = (1, 65535)


def check_port(port, what: str = "--port") -> int:
    """A TCP port (1-65535); raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not PORTS[0] <= port <= PORTS[1]:
        raise ValueError(f"{what} {port!r}: not a TCP port; allowed: a whole number from {PORTS[0]} to {PORTS[1]}")
    return port


def check_count(count, what: str = "--nodes", high: int = MAX_NODES) -> int:
    """A number of SuperNodes (1 to ``high``); raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= high:
        raise ValueError(f"{what} {count!r}: allowed: a whole number from 1 to {high}")
    return count


def parse_address(address: str, what: str = "--address") -> tuple[str, int]:
    """(host, port) of HOST:PORT or [IPv6]:PORT, each checked (``check_host``, ``check_port``); raises
    ``ValueError`` naming ``what`` and the expected form otherwise."""
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    bracketed = host.startswith("[") and host.endswith("]")
    if not sep or not port.isdigit() or not host or (":" in host and not bracketed):
        raise ValueError(f"{what} {address!r}: expected HOST:PORT (an IPv6 address as [ADDRESS]:PORT)")
    host = host[1:-1] if bracketed else host
    where = f"{what} {address!r}:"
    return check_host(host, f"{where} host"), check_port(int(port), f"{where} port")


def join_address(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 address in brackets ([::1]:9093), as ``parse_address`` reads it back."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
