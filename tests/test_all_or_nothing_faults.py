"""All or nothing (issue 45): the fault hook the fleet tests fail a deploy with
(specops/agent/faults.py): a fault fires once at the nth action of its kind, a fault file anyone
else could write is ignored, and a kill fault kills the agent there.  No fleet."""
import json
import os
import subprocess
import sys

import pytest

from specops.agent import faults
from specops.agent.converge import stage


def write_fault(path, doc, mode=0o600):
    with open(path, "w") as f:
        json.dump(doc, f)
    os.chmod(path, mode)


def test_a_fault_fires_at_the_nth_action_of_its_kind_once(tmp_path, monkeypatch):
    path = str(tmp_path / "faults.json")
    monkeypatch.setattr(faults, "FAULTS", path)
    monkeypatch.setattr(faults, "_seen", {})
    write_fault(path, {"kind": "write", "nth": 2})
    faults.at("write")
    faults.at("restart")
    with pytest.raises(stage.ActionError, match="write failed: a fault injected on request"):
        faults.at("write")
    assert not os.path.exists(path)  # consumed
    faults.at("write")


@pytest.mark.skipif(os.geteuid() != 0, reason="the guard is on root's ownership")
def test_a_fault_file_anyone_else_could_write_is_ignored(tmp_path, monkeypatch):
    path = str(tmp_path / "faults.json")
    monkeypatch.setattr(faults, "FAULTS", path)
    for mode, owner in ((0o620, 0), (0o602, 0), (0o600, 1000)):
        monkeypatch.setattr(faults, "_seen", {})
        write_fault(path, {"kind": "write"}, mode)
        os.chown(path, owner, 0)
        faults.at("write")  # not fired
        assert os.path.exists(path)
        os.unlink(path)
    os.symlink(str(tmp_path / "elsewhere"), path)
    write_fault(str(tmp_path / "elsewhere"), {"kind": "write"})
    faults.at("write")  # a link is never followed
    assert os.path.exists(str(tmp_path / "elsewhere"))


@pytest.mark.parametrize("how, calls, printed", [
    ("kill", "faults.at('restart'); print('before', flush=True); faults.at('write')", "before\n"),
    ("kill-after", "faults.at('write'); print('did', flush=True); faults.after('write')", "did\n"),  # once done
])
def test_a_kill_fault_kills_the_agent_there(tmp_path, how, calls, printed):
    path = tmp_path / "faults.json"
    write_fault(path, {"kind": "write", "how": how})
    code = f"from specops.agent import faults; faults.FAULTS = {str(path)!r}; {calls}; print('after')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert res.returncode == -9 and res.stdout == printed
