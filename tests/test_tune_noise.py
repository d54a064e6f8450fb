"""spec-tune under noise and across drafts, the pure parts (issue 37): a slow reading measured again
before it can drop a candidate (as it is read, or when a later neighbour shows it slow), a slow
full-load reading measured again, the baseline that moved (noisy figures, --apply refused unless
forced), the winner across drafts written with its draft, the drafts asked for checked."""
from types import SimpleNamespace

import pytest

from specops.errors import SpecopsError, UsageError
from specops.flows import tuning as flow, tuning_apply
from specops.sglang import climb, tuning
from specops.sglang.tuning import Settings
from roles import VOCABULARY
from support.tuning import (DRAFT, HOST_VARS, NOISE_SPACE as SPACE, SVC, QuietRun, bench_level, host_vars_file,
                            reader as _reader, search_record, space as _space)

def test_a_slow_reading_is_measured_again_when_read_and_the_better_one_stands():
    cands = _space()
    from sandbox.oracle import sim_perf
    knobs = {"SGLANG_SIM_TOK_S": "200", "SGLANG_SIM_DRAFT_COST": "0.15", "SGLANG_SIM_ACCEPT_RATE": "0.8"}
    truth = {s: sim_perf.steady_tok_s(knobs, 1, (s.num_steps, s.eagle_topk, s.num_draft_tokens)) for s in cands}
    best = max(cands, key=truth.get)
    assert best == Settings(5, 4, 16) and climb.climb(cands, truth.get, Settings(3, 1, 4), budget=100).best() == best
    read, seen = _reader(truth, {best})
    c = climb.climb(cands, read, Settings(3, 1, 4), budget=100)
    assert seen.count(best) == 2 and [a[0] for a in c.again] == [best] and c.scores[best] == truth[best]
    assert c.best() == best


def test_a_start_that_read_slow_is_measured_again_once_a_neighbour_shows_it():
    cands = _space()
    truth = {s: 200.0 if s == Settings(3, 1, 4) else 150.0 for s in cands}
    read, seen = _reader(truth, {Settings(3, 1, 4)})  # read first, with no neighbour to compare yet
    c = climb.climb(cands, read, Settings(3, 1, 4), budget=100)
    assert seen.count(Settings(3, 1, 4)) == 2 and c.best() == Settings(3, 1, 4)


def test_a_reading_only_somewhat_lower_is_not_measured_again():
    cands = _space()
    truth = {s: 100.0 + 40 * (s == Settings(3, 1, 4)) for s in cands}  # 100 against 140: above 0.7
    read, seen = _reader(truth, set())
    c = climb.climb(cands, read, Settings(3, 1, 4), budget=100)
    assert not c.again and len(seen) == len(set(seen))


def test_a_slow_full_reading_is_measured_again_within_the_budget():
    c = climb.Climb(scores={Settings(5, 4, 16): 300.0, Settings(3, 4, 16): 290.0})
    read, seen = _reader({Settings(5, 4, 16): 300.0, Settings(3, 4, 16): 290.0}, {Settings(5, 4, 16)})
    scores = climb.final(c, read, budget=3)
    assert scores == {Settings(5, 4, 16): 300.0, Settings(3, 4, 16): 290.0} and len(seen) == 3
    read, seen = _reader({Settings(5, 4, 16): 300.0, Settings(3, 4, 16): 290.0}, {Settings(5, 4, 16)})
    c.again = []
    assert climb.final(c, read, budget=1) == {Settings(5, 4, 16): 120.0} and c.budget_spent
    assert climb.winner_of(c, {}) == Settings(5, 4, 16) and climb.winner_of(c, {Settings(3, 4, 16): None}) is None


def test_the_search_keeps_within_its_budget_with_the_two_baselines():
    cands = _space()
    for budget in (4, 5, 8, 20):
        c, finals = climb.search(cands, lambda s: 100.0 + s.num_draft_tokens, lambda s: 100.0, Settings(3, 1, 4),
                                 budget)
        assert 2 + len(c.scores) + len(c.again) + len(finals) <= budget and finals, budget


def test_the_climb_leaves_a_sixth_of_the_budget_2_to_4_to_the_full_load():
    """A flat landscape keeps the climb going until its budget: what is left for finalists is
    what it reserved (short readings 3% apart are noise; the full load must see the top four)."""
    cands = tuning.prune(SVC, tuning.asked_space(SVC, {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4, 8],
                                                        "num_draft_tokens": [2, 4, 8, 16]})).candidates
    for budget, reserved in ((26, 4), (18, 3), (12, 2)):
        c, finals = climb.search(cands, lambda s: 100.0 + 0.01 * s.num_draft_tokens, lambda s: 100.0,
                                 Settings(3, 1, 4), budget)
        assert len(c.scores) + len(c.again) == budget - 2 - reserved and len(finals) == reserved, budget


