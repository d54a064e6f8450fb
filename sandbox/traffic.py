"""`inv sandbox.traffic`: traffic for the sandbox's servers, and where it stands against their
draft, so that a demo can show day 2: requests for a while, and the draft's acceptance moved away
from what it was trained on (the simulator's knob, /run/sglang-sim/accept_rate on each host: what
sglang_sim/sglang/sim_perf.py reads as each request starts), or put back.

With acceptance alpha and the demo's chain of 3 draft tokens, the accept length is
1 + alpha + alpha^2 + alpha^3: 2.95 at the simulator's 0.8, 1.25 at 0.2."""
from __future__ import annotations

import time
from contextlib import ExitStack

import yaml

from sandbox import fleet
from sandbox.routed import Load
from specops.errors import UsageError

KNOB = "/run/sglang-sim/accept_rate"  # sim_perf.ACCEPT_FILE, on the host


def _hosts(site: fleet.Site) -> list[tuple[fleet.Host, list[dict]]]:
    """(host, its services) of the sandbox's own inventory; a host's index from its address."""
    path = site.inventory_dir / "hosts.yml"
    try:
        hosts = yaml.safe_load(path.read_text())["all"]["children"]["sandbox"]["hosts"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not the inventory `inv sandbox.up` wrote ({type(e).__name__}: {e}); "
                         f"run inv sandbox.up") from None
    return [(fleet.Host(name, (int(v["address"].rsplit(".", 1)[1]) - 2) // 4, site), v.get("services") or [])
            for name, v in hosts.items()]


def accept_rate(text: str) -> float | str | None:
    """--accept-rate: a number from 0 to 1, "off" (the simulator's own again) or "" (leave it, None)."""
    if text in ("", "off"):
        return text or None
    try:
        alpha = float(text)
    except ValueError:
        alpha = -1.0
    if not 0 <= alpha <= 1:
        raise UsageError(f"--accept-rate: give a number from 0 to 1, or off (got {text})")
    return alpha


def traffic(accept_rate: float | str | None = None, seconds: float = 60, clients: int = 2) -> str:
    """Set (a number), put back ("off") or leave (None) the draft's acceptance on every sandbox host
    (as `accept_rate` reads --accept-rate), then send `clients` closed-loop requests to each server
    for `seconds`; what was done."""
    site, said, loads = fleet.DEFAULT_SITE, [], []
    alpha = accept_rate if accept_rate != "off" else None
    for h, services in _hosts(site):
        if accept_rate == "off":
            h.run("rm", "-f", KNOB)
            said.append(f"{h.name}: the draft's acceptance is the simulator's own again")
        elif alpha is not None:
            h.run("sh", "-c", f"mkdir -p {KNOB.rsplit('/', 1)[0]} && echo {alpha} > {KNOB}")
            said.append(f"{h.name}: the draft now accepts {alpha:g} of its tokens (accept length "
                        f"{1 + alpha + alpha ** 2 + alpha ** 3:.2f} with 3 draft steps)")
        loads += [(h, s, Load(h.address, s.get("port", 30000), s.get("api_key", ""), clients, 48))
                  for s in services if seconds > 0]
    with ExitStack() as running:  # every load started is stopped, however this ends
        for _, _, load in loads:
            running.enter_context(load)
        time.sleep(max(0.0, seconds - 2))  # each load's entry and exit wait a second
    for h, s, load in loads:
        got = load.summary()
        said.append(f"{h.name}/{s['name']}: {got['served']} requests served, {got['failed']} failed in {seconds:g} s")
    return "\n".join(said)
