"""spec-tune's window body (flows/tuning_search.py) and its climb, with the servers replaced: each
"restart" is a call to a stand-in serve(), and each measure reads a landscape of tok/s by the
candidate's flags on the command line it would have run.  No fleet, no simulator: the landscape
is a table in the test.  What is checked: the restart budget and the reserve kept for a finalist's
full load, a GPU that stays busy ending the search, the keep margin at its boundary, a finalist
that could not be measured, the mean objective."""
from contextlib import contextmanager

import pytest

from specops import protocol
from specops.errors import SpecopsError
from specops.flows import specbench, transient
from specops.flows.tuning_record import record
from specops.flows.tuning_search import Search
from specops.inventory import Host
from specops.sglang import climb, tuning
from specops.sglang.tuning import Settings

SVC = {"name": "sglang", "model_path": "/m", "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d",
                                                             "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}
SPACE = {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4], "num_draft_tokens": [2, 4, 8, 16]}
BASE = 100.0


class Run:
    def __init__(self):
        self.host = Host("box", {"venv": "/v", "services": [SVC]})
        self.said = []

    def say(self, text):
        self.said.append(text)


def flag(argv, name):
    return int(argv[argv.index(name) + 1]) if name in argv else None


def landscape(table, default=120.0, busy_after=None, fails=()):
    """(serve, measure): tok/s from `table` (Settings → tok/s), the baseline at BASE."""
    current, served = {}, []

    @contextmanager
    def serve(argv, label="baseline", what=""):
        served.append(argv)
        current["argv"] = argv
        yield "unit"

    def measure(run, svc, load, unit=None):
        if busy_after is not None and len(served) > busy_after:
            raise transient.GpusBusy("GPU 0 still holds 1000 MiB")
        argv = current["argv"]
        steps = flag(argv, "--speculative-num-steps")
        if steps is None:
            tok = BASE
        else:
            s = Settings(steps, flag(argv, "--speculative-eagle-topk"), flag(argv, "--speculative-num-draft-tokens"))
            if s in fails:
                raise SpecopsError(f"{s.label()} did not start")
            tok = table.get(s, default)
        return [protocol.BenchLevel(concurrency=c, figures={"output_tok_s": tok * (1 + c / 100), "itl_p99": 0.01})
                for c in load.concurrency]
    return serve, measure, served


def search(monkeypatch, table, budget, objective=None, **kw):
    serve, measure, served = landscape(table, **kw)
    monkeypatch.setattr(specbench, "measure", measure)
    space = tuning.prune(SVC, tuning.asked_space(SVC, SPACE))
    load = specbench.Load(concurrency=[1, 8], requests=8)
    s = Search(Run(), SVC, space, objective or tuning.Objective(at=1), load, load, budget, ["/d"])
    return s, serve, served


@pytest.mark.parametrize("budget", [4, 5, 6, 12])
def test_the_budget_bounds_every_restart_and_keeps_one_for_a_finalists_full_load(monkeypatch, budget):
    s, serve, served = search(monkeypatch, {}, budget)
    s.search(serve, Settings(3, 1, 4))
    assert s.restarts == len(served) <= budget
    assert any(m["rung"] == "full" for m in s.measured)  # the reserve: at least one full load ran


def test_a_gpu_that_stays_busy_ends_the_search_it_is_not_a_candidate_out(monkeypatch):
    s, serve, _ = search(monkeypatch, {}, 10, busy_after=2)
    with pytest.raises(transient.GpusBusy):
        s.search(serve, Settings(3, 1, 4))
    assert all(m["out"] is None for m in s.measured)


def pair():
    """What runs now, and a neighbour of it (the climb's first step reaches it)."""
    space = tuning.prune(SVC, tuning.asked_space(SVC, SPACE))
    now = Settings(3, 1, 4)
    return now, climb.neighbours(now, space.candidates)[0]


def test_a_winner_replaces_what_runs_only_beyond_the_keep_margin(monkeypatch):
    now, other = pair()
    for gain, kept in ((1.029, True), (1.031, False)):
        s, serve, _ = search(monkeypatch, {now: 200.0, other: 200.0 * gain}, 20, default=150.0)
        s.search(serve, now)
        rec = record(s, now)
        assert rec["kept"] is kept and rec["changes"] is not kept, (gain, rec["verdict"])
        assert rec["winner"] == (now if kept else other).spec()


def test_a_finalist_that_could_not_be_measured_is_never_the_winner(monkeypatch):
    now, broken = pair()
    s, serve, _ = search(monkeypatch, {now: 295.0, broken: 300.0}, 20, default=150.0)
    s.search(serve, now)
    assert {m["settings"] for m in s.measured if m["rung"] == "full"} >= {now, broken}
    # the full load of the best short figure failed: the other finalist is judged alone
    s.measured = [dict(m, score=None, out="did not start") if m["settings"] == broken and m["rung"] == "full"
                  else m for m in s.measured]
    rec = record(s, now)
    assert rec["winner"] == now.spec()


def test_the_mean_objective_is_said_and_judged_over_the_levels(monkeypatch):
    now, better = pair()
    s, serve, _ = search(monkeypatch, {now: 200.0, better: 260.0}, 20, objective=tuning.Objective(at=1, mean=True),
                         default=150.0)
    s.search(serve, now)
    rec = record(s, now)
    assert "at the mean over the levels" in rec["verdict"] and rec["winner"] == better.spec()


def test_the_climb_never_stands_twice_on_a_plateau_and_says_when_the_budget_stopped_it():
    space = tuning.prune(SVC, tuning.asked_space(SVC, SPACE))
    flat = climb.climb(space.candidates, lambda s: 100.0, Settings(3, 1, 4), budget=1000)
    assert len(flat.path) == len(set(flat.path)) and not flat.budget_spent
    a, b = pair()  # a plateau of two, everything around it lower: one step across it, never back
    two = climb.climb(space.candidates, lambda s: 200.0 if s in (a, b) else 100.0, a, budget=1000)
    assert two.path == [a, b] or two.path == [a], two.path
    short = climb.climb(space.candidates, lambda s: 100.0 + s.num_draft_tokens, Settings(1, 1, 2), budget=2)
    assert short.budget_spent and len(short.scores) == 2
    spent = climb.climb(space.candidates, lambda s: 100.0, Settings(3, 1, 4), budget=3)  # flat, budget gone
    assert spent.budget_spent and spent.path == [Settings(3, 1, 4)]  # no sideways steps it cannot measure


@pytest.mark.parametrize("budget", [3, 1, 0, "two", 2.5, True])
def test_a_tune_budget_below_four_restarts_is_refused(budget):
    from specops.errors import UsageError
    with pytest.raises(UsageError, match="tune.budget must be a whole number of restarts, 4 or more"):
        tuning.asked_space(SVC, {"budget": budget})
