"""inv spec-tune on sandbox hosts, issue 37: a slow reading planted on the optimum (the simulator's
slow.json: the first start of those settings runs at 0.4 of its speed) is measured again and the
optimum still wins; two drafts on one host, one better only at high draft-token counts, are
compared in one window and the right one applied with its settings under the gate; the user's
prompt files, JSONL of prompts and of chat messages, sent as such, a malformed line refused with
its number before any restart.  The tuner is judged by the simulator's formula in closed form
(sim_perf.steady_tok_s with each draft's acceptance), never by its own figures."""
import hashlib
import json

import pytest
import yaml

from sandbox.oracle import sim_perf
from specops.sglang.drafts import LAYER_IDS
from support.spec_tune import SPEC, look_at_the_report, tune, write_inventory

pytestmark = pytest.mark.fleet

SPACE = {"num_steps": [1, 3, 5], "eagle_topk": [1, 4], "num_draft_tokens": [4, 16]}
# with 8 between: from 4 draft tokens a tree of 16 is two values away, so a climb on the wide
# draft (worse than the own one at 4) reaches it only through 8
DRAFTS_SPACE = {**SPACE, "num_draft_tokens": [4, 8, 16]}
KNOBS = {"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_TOK_S": "200", "SGLANG_SIM_DRAFT_COST": "0.15",
         "SGLANG_SIM_ACCEPT_RATE": "0.8"}
SLOW = "/run/sglang-sim/slow.json"  # the simulator's planted slow start (sim_noise.py)
OPTIMUM = (5, 4, 16)  # 549 tok/s in closed form; the next best, (3, 4, 16), 472
OWN = "/models/tiny-llama-eagle3"
OTHER = "/models/tiny-llama-eagle3-wide"
# the service's own draft: acceptance 0.75, little gain from a tree; the other: 0.6, a wide tree pays
DRAFT_KNOBS = {**KNOBS, "SGLANG_SIM_ACCEPT_RATE": "0.75", "SGLANG_SIM_TREE_GAIN": "0.1"}
WIDE = {"sim_accept_rate": 0.6, "sim_tree_gain": 1.5}


def candidates(space=SPACE):
    from specops.sglang import tuning
    svc = {"name": "s", "speculative": {"algorithm": "EAGLE3", "draft_model_path": OWN, "num_steps": 3,
                                        "eagle_topk": 1, "num_draft_tokens": 4}}
    return [(s.num_steps, s.eagle_topk, s.num_draft_tokens)
            for s in tuning.prune(svc, tuning.asked_space(svc, space)).candidates]


def settings(spec):
    return spec["num_steps"], spec["eagle_topk"], spec["num_draft_tokens"]


def test_a_slow_reading_planted_on_the_optimum_is_measured_again_and_the_optimum_wins(sandbox):
    h = sandbox.reset("t4")
    inv = write_inventory(sandbox, "t4", KNOBS, SPACE)
    res = sandbox.inv("deploy", "--host", "t4", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    oracle = lambda s: sim_perf.steady_tok_s(KNOBS, 1, s)  # noqa: E731
    assert max(candidates(), key=oracle) == OPTIMUM
    # /run is the booted host's own tmpfs: written and read from inside it
    h.run("sh", "-c", f"mkdir -p /run/sglang-sim && cat > {SLOW}",
          input=json.dumps([{"settings": list(OPTIMUM), "factor": 0.4, "starts": 1}]))
    prompts = sandbox.tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Write about {w}.", "source": "logs"}) + "\n"
                               for w in ("rivers", "trains", "bees", "salt", "glass")) + "\n")
    res, rep = tune(sandbox, "t4", inv, "--prompts", str(prompts), "--seed", "3")
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]
    rec = json.loads(h.path(SPEC).read_text())["sglang"]
    assert json.loads(h.run("cat", SLOW).stdout)[0]["starts"] == 0, res.stdout[-5000:]  # the slow start happened
    assert settings(rec["winner"]) == OPTIMUM, (rec["verdict"], res.stdout[-6000:])  # first: what a user sees
    first = [c for c in rec["candidates"] if settings(c["settings"]) == OPTIMUM and c["rung"] == "short"]
    assert len(first) == 2 and not first[0]["again"] and first[1]["again"], first
    assert first[0]["score"] < 0.6 * first[1]["score"], [c["score"] for c in first]  # 0.4 of its speed, then not
    assert "(measured again: its first reading was far below its neighbours')" in res.stdout
    assert rec["restarts"] <= 12 and rec["budget"] == 12, (rec["restarts"], rec["budget"])
    # the prompt set is named with its digest; the noise check ran
    assert rec["load"]["prompts"] == str(prompts) and rec["load"]["prompts_count"] == 5
    assert rec["load"]["prompts_sha256"] == hashlib.sha256(prompts.read_bytes()).hexdigest()
    assert rec["baseline_again"] and rec["noise"]["baseline_moved"] is not None


