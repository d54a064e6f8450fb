"""Issue 38, item 2: `deploy --bench` with no `gate` measured nothing and said nothing, while the
README's upgrade step says each host is "held to its gate".  A selection with no gate is refused
before connecting, naming the services and what to add; where only some have one, the others are
named, before the run and in the host's lines.  No fleet: the engine is stopped short of connecting."""
import json
from types import SimpleNamespace

import pytest
from invoke import Context, Exit

import tasks
from specops import cli, inventory
from specops.flows import gate
from roles import VOCABULARY

SPEC = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def write(tmp_path, **services):
    """An inventory: host → its services (name → extra keys), with a router host beside them."""
    hosts = {h: {"services": [{"name": n, "model_path": "/m", "speculative": SPEC, **extra}
                              for n, extra in svcs.items()]} for h, svcs in services.items()}
    hosts["front"] = {"services": [{"name": "router", "kind": "router", "workers": {"group": "ungrouped"}}]}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": hosts}}))
    return tmp_path / "hosts.yml"


def test_bench_with_no_gate_is_refused_before_connecting(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, ct129={"sglang": {}}, ct130={"sglang": {}})
    monkeypatch.setattr(cli, "run_hosts", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(Exit) as e:
        tasks.deploy.body(Context(), all=True, inventory=str(path), bench=True)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --bench holds each service to its gate, and no selected service has one "
        "(ct129: sglang, ct130: sglang): give the service one, e.g. gate: {min_speedup: 1.1}, "
        "or deploy without --bench"]


def test_bench_where_some_have_a_gate_names_those_not_held(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, ct129={"sglang": {"gate": {"min_speedup": 1.1}}, "small": {}}, ct130={"sglang": {}})
    ran = []
    monkeypatch.setattr(cli, "run_hosts", lambda hosts, *a, **k: ran.append([h.name for h in hosts]) or [])
    monkeypatch.setattr(cli, "recap", lambda *a, **k: 0)
    tasks.deploy.body(Context(), all=True, inventory=str(path), bench=True)
    assert ran == [["ct129", "ct130", "front"]]
    assert capsys.readouterr().err == ("--bench: not held to a gate (they have none; add one, e.g. gate: "
                                       "{min_speedup: 1.1}): ct129: small, ct130: sglang\n")
    # without --bench nothing is said of gates
    tasks.deploy.body(Context(), all=True, inventory=str(path))
    assert capsys.readouterr().err == ""


def test_the_host_says_which_of_its_services_no_gate_holds(tmp_path, monkeypatch):
    path = write(tmp_path, ct129={"sglang": {"gate": {"min_accept_length": 2.0}}, "small": {}})
    host = inventory.load(path, VOCABULARY).hosts["ct129"]
    said = []
    run = SimpleNamespace(host=host, say=said.append, report=SimpleNamespace(extra={}, notes=[]),
                          call=lambda req: SimpleNamespace(releases=[]), applied=False)
    measured = []
    monkeypatch.setattr(gate.specbench, "measured",
                        lambda run, svc, load, base, checks: (measured.append(svc["name"]) or [], None))
    monkeypatch.setattr(gate.specbench, "result", lambda run, svc, load, spec, base: {
        "verdict": "v", "spec": [{"concurrency": 1, "figures": {"output_tok_s": 10.0, "accept_length": 2.5}}]})
    assert len(gate.gated(run)) == 1 and measured == ["sglang"]
    assert "small: not held to a gate: it has none (add one, e.g. gate: {min_speedup: 1.1})" in said
    assert not [s for s in said if s.startswith("sglang: not held")]
