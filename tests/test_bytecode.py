"""The validating compile of a patched module hands its bytecode to the agent on stdout: it
writes nothing itself (it runs as root, on a path), and what it compiled is kept only if it is
what was staged.  No fleet: the agent's stage code on a local directory."""
import base64
import hashlib
import os
import sys

import pytest

from roles.model_patches import COMPILE
from specops import protocol
from specops.agent.converge import bytecode, stage
from specops.agent.host import ActionError
from specops.layout import CHECKED_HASH, PYCACHE, STATE_FILE

SOURCE = b"VALUE = 1\n"


def staged(tmp_path, validate):
    write = protocol.Write(path=str(tmp_path / "mod.py"), data=base64.b64encode(SOURCE).decode(),
                           owner=None, group=None, validate=validate, validator="compile")
    return stage.Staged(write).write()


def test_the_compile_prints_checked_bytecode_and_writes_nothing(tmp_path):
    tmp_path.chmod(0o755)
    s = staged(tmp_path, [sys.executable, "-I", "-S", "-c", COMPILE, "{}..."])
    digest, [(name, pyc)] = s.bytecode
    assert digest == hashlib.sha256(SOURCE).hexdigest()
    assert name == f"mod.{sys.implementation.cache_tag}.pyc" and pyc[4:8] == CHECKED_HASH
    assert not [d for d, _, _ in os.walk(tmp_path) if d.endswith(PYCACHE)]  # nothing written by the validator
    s.discard()
    assert os.listdir(tmp_path) == []


def test_a_validator_that_read_other_content_is_refused(tmp_path):
    """As if the staged path had been swapped under the validator: it compiled something else."""
    tmp_path.chmod(0o755)
    swap = "import sys\nopen(sys.argv[1], 'w').write('OTHER = 2\\n')\n"
    with pytest.raises(ActionError, match="read other content than was staged"):
        staged(tmp_path, [sys.executable, "-I", "-S", "-c", swap + COMPILE, "{}..."])
    assert os.listdir(tmp_path) == []  # its stage is gone


def test_only_checked_bytecode_of_the_module_is_usable():
    good = b"\0" * 4 + CHECKED_HASH + b"\0" * 16
    assert bytecode.usable("mod.cpython-311.pyc", "mod", good)
    assert not bytecode.usable("mod.cpython-311.pyc", "mod", good[:4] + b"\0" * 4 + good[8:])  # timestamp-based
    assert not bytecode.usable("other.cpython-311.pyc", "mod", good)
    assert not bytecode.usable("mod.x/../../elsewhere.pyc", "mod", good)
    assert bytecode.compiled("noise\nspecops-pyc [1, 2\n") == {}


def test_the_compile_opens_only_the_staged_file_and_prints_none_of_another(tmp_path):
    """Shown a link where its file was, the compile refuses it; shown another file that compiles
    with a warning, in a batch that fails, the refusal carries no line of that file."""
    tmp_path.chmod(0o755)
    secret = tmp_path.parent / f"{tmp_path.name}-secret.env"
    secret.write_text('KEY="hunter2" is 1\n')  # parses as Python, with a warning
    secret.chmod(0o600)
    link = f"import os, sys\nos.unlink(sys.argv[1]); os.symlink({str(secret)!r}, sys.argv[1])\n"
    with pytest.raises(ActionError, match="Too many levels of symbolic links") as refused:
        staged(tmp_path, [sys.executable, "-I", "-S", "-c", link + COMPILE, "{}..."])
    assert "hunter2" not in str(refused.value)
    swap = f"import shutil, sys\nshutil.copyfile({str(secret)!r}, sys.argv[1])\n"
    later = "sys.exit('the next file of the batch: SyntaxError')\n"  # so the validator's stderr is shown
    with pytest.raises(ActionError, match="the next file of the batch") as refused:
        staged(tmp_path, [sys.executable, "-I", "-S", "-c", swap + COMPILE + later, "{}..."])
    assert "hunter2" not in str(refused.value)
    assert os.listdir(tmp_path) == []


def venv_fact(magic=None):
    from importlib.util import MAGIC_NUMBER
    return {"tag": sys.implementation.cache_tag, "magic": magic or MAGIC_NUMBER.hex()}


