"""A private link between two sandbox hosts, as two GPU boxes on one rack network have.

A veth pair straight from one host's network namespace to the other's: what crosses it never
passes the controller, whose own links to the hosts are their eth0 (the `veth` ends counted in
controller_bytes).  The ends are named pr<index of the other host>; the link goes with either
namespace (a reset or a sweep), or with down().
"""
from __future__ import annotations

from pathlib import Path

from sandbox.fleet import Host, sh


def _addresses(a: Host, b: Host) -> tuple[str, str]:
    lo, hi = sorted((a.index, b.index))
    first, second = f"10.254.{lo}.{4 * hi + 1}", f"10.254.{lo}.{4 * hi + 2}"
    return (first, second) if a.index == lo else (second, first)


def up(a: Host, b: Host) -> tuple[str, str]:
    """Join a and b; returns (a's address, b's address) on the link."""
    down(a, b)
    sh("ip", "-n", a.netns, "link", "add", f"pr{b.index}", "type", "veth", "peer", "name", f"pr{a.index}",
       "netns", b.netns)
    for h, other, address in zip((a, b), (b, a), _addresses(a, b)):
        sh("ip", "-n", h.netns, "addr", "add", f"{address}/30", "dev", f"pr{other.index}")
        sh("ip", "-n", h.netns, "link", "set", f"pr{other.index}", "up")
    return _addresses(a, b)


def down(a: Host, b: Host) -> None:
    sh("ip", "-n", a.netns, "link", "del", f"pr{b.index}", check=False)


def shape(h: Host, other: Host, mbit: int | None) -> None:
    """Limit what h sends to `other` over the link to `mbit` (None: no limit), so a test can catch
    a copy midway."""
    sh("ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", f"pr{other.index}", "root", check=False)
    if mbit:
        sh("ip", "netns", "exec", h.netns, "tc", "qdisc", "add", "dev", f"pr{other.index}", "root", "tbf",
           "rate", f"{mbit}mbit", "burst", "64kb", "latency", "400ms")


def link_bytes(h: Host, other: Host) -> int:
    """Bytes h has received over its link to `other`."""
    out = sh("ip", "-n", h.netns, "-s", "-j", "link", "show", f"pr{other.index}").stdout
    import json
    return json.loads(out)[0]["stats64"]["rx"]["bytes"]


def controller_bytes(*hosts: Host) -> int:
    """Bytes the controller sent to and received from these hosts (their veth ends on its side)."""
    total = 0
    for h in hosts:
        stats = Path("/sys/class/net") / h.veth / "statistics"
        total += int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())
    return total