def test_two_drafts_the_one_better_only_with_many_draft_tokens_wins_and_is_applied_with_its_settings(sandbox):
    h = sandbox.reset("t5")
    h.run("cp", "-a", OWN, OTHER)
    config = json.loads(h.path(f"{OTHER}/config.json").read_text())
    h.path(f"{OTHER}/config.json").write_text(json.dumps({**config, **WIDE}))
    inv = write_inventory(sandbox, "t5", DRAFT_KNOBS, {**DRAFTS_SPACE, "drafts": [OTHER]})
    res = sandbox.inv("deploy", "--host", "t5", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    own = lambda s: sim_perf.steady_tok_s(DRAFT_KNOBS, 1, s)  # noqa: E731
    wide = lambda s: sim_perf.steady_tok_s(sim_perf.with_draft(DRAFT_KNOBS, WIDE), 1, s)  # noqa: E731
    assert own((3, 1, 4)) > wide((3, 1, 4)) and wide(OPTIMUM) > 1.3 * max(map(own, candidates(DRAFTS_SPACE)))
    assert max(candidates(DRAFTS_SPACE), key=wide) == OPTIMUM
    # a malformed prompt line is refused with its number, before any connection or restart
    chat = sandbox.tmp / "chat.jsonl"
    lines = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Name a {w}."}]}
             for w in ("river", "tree", "city", "song")]
    chat.write_text("\n".join(map(json.dumps, lines[:2])) + '\n{"messages": [{"role": "user"}]}\n')
    since = h.run("systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "sglang").stdout
    res, _ = tune(sandbox, "t5", inv, "--prompts", str(chat))
    assert res.returncode != 0 and f"prompts {chat} line 3:" in res.stdout + res.stderr, res.stdout + res.stderr
    assert "starting the baseline" not in res.stdout
    assert h.run("systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "sglang").stdout == since
    # a draft made for another target is refused before any restart, as deploy refuses its own
    bad = f"{OTHER}-58"
    h.run("cp", "-a", OWN, bad)
    h.path(f"{bad}/config.json").write_text(json.dumps({**config, "eagle_config": {LAYER_IDS: [2, 58]}}))
    write_inventory(sandbox, "t5", DRAFT_KNOBS, {**DRAFTS_SPACE, "drafts": [OTHER, bad]})
    res, _ = tune(sandbox, "t5", inv)
    assert res.returncode != 0 and "ids [58] are never captured" in res.stdout + res.stderr, res.stdout[-3000:]
    assert (f"the draft {bad} (its config.json: {bad}/config.json) was made for another target"
            in res.stdout + res.stderr)
    assert "starting the baseline" not in res.stdout
    assert h.run("systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "sglang").stdout == since
    write_inventory(sandbox, "t5", DRAFT_KNOBS, {**DRAFTS_SPACE, "drafts": [OTHER]})
    chat.write_text("\n".join(map(json.dumps, lines)) + "\n")
    res, rep = tune(sandbox, "t5", inv, "--prompts", str(chat), "--apply", "--force")
    assert res.returncode == 0, res.stdout[-6000:]
    stamps = sorted(p.name for p in h.path("/var/lib/specops/releases").iterdir() if p.name[0].isdigit())
    assert len(stamps) == 2, res.stdout[-6000:]  # the deploy, then the winner's, applied
    rec = json.loads(h.path(f"/var/lib/specops/releases/{stamps[-2]}/tune.json").read_text())["sglang"]
    assert rec["winner_draft"] == OTHER and wide(settings(rec["winner"])) >= 0.97 * wide(OPTIMUM), rec["verdict"]
    by = {d["draft"]: d for d in rec["drafts"]}
    assert set(by) == {OWN, OTHER} and by[OWN]["best"] and by[OTHER]["speedup"] > by[OWN]["speedup"]
    assert "16" in by[OTHER]["by_draft_tokens"] and by[OTHER]["by_draft_tokens"]["16"]["accept_length"]
    # the chat prompts went through the chat endpoint: SGLang's counters gave the accept length
    assert all(c["levels"][0]["figures"].get("accept_length") for c in rec["candidates"] if c["score"])
    # applied: both keys written, the unit runs the other draft with the winner's settings, gated
    svc = yaml.safe_load((inv / "host_vars" / "t5.yml").read_text())["services"][0]["speculative"]
    assert svc["draft_model_path"] == OTHER and settings(svc) == settings(rec["winner"])
    assert "sglang: gate passed" in res.stdout
    info = json.loads(h.run("curl", "-s", "http://127.0.0.1:30000/server_info").stdout)
    assert info["speculative_draft_model_path"] == OTHER
    look_at_the_report(sandbox, inv, "t5", rec, drafts=2)