def test_bytecode_the_controller_compiled_is_what_the_purge_installs(tmp_path):
    """The same interpreter's bytecode: compiled once on the controller, no validator on the host."""
    from specops.ops.code import precompiled
    made = precompiled(SOURCE, venv_fact(), "mod", "sglang/mod.py")
    write = protocol.Write(path=str(tmp_path / "mod.py"), data=base64.b64encode(SOURCE).decode(),
                           owner=None, group=None, bytecode=made)
    s = stage.Staged(write).write()
    digest, [(name, pyc)] = s.bytecode
    assert digest == hashlib.sha256(SOURCE).hexdigest() and name == f"mod.{sys.implementation.cache_tag}.pyc"
    assert pyc[4:8] == CHECKED_HASH
    space = {}
    exec(__import__("marshal").loads(pyc[16:]), space)
    assert space["VALUE"] == 1
    s.discard()


def test_another_interpreters_bytecode_is_left_to_the_host():
    """PyPy's, another CPython's, or a venv fact kept before the magic was asked: the host compiles."""
    from specops.ops.code import precompiled
    assert precompiled(SOURCE, venv_fact(magic="00000000"), "mod", "m.py") is None
    assert precompiled(SOURCE, {"tag": "cpython-311"}, "mod", "m.py") is None


def test_a_patched_file_that_does_not_compile_is_refused_before_anything_moves():
    from specops.ops import PlanError
    from specops.ops.code import precompiled
    with pytest.raises(PlanError, match=r"refused sglang/srt/models/llama.py: SyntaxError: .* \(line 2\)"):
        precompiled(b"A = 1\ndef oops(:\n", venv_fact(), "llama", "sglang/srt/models/llama.py")


def test_the_controllers_bytecode_keeps_asserts_whatever_its_own_optimize_level(tmp_path):
    """The host's validator compiles at level 0 (-I): so does the controller, even under -O."""
    code = ("import marshal, sys; from specops.ops.code import precompiled; import base64\n"
            "from importlib.util import MAGIC_NUMBER\n"
            "made = precompiled(b'assert False, \"kept\"\\n', {'tag': sys.implementation.cache_tag, "
            "'magic': MAGIC_NUMBER.hex()}, 'm', 'm.py')\n"
            "exec(marshal.loads(base64.b64decode(made[1])[16:]))\n")
    res = __import__("subprocess").run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                                       env={**os.environ, "SPECOPS_NO_MEMO": "1"},
                                       cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert "AssertionError: kept" in res.stderr, res.stderr


def test_controller_bytecode_under_a_name_that_is_not_the_modules_is_not_installed(tmp_path):
    from specops.ops.code import precompiled
    made = precompiled(SOURCE, venv_fact(), "mod", "sglang/mod.py")
    for name in ("other.cpython-311.pyc", "../mod.cpython-311.pyc"):
        write = protocol.Write(path=str(tmp_path / "mod.py"), data=base64.b64encode(SOURCE).decode(),
                               owner=None, group=None, bytecode=[name, made[1]])
        s = stage.Staged(write).write()
        assert s.bytecode is None
        s.discard()


def test_the_host_state_is_parsed_once_for_a_probes_facts(monkeypatch):
    """A no-op plans PurgeBytecode for each patched file and RunningCode, each reading
    state.json from the same probe's facts: one parse (it was three), none kept past those facts,
    and a changed file's fact parsed again."""
    import json
    from types import SimpleNamespace
    from specops.ops import Context, Facts, PurgeBytecode, RunningCode, code
    parses = []
    monkeypatch.setattr(code, "json", SimpleNamespace(loads=lambda raw: parses.append(raw) or json.loads(raw)))
    path = "/opt/v/sglang/srt/models/llama.py"
    state = {"purges": {path: {"sha256": "ab" * 32, "purged_at": 2000.0}}}

    def facts(state):
        return Facts({"units": {"sglang": {"ActiveState": "active", "ExecMainStartTimestamp": 3000.0}},
                      "files": {STATE_FILE: {"exists": True, "content_b64": base64.b64encode(
                          json.dumps(state).encode()).decode()},
                          **{k: {"exists": True, "path": path, "sha256": "ab" * 32, "mtime": 1000.0,
                                 "pycache": [{"name": "llama.pyc", "mtime": 2500.0}]} for k in ("a", "b")}}})
    f, ctx = facts(state), Context("box", False)
    summaries = [PurgeBytecode("a").plan(f, ctx).summary, PurgeBytecode("b").plan(f, ctx).summary,
                 RunningCode("sglang", ["a"]).plan(f, ctx).summary]
    assert summaries == ["ok", "ok", "ok"] and len(parses) == 1
    assert PurgeBytecode("a").plan(facts(state), ctx).summary == "ok" and len(parses) == 2  # other facts: parsed
    f.assume_file(STATE_FILE, content_b64=base64.b64encode(b"{}").decode())
    assert PurgeBytecode("a").plan(f, ctx).summary.startswith("purge (no purge on record") and len(parses) == 3
