"""Rank 0's verify while another rank is down: it asks its agent in slices and looks, between
them, at what the other ranks' verifies found (run.Ranks).  No fleet: a run whose agent answers
"starting" until told otherwise."""
from types import SimpleNamespace

from specops import protocol
from specops.flows import verify as verify_flow
from specops.run import Ranks


class Rank0Run:
    """What _ask needs of a HostRun: its agent always answers "still starting"."""

    def __init__(self, ranks):
        self.ranks, self.calls, self.unlocked = ranks, [], False
        self.host, self.rounds = SimpleNamespace(name="t1"), {"sglang": 1}

    def call(self, request, on_stderr=None, last=False):
        self.calls.append(request)
        if len(self.calls) == 2:  # meanwhile, rank 1's verify (another thread) finds its unit stopped
            self.ranks.post("sglang", "t2", "unit sglang is inactive/dead", 1)
        if len(self.calls) == 10:  # its ceiling: what it says without the look at the other ranks
            return protocol.VerifyResult(services=[protocol.ServiceReport(name=c.name, failures=["not ready"])
                                                   for c in request.services])
        return protocol.VerifyResult(services=[protocol.ServiceReport(name=c.name, starting=True)
                                               for c in request.services])

    def say(self, text):
        pass

    @property
    def lock(self):
        return SimpleNamespace(release=lambda: setattr(self, "unlocked", True))


def test_a_rank_found_down_ends_rank_0s_wait_naming_it():
    run = Rank0Run(Ranks())
    check = protocol.ServiceCheck(name="sglang", port=30000)
    res = verify_flow._ask(run, [check], {"sglang": ["t1", "t2"]}, last=True)
    assert len(run.calls) == 2 and all(r.answer_within == verify_flow.LOOK_EVERY for r in run.calls)
    assert res.services[0].failures == [
        "rank 1 on t2 is down (unit sglang is inactive/dead): this rank 0 cannot be ready without it"]
    assert run.unlocked
    assert [r.resume for r in run.calls] == [False, True]  # the agent's wait goes on between slices


def test_what_the_deploys_verify_found_does_not_fail_the_rollbacks():
    """A deploy that fails is rolled back on every node, and verified again: rank 1's "down"
    from the deploy's verify (posted even after rank 0's ended) is not the rollback's."""
    ranks = Ranks()
    run = Rank0Run(ranks)
    run.rounds["sglang"] = 2  # rank 0's rollback verify
    ranks.post("sglang", "t2", "unit sglang is inactive/dead", 1)
    statuses = iter([["no listener"], ["no listener", 503], [503, 200]])
    run.call = lambda request, on_stderr=None, last=False: run.calls.append(request) or protocol.VerifyResult(
        services=[protocol.ServiceReport(name="sglang", starting=len(run.calls) < 3, health_statuses=next(statuses))])
    res = verify_flow._ask(run, [protocol.ServiceCheck(name="sglang", port=30000)], {"sglang": ["t1", "t2"]}, False)
    assert len(run.calls) == 3 and res.services[0].failures == []
    assert res.services[0].health_statuses == ["no listener", 503, 200]  # over the slices, each change once


def test_a_rank_verified_again_is_no_longer_down_and_a_single_host_asks_once():
    ranks = Ranks()
    ranks.post("sglang", "t2", "down", 1)
    ranks.post("sglang", "t2", None, 1)
    assert ranks.down("sglang", ["t2", "t3"], 1) == {}
    run = Rank0Run(ranks)
    run.call = lambda request, on_stderr=None, last=False: run.calls.append((request, last)) or \
        protocol.VerifyResult(services=[protocol.ServiceReport(name="sglang")])
    verify_flow._ask(run, [protocol.ServiceCheck(name="sglang", port=30000)], {}, last=True)
    assert [(r.answer_within, last) for r, last in run.calls] == [(None, True)]  # one call, the lock with it


def test_a_rank_whose_unit_failed_with_a_restart_queued_is_waited_for_not_said_down(monkeypatch):
    """systemd restarts a rank whose peer went (Restart=on-failure): failed with a job queued is
    on its way back; failed with none is down, said at once for rank 0."""
    from specops.agent.services import ranks
    states = iter([{"ActiveState": "failed", "SubState": "failed", "Job": "42"},
                   {"ActiveState": "active", "SubState": "running", "Job": ""}])
    monkeypatch.setattr(ranks, "unit_fact", lambda name: next(states))
    monkeypatch.setattr(ranks.listeners, "Listener", lambda *a: SimpleNamespace(problem=lambda: None))
    monkeypatch.setattr(ranks.asking, "call", lambda svc, method, path, timeout: (200, b""))
    monkeypatch.setattr(ranks.running, "stale_check", lambda svc, report, u: None)
    monkeypatch.setattr(ranks.time, "sleep", lambda s: None)
    svc = protocol.ServiceCheck(name="sglang", port=30000, timeout=60)
    report = ranks.rank_running(svc, protocol.ServiceReport(name="sglang"))
    assert report.rank_down is None and report.checks and not report.failures
    states = iter([{"ActiveState": "failed", "SubState": "failed", "Job": ""}])
    monkeypatch.setattr(ranks, "journal", lambda name, invocation=None: "")
    report = ranks.rank_running(svc, protocol.ServiceReport(name="sglang"))
    assert report.rank_down == "unit sglang is failed/failed"