def test_the_default_budget_is_40pct_of_the_grid_at_least_12_and_never_more_than_a_sweep_needs():
    space = tuning.prune(SVC, tuning.asked_space(SVC, None))
    assert climb.default_budget(space) == int(0.4 * (space.grid + 1)) == 32
    small = tuning.prune(SVC, tuning.asked_space(SVC, {"num_steps": [3], "eagle_topk": [1], "num_draft_tokens": [4]}))
    assert (climb.default_budget(small) == 5
            and climb.default_budget(tuning.prune(SVC, tuning.asked_space(SVC, SPACE))) == 12)
    c, finals = climb.search(small.candidates, lambda s: 100.0, lambda s: 100.0, small.candidates[0], 5)
    assert list(c.scores) == small.candidates and list(finals) == small.candidates and not c.budget_spent


def test_a_baseline_that_moved_makes_the_figures_noisy_and_apply_refuses_them_unless_forced(tmp_path):
    a, b = Settings(3, 1, 4), Settings(5, 4, 16)
    runs = [(a, "short", 200, 3.0), (b, "short", 270, 5.3), (b, "full", 268, 5.3), (a, "full", 201, 3.0)]
    quiet = search_record(runs, again=102.9)
    assert not quiet["noise"]["noisy"] and not any("noisy" in line for line in quiet["said"])
    rec = search_record(runs, again=96.0)
    assert rec["noise"] == {"baseline_moved": pytest.approx(-0.04), "noisy": True}
    assert any("the baseline moved -4.0%" in line and "--force" in line for line in rec["said"])
    path = host_vars_file(tmp_path, "t1")
    sel = SimpleNamespace(inventory=str(tmp_path), host="t1", group=None, all=False)
    deploys = []
    with pytest.raises(UsageError, match="t1: the tune's figures are noisy .* give --force"):
        tuning_apply.apply(sel, [SimpleNamespace(name="t1", result=rec)], deploys.append, VOCABULARY)
    assert path.read_text() == HOST_VARS and not deploys
    tuning_apply.apply(sel, [SimpleNamespace(name="t1", result=rec)], deploys.append, VOCABULARY, force=True)
    assert "num_steps: 5" in path.read_text() and len(deploys) == 1


def test_the_winner_across_drafts_is_written_with_its_draft_and_each_draft_reported():
    from specops.flows import specbench
    from specops.flows.tuning_record import record
    from specops.flows.tuning_search import Search
    other = "/models/wide"
    space = tuning.prune(SVC, tuning.asked_space(SVC, SPACE))
    s = Search(QuietRun(), SVC, space, tuning.Objective(at=1), specbench.Load(), specbench.Load(), 20, [DRAFT, other])
    s.base = s.base_again = [bench_level(1, 100.0)]
    for draft, st, tok_s, accept in ((DRAFT, Settings(3, 1, 4), 200, 3.0), (DRAFT, Settings(5, 4, 16), 210, 3.4),
                                     (other, Settings(3, 1, 4), 150, 2.2), (other, Settings(5, 4, 16), 290, 5.6)):
        for rung in ("short", "full"):
            s.measured.append({"draft": draft, "settings": st, "rung": rung, "levels": [bench_level(1, tok_s, accept)],
                               "score": tok_s, "out": None})
        s.climbs.setdefault(draft, climb.Climb()).scores[st] = tok_s
        s.finals.setdefault(draft, {})[st] = tok_s
    rec = record(s, Settings(3, 1, 4))
    assert rec["winner_draft"] == other and rec["apply"] == {"num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 16,
                                                             "draft_model_path": other}
    assert "draft /models/wide" in rec["verdict"]
    # one baseline for the whole sweep: every combination with each draft, and it
    assert rec["grid_restarts"] == 2 * space.grid + 1
    assert f"where the full grid would need {2 * space.grid + 1} restarts ({space.grid} combinations × 2 drafts + " \
           f"the baseline)" in rec["said"][1], rec["said"]
    from specops.output import tunepage
    page = "\n".join(tunepage.section([{"stamp": "r1", "tune": {"sglang": rec}}], "sglang"))
    assert f"where the full grid would need {2 * space.grid + 1};" in page
    by = {d["draft"]: d for d in rec["drafts"]}
    assert (by[DRAFT]["by_draft_tokens"]["4"]["accept_length"] == 3.0
            and by[other]["by_draft_tokens"]["16"]["speedup"] == 2.9)
    # the service fetches its draft from a source: writing another path would fetch the old one there
    why = tuning_apply.refusal("t1", rec, {**SVC, "draft_weights": {"source": "hf", "repo": "x/y"}}, force=True)
    assert "draft_weights" in why and tuning_apply.refusal("t1", rec, SVC, force=False) is None
    why = tuning_apply.refusal("t1", rec, {**SVC, "draft_config": {"eagle_config.x": 1}}, force=True)
    assert "draft_config" in why and "measured without them" in why


