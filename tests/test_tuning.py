"""spec-tune's pure logic (specops/sglang/tuning.py) against the simulator's performance model in
closed form (sim_perf.steady_tok_s, the formula its docstring documents), and the write-back of
the winner into a host's vars file.  No fleet."""

import re
import types

import pytest

from specops.errors import UsageError
from specops.inventory import writeback
from sandbox.oracle import sim_perf
from specops.flows import tuning as tuning_flow
from specops.sglang import climb, tuning
from specops.sglang.tuning import Settings
from roles import VOCABULARY
from support.tuning import HOST_VARS, ISSUE_SPACE, SVC, host_vars_file, search_record

GOOD = {"SGLANG_SIM_ACCEPT_RATE": "0.8", "SGLANG_SIM_DRAFT_COST": "0.15"}
SEEDS = {"SGLANG_SIM_ACCEPT_RATE": "0.1", "SGLANG_SIM_DRAFT_COST": "0.35"}


def oracle(env, c):
    return lambda s: sim_perf.steady_tok_s(env, c, (s.num_steps, s.eagle_topk, s.num_draft_tokens))


def test_the_seeds_trap_is_never_a_candidate_and_the_pruning_says_why():
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    assert space.grid == 64 and len(space.candidates) < 64
    assert Settings(1, 1, 16) not in space.candidates
    trap = next(p for p in space.pruned if p.asked == {"num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 16})
    assert trap.runs_as == Settings(1, 1, 2) and "topk1-draft" in trap.reason
    # a tree of 1 step and topk 2 has 2 nodes: 15 draft tokens cannot be picked from it
    pool = next(p for p in space.pruned if p.asked == {"num_steps": 1, "eagle_topk": 2, "num_draft_tokens": 16})
    assert pool.runs_as is None and "2 candidate nodes" in pool.reason
    assert Settings(1, 2, 16) not in space.candidates
    assert len(set(space.candidates)) == len(space.candidates)


def test_a_bad_space_is_refused_in_one_line():
    with pytest.raises(UsageError, match="tune.num_stepz: not a knob"):
        tuning.asked_space(SVC, {"num_stepz": [1]})
    with pytest.raises(UsageError, match="list of positive integers"):
        tuning.asked_space(SVC, {"num_steps": [0, 2]})
    with pytest.raises(UsageError, match="NGRAM has none to search"):
        tuning.asked_space({**SVC, "speculative": {"algorithm": "NGRAM"}}, None)


@pytest.mark.parametrize("c", [1, 4, 8, 32])
def test_the_climb_finds_the_optimum_in_far_fewer_restarts_than_the_grid(c):
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    f = oracle(GOOD, c)
    best = max(space.candidates, key=f)
    run = climb.climb(space.candidates, f, Settings(3, 1, 4), budget=100)
    restarts = 1 + len(run.scores) + len(climb.finalists(run))  # baseline, climb, finalists' full load
    assert f(run.best()) >= 0.97 * f(best), (run.best(), best)
    assert restarts <= 0.4 * (space.grid + 1), restarts


def test_the_optimum_alone_differs_from_the_optimum_at_32():
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    alone, busy = (max(space.candidates, key=oracle(GOOD, c)) for c in (1, 32))
    assert alone == Settings(5, 4, 16) and busy == Settings(3, 1, 4)
    assert oracle(GOOD, 32)(alone) < 0.9 * oracle(GOOD, 32)(busy)


def test_the_budget_caps_the_restarts():
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    calls = []
    run = climb.climb(space.candidates, lambda s: calls.append(s) or oracle(GOOD, 1)(s), Settings(3, 1, 4), budget=3)
    assert len(calls) == 3 and run.budget_spent


def test_no_setting_pays_with_the_seeds_draft_and_its_accept_length_is_flat():
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    for c in (1, 8, 32):
        base = sim_perf.steady_tok_s(SEEDS, c)
        assert max(oracle(SEEDS, c)(s) for s in space.candidates) < base
    accepts = {s: sim_perf.accept_length(0.1, 0.5, s.num_steps, s.eagle_topk, s.num_draft_tokens)
               for s in (Settings(1, 1, 2), Settings(3, 1, 4), Settings(3, 2, 8))}
    assert "the draft's own acceptance is the limit" in tuning.draft_limit(accepts, "t1")
    good = {s: sim_perf.accept_length(0.8, 0.5, s.num_steps, s.eagle_topk, s.num_draft_tokens) for s in accepts}
    assert tuning.draft_limit(good, "t1") is None
    # too narrow a spread of draft tokens says nothing either way
    assert tuning.draft_limit({Settings(1, 1, 2): 1.1, Settings(2, 1, 3): 1.1}, "t1") is None


def test_the_objective_reads_one_level_or_the_mean_and_holds_the_latency_bound():
    fig = {1: {"output_tok_s": 300.0, "itl_p99": 0.004}, 8: {"output_tok_s": 900.0, "itl_p99": 0.02}}
    base = {1: {"output_tok_s": 100.0}, 8: {"output_tok_s": 1000.0}}
    assert tuning.Objective(at=1).score(fig, base) == (300.0, "")
    assert tuning.Objective(at=1, mean=True).score(fig, base)[0] == pytest.approx((3.0 + 0.9) / 2)
    score, why = tuning.Objective(at=8, mean=True, max_itl_p99=0.01).score(fig, base)
    assert score is None and "20.0 ms at concurrency 8 is above 10.0 ms" in why
    assert tuning.Objective(at=1, max_itl_p99=0.01).score({1: fig[1]}, base)[0] == 300.0
    assert tuning.Objective(at=1).score({1: {**fig[1], "failed": 2}}, base) == (None, "requests failed")


def test_the_simulators_accept_length_is_leviathans_for_a_chain():
    """The one figure of the simulator's model checked against an outside source: for a chain
    (top-k 1) the expected tokens per verify is Leviathan et al.'s (1 - a^(g+1)) / (1 - a) with
    g drafted tokens, here computed by hand, not by the simulator's code."""
    for a, steps in ((0.8, 3), (0.5, 1), (0.9, 5)):
        expected = sum(a ** i for i in range(steps + 1))  # 1 + a + ... + a^g
        assert sim_perf.accept_length(a, 0.5, steps, 1, steps + 1) == pytest.approx(expected)


def test_the_winner_is_written_with_comments_and_order_kept_and_twice_is_a_no_op(tmp_path):
    (tmp_path / "host_vars").mkdir()
    path = tmp_path / "host_vars" / "t1.yml"
    path.write_text(HOST_VARS)
    assert writeback.vars_file(tmp_path, "t1") == path
    assert writeback.write_speculative(path, "sglang", {"num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 16})
    text = path.read_text()
    assert text == HOST_VARS.replace("num_steps: 3 ", "num_steps: 5 ").replace("eagle_topk: 1", "eagle_topk: 4") \
        .replace("num_draft_tokens: 4", "num_draft_tokens: 16")
    assert not writeback.write_speculative(path, "sglang", {"num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 16})
    assert path.read_text() == text
    with pytest.raises(UsageError, match="no service 'other'"):
        writeback.write_speculative(path, "other", {"num_steps": 1})
    with pytest.raises(UsageError, match="no such file"):
        writeback.vars_file(tmp_path, "t2")


def test_the_verdict_names_the_winner_keeps_what_runs_within_3pct_and_refuses_what_does_not_pay():
    a, b = Settings(3, 1, 4), Settings(5, 4, 16)
    rec = search_record([(a, "short", 200, 3.0), (b, "short", 270, 5.3), (b, "full", 268, 5.3), (a, "full", 201, 3.0)])
    assert rec["winner"] == b.spec() and rec["changes"] and rec["apply"] == b.spec()
    assert rec["verdict"] == "best: steps 5, topk 4, draft tokens 16: 2.68x at concurrency 1"
    assert rec["inventory_lines"][1:] == ["    num_steps: 5", "    eagle_topk: 4", "    num_draft_tokens: 16"]
    # within 3% of what runs now: what runs stays, nothing to write, and the verdict says so
    rec = search_record([(a, "short", 264, 5.2), (b, "short", 270, 5.3), (b, "full", 268, 5.3), (a, "full", 262, 5.2)])
    assert rec["winner"] == a.spec() and rec["kept"] and not rec["changes"] and not rec["inventory_lines"]
    assert rec["verdict"] == ("what runs now (steps 3, topk 1, draft tokens 4) stays: 2.62x at concurrency 1; the "
                              "best measured, steps 5, topk 4, draft tokens 16 at 2.68x, does not beat it by 3%")
    # what runs now measured best outright (issue 38: the verdict named it as if it were new)
    rec = search_record([(a, "short", 280, 5.2), (b, "short", 270, 5.3), (a, "full", 281, 5.2), (b, "full", 268, 5.3)])
    assert rec["winner"] == a.spec() and not rec["kept"] and not rec["changes"] and not rec["inventory_lines"]
    assert rec["verdict"] == ("what runs now (steps 3, topk 1, draft tokens 4) is already the best measured: "
                              "2.81x at concurrency 1")
    # nothing reaches min_speedup: no winner, and the advice to serve without speculation
    rec = search_record([(a, "short", 90, 1.2), (b, "short", 95, 1.3), (b, "full", 96, 1.3)], min_speedup=1.0)
    assert rec["winner"] is None and "serve sglang without speculation" in rec["verdict"]
    assert rec["verdict"].startswith("no settings serve faster than without speculation at concurrency 1: ")
    assert "the best, steps 5, topk 4, draft tokens 16, is 0.96x" in rec["verdict"]
    rec = search_record([(a, "short", 90, 1.2), (b, "short", 105, 1.3), (b, "full", 106, 1.3)], min_speedup=1.1)
    assert rec["verdict"].startswith("no settings serve at least 1.1x as fast as without speculation at ")


def test_the_objective_and_the_grid_are_said_in_numbers_that_agree():
    """Issue 38: "must beat serving without speculation by 1.0x"; "80 combinations asked; 51
    distinct" then "the grid would need 81" with no word of what the 81 was."""
    assert tuning.Objective(at=1).describe() == ("output tok/s at concurrency 1; it must serve faster than "
                                                 "without speculation")
    assert tuning.Objective(at=8, min_speedup=1.25).describe().endswith(
        "it must serve at least 1.25x as fast as without speculation")
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    said = space.summary()
    asked, distinct, again, refused = (int(n) for n in re.findall(r"(\d+) (?:combinations|distinct|that|it)", said))
    assert said.startswith("64 combinations asked: ") and asked == 64 == distinct + again + refused, said
    assert distinct == len(space.candidates) and refused == sum(1 for p in space.pruned if not p.runs_as), said
    lines = []  # issue 50: the header said 16 + 13, its lines 17 + 13 + 2 (adjusted settings measured, as pruned)
    tuning_flow.say_space(types.SimpleNamespace(say=lines.append), space)
    assert lines[0] == said and sum(int(re.match(r"  pruned (\d+) ", l).group(1)) for l in lines[1:]) == again + refused
    assert any(p.kept for p in space.pruned), "no setting SGLang adjusts is measured: the case is not tried"
    assert len(search_record([(Settings(3, 1, 4), "short", 200, 3.0)])["pruned"]) == again + refused  # the page's count
    assert space.grid_words() == "65 restarts (64 combinations + the baseline)"
    assert space.grid_words(2) == "129 restarts (64 combinations × 2 drafts + the baseline)"
    rec = search_record([(Settings(3, 1, 4), "short", 200, 3.0)])
    assert rec["grid_restarts"] == 65 and rec["said"][1] == ("0 restarts, where the full grid would need 65 restarts "
                                                             "(64 combinations + the baseline)"), rec["said"]


def test_a_plateau_does_not_stop_the_climb():
    """Seen on the fleet: from steps 3 (a chain), the chain of 5 measured as fast, and the tree
    that wins is a neighbour of the chain of 5 only.  The climb steps sideways onto the equal
    neighbour and goes on (it stopped at its start before)."""
    space = tuning.prune(SVC, tuning.asked_space(SVC, {"num_steps": [1, 3, 5], "eagle_topk": [1, 4],
                                                       "num_draft_tokens": [4, 16]}))
    f = oracle(GOOD, 1)
    flat = lambda s: f(Settings(3, 1, 4)) if s == Settings(5, 1, 6) else f(s)  # noqa: E731
    run = climb.climb(space.candidates, flat, Settings(3, 1, 4), budget=7)
    assert run.best() == Settings(5, 4, 16) and run.path[1] == Settings(5, 1, 6)


def test_a_linked_or_anchored_vars_file_is_refused_and_left_as_it_is(tmp_path):
    real = host_vars_file(tmp_path, "real")
    link = tmp_path / "host_vars" / "t1.yml"
    link.symlink_to(real)
    with pytest.raises(UsageError, match="t1.yml: a symbolic link"):
        writeback.write_speculative(link, "sglang", {"num_steps": 5})
    anchored = host_vars_file(tmp_path, "t2", "services:\n- name: sglang\n  model_path: /m\n  speculative: &spec\n"
                                     "    algorithm: EAGLE3\n    num_steps: 3\n- name: other\n  model_path: /m\n"
                                     "  speculative: *spec\n")
    before = anchored.read_text()
    with pytest.raises(UsageError, match=r"is the YAML anchor &spec"):
        writeback.write_speculative(anchored, "sglang", {"num_steps": 5})
    assert anchored.read_text() == before and real.read_text() == HOST_VARS


def _tuned(name, service="sglang", apply=None):
    from types import SimpleNamespace
    rec = {"service": service, "changes": True, "winner": apply, "apply": apply,
           "objective": {"at": 1, "min_speedup": 1.2}, "load": {"concurrency": [1], "requests": 8}}
    return SimpleNamespace(name=name, result=rec)


def test_apply_checks_every_file_before_it_writes_one_and_puts_them_back_when_the_deploy_fails(tmp_path, capsys):
    from types import SimpleNamespace
    from specops.flows import tuning_apply
    a = host_vars_file(tmp_path, "t1")
    b = host_vars_file(tmp_path, "t2", HOST_VARS.replace("name: sglang", "name: elsewhere"))  # no service of that name
    sel = SimpleNamespace(inventory=str(tmp_path), host="t1,t2", group=None, all=False)
    winner = {"num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 16}
    deploys = []
    with pytest.raises(UsageError, match="t2.yml: defines no service 'sglang'"):
        tuning_apply.apply(sel, [_tuned("t1", apply=winner), _tuned("t2", apply=winner)], deploys.append, VOCABULARY)
    assert a.read_text() == HOST_VARS and deploys == []
    assert "wrote" not in capsys.readouterr().out  # t1 never written: t2's file was refused first

    def failing_deploy(body):
        assert "num_steps: 5" in a.read_text()  # the deploy sees the winner
        raise SystemExit(1)  # a gate refused it
    with pytest.raises(SystemExit):
        tuning_apply.apply(sel, [_tuned("t1", apply=winner)], failing_deploy, VOCABULARY)
    assert a.read_text() == HOST_VARS and "put back as it was" in capsys.readouterr().out
    tuning_apply.apply(sel, [_tuned("t1", apply=winner)], deploys.append, VOCABULARY)  # a deploy that ends well
    assert "num_steps: 5" in a.read_text() and len(deploys) == 1 and b.read_text().count("elsewhere") == 1


def test_a_candidates_start_names_its_settings_before_the_transient_unit(monkeypatch, capsys):
    """Issue 38: `candidate: specops-baseline-sglang started (steps 3, …)` read as if the baseline
    ran.  The line names what runs, then the unit every window's transient server runs under."""
    from types import SimpleNamespace
    from specops import protocol
    from specops.agent.bench import baseline
    monkeypatch.setattr(baseline, "Unit", lambda name: SimpleNamespace(active=True))
    monkeypatch.setattr(baseline, "run_quiet", lambda argv: (0, ""))
    monkeypatch.setattr(baseline, "on_interrupt", lambda f: None)
    monkeypatch.setattr(baseline, "remember_invocation", lambda name: None)
    monkeypatch.setattr(baseline, "stop_unit", lambda *a, **k: None)
    monkeypatch.setattr(baseline.http, "request", lambda *a, **k: SimpleNamespace(status=200))
    monkeypatch.setattr(baseline.listeners, "Listener", lambda *a: SimpleNamespace(problem=lambda: None))
    baseline.start(protocol.BaselineStart(service="sglang", argv=["python"], port=30000, label="candidate",
                                          what="steps 3, topk 1, draft tokens 4"))
    said = capsys.readouterr().err
    assert "  candidate: steps 3, topk 1, draft tokens 4 started (transient unit specops-baseline-sglang)\n" in said
    assert "  candidate: ready" in said
