"""The recap counts what a run changed: a batch the host refused (its preflight failed, before
anything was changed) leaves its planned changes out of changed= and ok=."""
import io
import json
import types

from specops import protocol
from specops.inventory import Host
from specops.ops import Context, Facts, Op
from specops.output.report import Redactor, Reporter, recap
from specops.run import HostRun, Options, _one

PREFLIGHT = protocol.Preflight(python="/venv/bin/python", script="", argv=["--enable-torch-compil"],
                               expect={}, service="sglang")


class UnitFile(Op):
    """A unit that changes, with the preflight that checks it first (as roles/sglang_service.py)."""

    def plan(self, facts, ctx):
        return self._change("/etc/systemd/system/sglang.service", "ExecStart changed",
                            actions=[protocol.Mkdir(path="/etc/x")], checks=[PREFLIGHT])


class Same(Op):
    def plan(self, facts, ctx):
        return self._change("/etc/specops/sglang.env", "ok")


def converge_against(answer, tmp_path):
    host = Host("a", {})
    out = Reporter(Redactor([host]), show_diff=False, stream=io.StringIO())
    role = types.SimpleNamespace(NAME="sglang_service", ops=lambda h: [Same(), UnitFile()], REPROBE=False)
    run = HostRun(host, [role], Options(), out)
    run.call = lambda request, **kw: answer(request)
    report = _one(run, lambda run: run.converge(Context("a", False, release_dir="/r/1"), Facts({})))
    path = tmp_path / "r.json"
    recap([report], out, str(path))
    return out.stream.getvalue(), json.loads(path.read_text())["hosts"]["a"]


def test_a_batch_refused_by_its_preflight_counts_no_change(tmp_path):
    refused = protocol.ApplyResult(ok=False, failed=0, phase=protocol.CHECK,
                                   error="host preflight: the installed SGLang refuses these arguments: "
                                         "argparse error: unrecognized arguments: --enable-torch-compil")
    printed, doc = converge_against(lambda request: refused, tmp_path)
    assert "ok=1   changed=0   failed=1" in printed
    assert ("unrecognized arguments: --enable-torch-compil (action 1 of 2, while checking; 0 changes made before it)"
            in printed)
    unit = next(c for c in doc["changes"] if c["target"].endswith("sglang.service"))
    assert (unit["changed"], unit["applied"]) == (False, False)


def test_a_batch_that_ran_counts_its_change(tmp_path):
    printed, doc = converge_against(lambda request: protocol.ApplyResult(
        ok=True, results=[{"index": i, "out": None} for i in range(len(request.actions))]), tmp_path)
    assert "ok=1   changed=1   failed=0" in printed and "applied" not in json.dumps(doc["changes"])
