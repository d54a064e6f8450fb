"""Verify: on the host, wait for each service to be ready, then compare what runs with what was
intended, and show what was found."""
from __future__ import annotations

from .. import kinds, protocol
from ..errors import SpecopsError
from ..output.report import accept_text
from ..run import HostRun


def checks(run: HostRun) -> list[protocol.ServiceCheck]:
    """What verify asks of each service of the host, from the inventory (no secrets: the agent
    reads the API key from the service's env file on the host)."""
    out = kinds.checks(run.host)
    if run.facts:  # paths the probe already resolved need no interpreter on the host again
        files = run.facts.data["files"]
        out = [protocol.replace(c, managed=[files[k]["path"] if (files.get(k) or {}).get("path") else k
                                               for k in c.managed]) for c in out]
    return out


LOOK_EVERY = 3.0  # seconds rank 0's agent waits before it answers, so that a lost rank ends the wait


def verify(run: HostRun, wanted: list[protocol.ServiceCheck] | None = None, last: bool = False) -> None:
    """Verify services (the inventory's, by default); raise SpecopsError naming each failure.
    With last, the same round trip gives the host lock back when verify ends."""
    wanted = checks(run) if wanted is None else wanted
    if not wanted:
        if last:
            run.lock.release()
        return
    spans = {svc["name"]: svc for svc in run.host.get("services") or [] if svc.get("nnodes")}
    for name in spans.keys() & {c.name for c in wanted}:
        run.rounds[name] = run.rounds.get(name, 0) + 1
        if spans[name]["node_rank"]:
            run.ranks.post(name, run.host.name, None, run.rounds[name])  # what an earlier verify found is old
    res = _ask(run, wanted, {c.name: spans[c.name]["nodes"] for c in wanted
                             if c.name in spans and not spans[c.name]["node_rank"]}, last)
    for s in res.services:
        if s.name in spans and spans[s.name]["node_rank"]:
            run.ranks.post(s.name, run.host.name, s.rank_down, run.rounds[s.name])
    # Merged by service: a later verify of one service (after a baseline) keeps the others'.
    found = {s["name"]: s for s in run.report.extra.get("verify") or []}
    found.update({s.name: protocol.to_dict(s) for s in res.services})
    run.report.extra["verify"] = list(found.values())
    failed = []
    for s in res.services:
        def say(text, s=s):
            run.say(f"{'verify':<15} {s.name}: {text}")
        for check in s.checks:
            say(check)
        if s.generate:
            g = s.generate
            say(f"/generate {g['completion_tokens']} tokens at {g['tok_s']} tok/s, spec_verify_ct "
                f"{g['spec_verify_ct']}, spec_accept_length {accept_text(g['spec_accept_length'])}")
        for note in s.notes:
            say(note)
        for f in s.failures:
            say(f"FAILED {f}")
        if s.journal:
            say("journal tail:")
            for line in s.journal.splitlines():
                run.say(f"{'':<15}   | {line}")
        if s.failures:
            failed.append(f"{s.name}: {'; '.join(s.failures)}")
        else:
            run.report.note_once(f"{s.name} verified")
    if failed:
        raise SpecopsError("verify failed: " + " | ".join(failed))


def _ask(run: HostRun, wanted: list[protocol.ServiceCheck], nodes: dict[str, list[str]],
         last: bool) -> protocol.VerifyResult:
    """One Verify; or, where this host is rank 0 of a service across `nodes`, whose ranks must be up,
    Verifies that answer every LOOK_EVERY seconds while it starts, with a look at what the other
    ranks' verifies (their hosts' threads) found between them: a rank down fails it at once."""
    say = lambda line: run.say(f"{'verify':<15}{line}")  # noqa: E731
    if not nodes:
        return run.call(protocol.Verify(services=wanted), last=last, on_stderr=say)
    done: dict[str, protocol.ServiceReport] = {}
    statuses: dict[str, list] = {c.name: [] for c in wanted}  # /health's answers over all the slices
    resume = False
    while len(done) < len(wanted):
        todo = [c for c in wanted if c.name not in done]
        res = run.call(protocol.Verify(services=todo, answer_within=LOOK_EVERY, resume=resume), on_stderr=say)
        resume = True
        for s in res.services:
            statuses[s.name] += [x for x in s.health_statuses if statuses[s.name][-1:] != [x]]
            if not s.starting:
                done[s.name] = s
        for c in todo:
            down = run.ranks.down(c.name, nodes.get(c.name, [])[1:], run.rounds.get(c.name, 1))
            if c.name not in done and down:
                node, why = next(iter(down.items()))
                done[c.name] = protocol.ServiceReport(name=c.name, failures=[
                    f"rank {nodes[c.name].index(node)} on {node} is down ({why}): this rank 0 cannot be ready "
                    f"without it"])
    for name, s in done.items():
        s.health_statuses = statuses[name]
    if last:
        run.lock.release()
    return protocol.VerifyResult(services=[done[c.name] for c in wanted])