@pytest.mark.parametrize("drafts, error", [
    (["models/relative"], "distinct absolute paths on the host, not 'models/relative'"),
    ([DRAFT, DRAFT + "/"], "distinct absolute paths"), ([3], "not 3")])
def test_drafts_asked_must_be_distinct_absolute_paths(drafts, error):
    with pytest.raises(SpecopsError, match=error):
        flow.drafts_of({**SVC, "tune": {"drafts": drafts}})
    assert flow.drafts_of({**SVC, "tune": {"drafts": ["/x/", DRAFT + "/"]}}) == [DRAFT, "/x"]  # its own first
    assert flow.drafts_of({**SVC, "tune": {"drafts": ["/x"]}}) == [DRAFT, "/x"]  # what runs now is always measured
    assert flow.drafts_of(SVC) == [DRAFT]


def test_a_draft_is_checked_as_deploy_checks_the_services_own():
    import base64
    import json
    from specops.ops import Facts
    from specops.sglang import drafts

    def facts(draft_config, exists=True):
        doc = lambda d: {"exists": True, "type": "file",  # noqa: E731
                         "content_b64": base64.b64encode(json.dumps(d).encode()).decode()}
        return Facts({"files": {"/m/config.json": doc({"num_hidden_layers": 32}),
                                "/d2/config.json": doc(draft_config) if exists else {"exists": False}}})
    svc = {"name": "s", "model_path": "/m"}
    drafts.check(svc, "/d2", facts({"eagle_config": {drafts.LAYER_IDS: [2, 16, 29]}}), False)
    with pytest.raises(SpecopsError, match="draft /d2 has no config.json on the host"):
        drafts.check(svc, "/d2", facts({}, exists=False), False)
    with pytest.raises(SpecopsError, match="has -1 .* declares embedding capture"):
        drafts.check(svc, "/d2", facts({"eagle_config": {drafts.LAYER_IDS: [-1, 2, 16]}}), False)
    drafts.check(svc, "/d2", facts({"eagle_config": {drafts.LAYER_IDS: [-1, 2, 16]}}), True)
    unsafe = facts({})
    unsafe.data["files"]["/d2/config.json"]["unsafe_write"] = "/d2 is writable by alice"
    with pytest.raises(SpecopsError, match="another user can change it .*writable by alice"):
        drafts.check(svc, "/d2", unsafe, True)
    with pytest.raises(SpecopsError, match=r"^s: the draft /d2 \(its config.json: /d2/config.json\) was made for "
                                           r"another target: .* ids \[31\] are never captured"):
        drafts.check(svc, "/d2", facts({"eagle_config": {drafts.LAYER_IDS: [2, 16, 31]}}), False)


