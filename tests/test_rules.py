"""SGLang's spec-decode rules (DESIGN §5): each rule with a valid and an invalid case."""
import pytest

from specops.errors import UsageError
from specops.sglang.rules import check_service, resolve, tree_nodes
from support.reliability import record_inputs


DRAFT = "/models/draft"


def spec(algorithm="EAGLE3", **kw):
    return {"algorithm": algorithm, "draft_model_path": DRAFT, **kw}


def effective(res):
    e = res.effective
    return e.get("speculative_num_steps"), e.get("speculative_eagle_topk"), e.get("speculative_num_draft_tokens")


@pytest.mark.parametrize("algorithm,arch,auto", [
    ("EAGLE3", "LlamaForCausalLM", (5, 4, 8)),
    ("EAGLE", "Grok1ForCausalLM", (5, 4, 8)),
    ("EAGLE3", "Qwen2ForCausalLM", (3, 1, 4)),
    ("STANDALONE", "LlamaForCausalLM", (3, 1, 4)),  # STANDALONE ignores the architecture
    ("EAGLE3", None, (None, None, None)),            # unknown until the host's config.json is read
])
def test_auto_params_valid(algorithm, arch, auto):
    res = resolve(spec(algorithm), arch=arch)
    assert not res.findings and effective(res) == auto


@pytest.mark.parametrize("given", [{"eagle_topk": 1}, {"num_draft_tokens": 4}])
def test_auto_params_invalid_partial(given):
    res = resolve(spec(**given))
    assert [f.rule for f in res.errors] == ["auto-params"]


def test_topk_needed():
    assert [f.rule for f in resolve(spec(num_steps=3)).errors] == ["topk-needed"]
    assert not resolve(spec(num_steps=3, eagle_topk=4)).findings


