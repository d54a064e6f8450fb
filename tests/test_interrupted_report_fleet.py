"""Ctrl-C in the middle of `inv deploy --json PATH` still writes the report, with every host's
state as far as it is known: which finished, which was cut short and doing what, and nothing
secret (the engine's side without hosts: tests/test_interrupted_report.py)."""
import json

import pytest

from sandbox.provision import sandbox_service

pytestmark = pytest.mark.fleet
SECRET = 'tok"en\\é-77'  # also the served model name, so it is in the unit's diff: only redaction hides it


@pytest.mark.reliability("sigint", "fault")
def test_ctrl_c_mid_deploy_writes_the_json_report_naming_the_interrupted_host(sandbox):
    fast, slow = sandbox.reset("t4"), sandbox.reset("t5")
    quick = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"})
    hung = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "90"}, env_secret={"HF_TOKEN": SECRET},
                           served_model_name=SECRET, verify={"timeout": 180})
    inv = sandbox.inventory({"t4": {"services": [quick]}, "t5": {"services": [hung]}})
    path = sandbox.tmp / "cut.json"

    def t4_done_and_t5_waiting(lines):
        """t4 verified, and t5 has said twice since that it is still starting (5 s apart)."""
        done = [i for i, line in enumerate(lines) if line.startswith("t4") and "/generate" in line]
        return bool(done) and sum(1 for line in lines[done[0]:] if line.startswith("t5") and "starting (" in line) >= 2
    status, out = sandbox.interrupt("deploy", "--host", "t4,t5", "--json", str(path), inventory=inv,
                                    when=t4_done_and_t5_waiting)
    assert status == 130 and "interrupted" in out, out[-3000:]
    doc = json.loads(path.read_text())
    # In any form it takes on the way (JSON's escapes, the unit's quoting), the secret ends in "é-77".
    assert "é-77" not in json.dumps(doc, ensure_ascii=False) and "é-77" not in out
    assert doc["interrupted"] is True
    t4, t5 = doc["hosts"]["t4"], doc["hosts"]["t5"]
    assert t4["status"] == "changed" and "sglang verified" in t4["notes"] and "interrupted" not in t4
    assert t5["status"] == "interrupted" and t5["error"] is None
    cut = t5["interrupted"]
    assert cut["during"] == "Verify" and "sglang: starting (" in cut["last_line"], cut
    assert "/etc/systemd/system/sglang.service" in cut["applied"]  # written before verify began
    unit = [c["diff"] for c in t5["changes"] if "--served-model-name" in (c["diff"] or "")]
    assert unit and "***" in unit[0]  # the secret was there to hide: redacted, not left out
    assert "RECAP (interrupted)" in out and "interrupted during Verify" in out
    assert slow.run("test", "-d", "/run/specops.lock", check=False).returncode != 0  # lock given back
    assert fast.run("test", "-d", "/run/specops.lock", check=False).returncode != 0