def test_apply_reads_the_inventory_for_a_winner_that_is_another_draft(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    t1:\n      address: 10.0.0.1\n")
    path = host_vars_file(tmp_path, "t1", HOST_VARS.replace("    speculative:\n",
                                                            "    draft_weights: {source: hf, repo: a/b}\n"
                                                            "    speculative:\n", 1))
    before = path.read_text()
    rec = {"service": "sglang", "changes": True, "winner": {"num_steps": 5}, "objective": {"at": 1}, "load": {},
           "apply": {"num_steps": 5, "draft_model_path": "/models/wide"}}
    sel = SimpleNamespace(inventory=str(tmp_path), host="t1", group=None, all=False)
    with pytest.raises(UsageError, match="t1: sglang brings its draft from `draft_weights:`"):
        tuning_apply.apply(sel, [SimpleNamespace(name="t1", result=rec)], lambda body: None, VOCABULARY, force=True)
    assert path.read_text() == before


@pytest.mark.parametrize("drafts", [5, [1, "x"], [{"draft": "/a", "by_draft_tokens": [1]}, {"draft": "/b"}],
                                    [{"draft": "/a",
                                      "by_draft_tokens": {"²": {"speedup": 2}, "4": {"speedup": float("inf")}}},
                                     {"draft": "/b", "speedup": True, "best": "x",
                                      "by_draft_tokens": {"4": {"speedup": 1.5}}}]])
def test_the_drafts_section_of_a_record_of_another_shape_shows_dashes_never_a_crash(drafts):
    from specops.output import tunepage
    html = "\n".join(tunepage._drafts({"drafts": drafts}))
    assert "<script" not in html


def test_the_drafts_section_draws_a_line_a_draft_even_when_two_share_a_directory_name():
    from specops.output import tunepage
    drafts = [{"draft": f"/{x}/eagle", "best": {"num_steps": 3}, "speedup": 1.5,
               "by_draft_tokens": {"4": {"speedup": 1.5, "accept_length": 2.5}, "16": {"speedup": 1.2 + i}}}
              for i, x in enumerate(("x", "y<b>"))]
    html = "\n".join(tunepage._drafts({"drafts": drafts, "winner_draft": "/x/eagle", "winner": {"num_steps": 3}}))
    assert html.count("<polyline") == 2 and "eagle (2)" in html and "y&lt;b&gt;" in html and "<b>" not in html
    assert html.count("data-winner") == 1 and "<td>2.50</td>" in html


def test_a_malformed_prompt_file_is_refused_when_the_task_is_asked_and_a_load_warms_up_first(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a"}\n{"messages": "hi"}\n')
    with pytest.raises(SpecopsError, match=f"prompts {bad} line 2"):
        flow.Ask.parse(budget=None, at=None, mean=False, max_itl_p99_ms=None, concurrency=None, requests=None,
                       max_new_tokens=None, prompts=str(bad))
    from specops.flows import specbench
    short = flow.short_load(specbench.Load(warmup=0, concurrency=[1]), tuning.Objective(at=1))
    assert short.warmup == 1


def test_tune_drafts_need_a_draft_model_and_a_config_json_file():
    with pytest.raises(SpecopsError, match="tune.drafts compares draft checkpoints; NEXTN here runs none"):
        flow.drafts_of({"name": "s", "speculative": {"algorithm": "NEXTN"}, "tune": {"drafts": ["/x"]}})
    from specops.ops import Facts
    from specops.sglang import drafts
    facts = Facts({"files": {"/d2/config.json": {"exists": True, "type": "dir"}}})
    with pytest.raises(SpecopsError, match="no config.json"):
        drafts.check({"name": "s", "model_path": "/m"}, "/d2", facts, False)


def test_a_reading_slow_every_time_is_measured_again_once_only():
    cands = _space()
    seen = []

    def read(s):
        seen.append(s)
        return 40.0 if s == Settings(5, 1, 6) else 200.0
    climb.climb(cands, read, Settings(3, 1, 4), budget=100)
    assert seen.count(Settings(5, 1, 6)) == 2


def test_apply_writes_into_the_inventory_the_tune_selected_from_spec_ops_inventory_too(tmp_path, monkeypatch):
    """No -i: $SPECOPS_INVENTORY, as the host selection read it (cli.inventory_path), never another."""
    a, b = Settings(3, 1, 4), Settings(5, 4, 16)
    rec = search_record([(a, "short", 200, 3.0), (b, "short", 270, 5.3), (b, "full", 268, 5.3), (a, "full", 201, 3.0)])
    path = host_vars_file(tmp_path, "t1")
    monkeypatch.setenv("SPECOPS_INVENTORY", str(tmp_path))
    deploys = []
    sel = SimpleNamespace(inventory=None, host="t1", group=None, all=False)
    tuning_apply.apply(sel, [SimpleNamespace(name="t1", result=rec)], deploys.append, VOCABULARY)
    assert "num_steps: 5" in path.read_text() and len(deploys) == 1


def test_a_slow_reading_found_as_the_climb_spends_its_last_restart_is_still_measured_again():
    """LEND: one restart of the final rung's may measure it again (a lost optimum costs more)."""
    cands = _space()
    truth = {s: 200.0 + 10 * s.num_steps + s.num_draft_tokens for s in cands}
    order = []
    climb.climb(cands, lambda s: order.append(s) or truth[s], Settings(3, 1, 4), budget=100)
    last = order[-1]
    read, seen = _reader(truth, {last})
    c = climb.climb(cands, read, Settings(3, 1, 4), budget=len(order))
    assert seen.count(last) == 2 and c.scores[last] == truth[last] and len(seen) == len(order) + climb.LEND