def test_seed_case_is_an_adjustment_to_two_draft_tokens():
    res = resolve(spec(num_steps=1, eagle_topk=1, num_draft_tokens=16))
    (adj,) = res.adjustments
    assert (adj.rule, adj.field, adj.asked, adj.effective) == ("topk1-draft", "speculative_num_draft_tokens", 16, 2)
    msg = adj.message()
    assert msg == ("you asked for num_draft_tokens: 16, SGLang would run with 2 (SGLang rule [topk1-draft]: "
                   "with eagle_topk 1, SGLang runs num_steps + 1 draft tokens)")


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("draft", [1, 2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("backend", [{}, {"page_size": 16, "attention_backend": "flashmla"},
                                     {"attention_backend": "trtllm_mha"}])
def test_topk1_draft_fixes_run_as_written(steps, draft, backend):
    """Each fix offered, written into the inventory, is what SGLang runs: no adjustment, no refusal,
    and a tree wide enough to fill its draft tokens."""
    asked = spec(num_steps=steps, eagle_topk=1, num_draft_tokens=draft)
    findings = resolve(asked, **backend).findings
    if draft == steps + 1:
        assert not findings
        return
    (adj,) = findings
    assert adj.fixes[0] == f"set num_draft_tokens: {steps + 1}"
    for fix in adj.fixes:
        key, value = fix.removeprefix("set ").split(" for ")[0].split(": ")
        fixed = resolve({**asked, key: int(value)}, **backend)
        assert not fixed.findings, fix
        runs = fixed.effective
        assert runs["speculative_num_draft_tokens"] - 1 <= tree_nodes(runs["speculative_num_steps"],
                                                                      runs["speculative_eagle_topk"])
    assert any("eagle_topk" in f for f in adj.fixes) == (draft >= 2 and not backend)


def test_trtllm_mha_runs_no_tree():
    assert [f.rule for f in resolve(spec(num_steps=3, eagle_topk=4), attention_backend="trtllm_mha").errors] \
        == ["topk1-backend"]
    assert not resolve(spec(num_steps=3, eagle_topk=1), attention_backend="trtllm_mha").findings


def test_topk1_draft_valid_and_filled():
    assert not resolve(spec(num_steps=15, eagle_topk=1, num_draft_tokens=16)).findings
    filled = resolve(spec(num_steps=15, eagle_topk=1))  # unset: SGLang fills it, no override
    assert not filled.findings and effective(filled) == (15, 1, 16)


def test_page_tree_backends():
    bad = resolve(spec(num_steps=3, eagle_topk=4, num_draft_tokens=8), page_size=16, attention_backend="flashmla")
    assert [f.rule for f in bad.errors] == ["page-tree"]
    ok = resolve(spec(num_steps=3, eagle_topk=4, num_draft_tokens=8), page_size=16, attention_backend="fa3")
    assert not ok.findings


def test_ngram_topk_is_overwritten_by_bfs_breadth():
    bad = resolve({"algorithm": "NGRAM", "eagle_topk": 4})
    assert [(f.rule, f.asked, f.effective) for f in bad.adjustments] == [("ngram-topk", 4, 10)]
    assert bad.adjustments[0].fixes == ["leave out eagle_topk", "set ngram_max_bfs_breadth: 4"]
    assert not resolve({"algorithm": "NGRAM"}).findings
    assert not resolve({"algorithm": "NGRAM", "eagle_topk": 4, "ngram_max_bfs_breadth": 4}).findings
    ok = resolve({"algorithm": "NGRAM", "eagle_topk": 8, "ngram_max_bfs_breadth": 8, "num_draft_tokens": 16})
    assert not ok.findings and effective(ok) == (2, 8, 16)  # steps = draft // topk
    default = resolve({"algorithm": "NGRAM"})
    assert effective(default) == (1, 10, 12)


def test_dflash_rules():
    assert [f.rule for f in resolve({"algorithm": "DFLASH"}).errors] == ["dflash-draft"]
    bad = resolve(spec("DFLASH", num_steps=3, eagle_topk=2))
    assert sorted(f.rule for f in bad.adjustments) == ["dflash-steps", "dflash-topk"]
    assert [f.fixes for f in bad.adjustments] == [["set num_steps: 1", "leave it out"],
                                                  ["set eagle_topk: 1", "leave it out"]]
    assert [f.rule for f in resolve(spec("DFLASH", dflash_block_size=8, num_draft_tokens=16)).errors] == [
        "dflash-block"]
    ok = resolve(spec("DFLASH", num_steps=1, eagle_topk=1, dflash_block_size=16))
    assert not ok.findings and effective(ok) == (1, 1, 16)


def test_positive_values():
    assert [f.rule for f in resolve(spec(num_steps=0, eagle_topk=1)).errors] == ["positive"]


def test_nextn_is_eagle_and_max_running_requests():
    res = resolve(spec("NEXTN", num_steps=3, eagle_topk=1, num_draft_tokens=4))
    assert res.effective["speculative_algorithm"] == "EAGLE"
    assert res.effective["max_running_requests"] == 48
    assert "max_running_requests" not in resolve(spec(num_steps=3, eagle_topk=1), max_running_requests=8).effective


SEED_CASE = "EAGLE3 with num_steps 1, eagle_topk 1, num_draft_tokens 16"  # the bad input both spec-flags tests try


def service(**kw):
    return {"name": "sglang", "model_path": "/m",
            "speculative": spec(num_steps=1, eagle_topk=1, num_draft_tokens=16), **kw}


@pytest.mark.reliability("spec-flags", "bad-input")
def test_check_service_refuses_seed_case_in_one_line(record_property):
    record_inputs(record_property, SEED_CASE)
    with pytest.raises(UsageError) as e:
        check_service(service(), "ct129: service 'sglang'")
    msg = str(e.value)
    assert "\n" not in msg
    # the inventory's keys, the fixes first, the override last
    assert msg == ("ct129: service 'sglang': you asked for num_draft_tokens: 16, SGLang would run with 2 "
                   "(SGLang rule [topk1-draft]: with eagle_topk 1, SGLang runs num_steps + 1 draft tokens). "
                   "Set num_draft_tokens: 2; or set num_steps: 15 for a chain of 16; or set eagle_topk: 15 "
                   "for a tree of 16; or set allow_sglang_adjustments: true to run with 2 anyway")


def test_the_readme_quotes_the_refusal_as_it_is():
    from pathlib import Path
    with pytest.raises(UsageError) as e:
        check_service(service(), "ct129: service 'sglang'")
    assert str(e.value) in (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines()


def test_check_service_opt_in_records_effective_values():
    res = check_service(service(allow_sglang_adjustments=True), "x")
    assert {f.field: f.effective for f in res.adjustments} == {"speculative_num_draft_tokens": 2}
    with pytest.raises(UsageError, match=r"\[auto-params\]"):  # errors are never opt-in
        check_service(service(allow_sglang_adjustments=True, speculative=spec(eagle_topk=1)), "x")


@pytest.mark.reliability("spec-flags", "bad-input")
def test_cli_refuses_seed_case_without_connecting(tmp_path, record_property):
    record_inputs(record_property, SEED_CASE)  # the same input as above, through the CLI: counted once
    from support.inventories import run_without_connecting
    res, attempts = run_without_connecting(tmp_path, """
        all:
          hosts:
            ct129:
              address: 127.0.0.1
              ssh_port: {port}
              services:
                - name: sglang
                  model_path: /models/Kimi-K2.5
                  speculative: {{algorithm: EAGLE3, draft_model_path: /d, num_steps: 1, eagle_topk: 1,
                                 num_draft_tokens: 16}}
        """, "deploy", "--host", "ct129")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "[topk1-draft]" in res.stderr
    assert "SGLang would run with 2" in res.stderr and "Set num_draft_tokens: 2;" in res.stderr
    assert attempts == 0


def test_verify_and_the_preflight_say_a_field_by_its_inventory_key_first():
    """Issue 38: "num_draft_tokens (speculative_num_draft_tokens): intended 16, effective 2"."""
    from types import SimpleNamespace
    from specops.agent.converge import checks
    from specops.agent.services import service_http
    from specops.sglang.spec import said_as
    words = said_as()
    assert words["speculative_num_draft_tokens"] == "num_draft_tokens" and words["tp_size"] == "tp"
    assert "model_path" not in words  # the same word in both
    with pytest.raises(Exception, match=r"num_draft_tokens \(speculative_num_draft_tokens\): intended 16, effective 2"):
        checks.compare({"speculative_num_draft_tokens": 2}, {"speculative_num_draft_tokens": 16}, "x", words)
    report = SimpleNamespace(notes=[], failures=[])
    svc = SimpleNamespace(intended={"tp_size": 2, "model_path": "/m"}, accepted={}, said_as=words)
    service_http._compare(svc, {"tp_size": 1, "model_path": "/n"}, report)
    assert report.failures == ["model_path: intended /m, effective /n", "tp (tp_size): intended 2, effective 1"]
