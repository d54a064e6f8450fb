"""`--traffic N` of spec-bench and spec-tune (and `tune: {traffic: N}`): measure on what the service
serves now, not on a prompt file.

The sample is taken on the host through SGLang's own request dump (agent/bench/traffic.py) while
the service serves, stays there (root's, 0700) for the task, and is dropped when the task ends,
however it ends; the controller keeps only its digest, size and time span, and the prompts only
with --fetch-sample.  Refused before anything changes: a service that is not an SGLang server, one
older than the first whose dump specops reads, one that runs as a `user:`.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from .. import cli, kinds, outfile, protocol
from ..errors import SpecopsError, UsageError

SINCE = "0.5.23"  # the agent's dump reader knows this release's shape (agent/bench/traffic.py SINCE)
DEFAULT_COUNT = 200  # requests a bare --traffic samples


@dataclass(frozen=True)
class Traffic:
    """What was asked: `count` finished requests, waited for at most `wait` seconds; `fetch`: a
    local path the sample is written to (0600)."""
    count: int
    wait: float = 600.0
    fetch: str | None = None

    @classmethod
    def parse(cls, count, wait=None, fetch=None) -> "Traffic | None":
        """From the task's options (text); None when no sample is asked for."""
        if count is None:
            if wait is not None or fetch:
                raise UsageError("--traffic-wait and --fetch-sample go with --traffic N")
            return None
        if fetch:  # written once the sample is taken: a typo is said before any connection
            outfile.check(os.path.expanduser(fetch), "--fetch-sample")
        return cls(count=DEFAULT_COUNT if count is True else cli.whole(count, "--traffic", 1),
                   wait=float(cli.whole(wait, "--traffic-wait", 1)) if wait is not None else 600.0, fetch=fetch)


def asked(svc: dict, given: Traffic | None, prompts: str | None = None) -> Traffic | None:
    """--traffic, else the service's `tune.traffic` (spec-tune only) unless --prompts names a file."""
    n = (svc.get("tune") or {}).get("traffic")
    return given or (Traffic(count=n) if n and not prompts else None)


def _release(text: str | None) -> tuple:
    """(0, 5, 23) of "0.5.23", "0.5.23rc1" or "0.5.23+cu124"; () of no version."""
    import re
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g or 0) for g in found.groups()) if found else ()


def refuse(run, svc: dict, facts) -> None:
    """Before anything changes: a server whose dump specops can read."""
    kind = kinds.kind_of(svc)
    if kind.name != "sglang":
        raise SpecopsError(f"{svc['name']} is a {kind.name}: a traffic sample comes from an SGLang server's request "
                           f"dump (SGLang {SINCE} or later); take it on a worker")
    if svc.get("user"):
        raise SpecopsError(f"{svc['name']} runs as {svc['user']}: its dump files would be {svc['user']}'s, and "
                           "specops reads only root's")
    workers = _flag(svc.get("extra_args") or [], "--tokenizer-worker-num")
    if workers not in (None, "1"):
        raise SpecopsError(f"{svc['name']} runs {workers} tokenizer workers (--tokenizer-worker-num): each keeps a "
                           "request dump of its own, and /configure_logging reaches one of them: no traffic sample")
    version = ((facts.venv(kinds.venv_of(run.host)) if facts else {}).get("packages") or {}).get("sglang")
    if _release(version) < _release(SINCE):
        raise SpecopsError(f"{svc['name']}: SGLang {version or '(not installed)'} has no request dump specops "
                           f"reads: --traffic needs SGLang {SINCE} or later")


def _flag(args: list, flag: str) -> str | None:
    """The value `args` give `flag` ("--flag V" or "--flag=V"), else None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return str(args[i + 1])
        if str(a).startswith(flag + "="):
            return str(a).split("=", 1)[1]
    return None


def span(sample: protocol.TrafficSample) -> str:
    """"200 requests (41 KiB) served over 1.2 min, up to 5 s ago"."""
    size = f"{sample.bytes / 1024:.0f} KiB" if sample.bytes >= 1024 else f"{sample.bytes} B"
    over = (sample.last - sample.first) if sample.first and sample.last else 0.0
    return f"{sample.requests} requests ({size}) served over " + \
        (f"{over:.0f} s" if over < 90 else f"{over / 60:.1f} min")


def identity(sample: protocol.TrafficSample) -> dict:
    """What a result keeps of the sample: never a prompt."""
    return {"prompts": "traffic sample", "prompts_sha256": sample.sha256, "prompts_count": sample.requests,
            "traffic": {"requests": sample.requests, "bytes": sample.bytes, "files": sample.files,
                        "first": sample.first, "last": sample.last, "ended": sample.ended,
                        "token_ids": sample.token_ids, "skipped": sample.skipped, "stale": sample.stale}}


def write_local(path: str, prompts: list) -> None:
    """--fetch-sample: the sample as captured (a JSON list of {"text" | "input_ids", "max_new_tokens"}),
    0600, never through a link."""
    import json
    try:
        fd = os.open(os.path.expanduser(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise SpecopsError(f"--fetch-sample {path}: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        json.dump(prompts, f)


@contextlib.contextmanager
def sampled(run, svc: dict, ask: Traffic | None):
    """The service's traffic sample for the body of a task (None: none asked for), dropped at its end."""
    if ask is None:
        yield None
        return
    kind = kinds.kind_of(svc)
    check, unit = kind.check(run.host, svc), kind.unit(svc).name
    try:
        sample = run.call(protocol.TrafficCapture(service=check, unit=unit, count=ask.count, timeout=ask.wait,
                                                  fetch=bool(ask.fetch)), on_stderr=lambda line: run.say(line.strip()))
        run.say(
            f"traffic sample: {span(sample)}, ended by {'the count' if sample.ended == 'count' else 'the time limit'}"
            + (f"; {sample.skipped} request(s) without text or token ids left out" if sample.skipped else "")
            + (f"; {sample.stale} the server held from before left out" if sample.stale else "")
        )
        if ask.fetch:
            write_local(ask.fetch, sample.prompts or [])
            run.say(f"traffic sample written to {ask.fetch} (0600: it holds what users sent)")
        yield sample
    finally:
        t0 = time.monotonic()
        try:
            dropped = run.call(protocol.TrafficDrop(service=check, unit=unit))
            if dropped.dump_was_on:
                run.say("the request dump was still on: turned off" if dropped.turned_off else
                        "WARNING: the request dump specops started is still on: its port is no longer the unit's, "
                        "so no key went there to turn it off")
            run.report.notes.append(
                "traffic sample deleted on the host" if dropped.removed else "no traffic sample left"
            )
        except SpecopsError as e:  # what went wrong first stays the error; this is said beside it
            run.say(f"WARNING: the traffic sample could not be dropped ({e}); the next --traffic run removes it "
                    f"({time.monotonic() - t0:.0f} s)")
