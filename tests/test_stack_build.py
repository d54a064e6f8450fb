"""A stack's build on the host (specops/agent/converge/stacks.py, its tools replaced, on a directory
of the test's): the disk it needs, a file not root's, a half stack under its name, uv's "no
version" from a cached page asked once again.  No fleet."""
import os
import re

import pytest

from specops import protocol
from specops.agent.host import ActionError
from specops.sglang import stack


def test_a_new_stack_is_root_s_alone(tmp_path):
    from specops.agent.converge import stacks as agent_stacks
    (tmp_path / "site").mkdir()
    lock = tmp_path / ".lock"
    lock.write_text("")
    os.chmod(lock, 0o666)  # as uv makes it
    assert agent_stacks.root_only(str(tmp_path)) is None
    assert oct(os.stat(lock).st_mode & 0o777) == "0o644"
    theirs = tmp_path / "site" / "theirs.py"
    theirs.write_text("")
    os.chown(theirs, 65534, 65534)
    assert agent_stacks.root_only(str(tmp_path)) == str(theirs)


def test_uv_s_no_version_from_a_cached_page_is_asked_once_again_with_refresh(agent_dirs, monkeypatch):
    """uv answers from the index page it cached until the page's max-age: a version published since
    reads as none.  The build says so and asks once more with --refresh-package; any other
    failure, or a second 'no version', stands."""
    from specops.agent.host import ActionError
    _, stacks, _, st = agent_dirs
    monkeypatch.setattr(stacks, "UV_CACHE", str(st.parent / "uv-cache"))
    monkeypatch.setattr(stacks, "uv_tool", lambda args: "/usr/bin/uv")
    monkeypatch.setattr(stacks, "expect_in", lambda *a: {"sglang": "0.5.26"})
    said, calls = [], []
    monkeypatch.setattr(stacks, "say", said.append)
    no_version = ("uv pip install failed (exit 1): error: No solution found when resolving dependencies | cause: "
                  "Because there is no version of sglang==0.5.26 and you require sglang==0.5.26, we can conclude "
                  "that your requirements are unsatisfiable.")

    def uv(argv, desc, env=None):
        calls.append(argv)
        if argv[1] == "venv":
            os.makedirs(os.path.join(argv[-1], "bin"))
        elif answers:
            raise ActionError(answers.pop(0))
    monkeypatch.setattr(stacks, "run_streamed", uv)
    build = protocol.BuildStack(path=str(st / ("a" * 16)), python="python3", specs=["sglang==0.5.26"], sources=[],
                                uv_pip_args=[], defines={}, need=0, check="", expect={})
    answers = [no_version]
    assert stacks.build(build)["built"]
    installs = [c for c in calls if c[1] == "pip"]
    assert [c[2:4] for c in installs] == [["install", "--python"], ["install", "--refresh-package"]], installs
    assert installs[1][4] == "sglang"
    assert any("asking the index again (--refresh-package sglang)" in s for s in said), said
    for failure in ([no_version, no_version], ["uv pip install failed (exit 1): error: 404 Not Found"]):
        answers, calls[:] = list(failure), []
        build.path = str(st / ("b" * 16))
        with pytest.raises(ActionError, match=re.escape(failure[-1][:60])):
            stacks.build(build)
        assert len([c for c in calls if c[1] == "pip"]) == len(failure)  # one retry, and only for 'no version'


def test_uv_s_no_version_names_the_project_also_with_extras_and_an_agent_error_stands():
    from specops.agent.converge import stacks, wheelfiles
    for said, name in (("there is no version of sglang==0.5.26 and", "sglang"),
                       ("there is no version of sglang[all]==0.5.26 and", "sglang"),
                       ("there is no version of flash-linear-attention==0.6.1 and", "flash-linear-attention")):
        assert re.search(stacks._NO_VERSION, said).group(1) == name
    assert re.search(stacks._NO_VERSION, "error: 404 Not Found") is None
    host = {"sglang": {"version": "0.5.23"}, "torch": {"version": "2.9.1"}}
    with pytest.raises(wheelfiles.SourceError, match="^http://ix/simple: unreachable$"):
        stack.wheel_files(host, ["sglang/x.py"], {"error": "http://ix/simple: unreachable"})


@pytest.fixture
def building(tmp_path, monkeypatch):
    """stacks.build with its tools replaced: `uv venv` makes a bin/python, `uv pip install` writes
    what `files` says into the venv; the directories are the test's."""
    from specops.agent.converge import stacks as agent_stacks
    st, cache = tmp_path / "opt" / "venvs", tmp_path / "uv-cache"
    monkeypatch.setattr(agent_stacks, "STACKS_DIR", str(st))
    monkeypatch.setattr(agent_stacks, "UV_CACHE", str(cache))
    monkeypatch.setattr(agent_stacks, "uv_tool", lambda args: "/uv")
    monkeypatch.setattr(agent_stacks, "expect_in", lambda python, code, expect, what: {"sglang": "0.5.23"})
    monkeypatch.setattr(agent_stacks, "_free", lambda path: 50 * 2**30)
    calls, files = [], {}

    def run(argv, desc, env=None):
        calls.append((argv, env))
        if argv[1] == "venv":
            os.makedirs(os.path.join(argv[-1], "bin"))
        else:
            venv = os.path.dirname(os.path.dirname(argv[argv.index("--python") + 1]))
            for rel, (mode, uid) in files.items():
                path = os.path.join(venv, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write("x")
                os.chmod(path, mode)
                os.chown(path, uid, uid)
    monkeypatch.setattr(agent_stacks, "run_streamed", run)
    req = protocol.BuildStack(path=str(st / ("a" * 16)), python="3.11", specs=["sglang==0.5.23"],
                              sources=["--default-index", "http://u:pw@ix/simple"], uv_pip_args=[],
                              defines={"sglang": "0.5.23"}, need=12 * 2**30, check="", expect={})
    return agent_stacks, st, req, calls, files


def test_a_build_is_refused_before_anything_moves_when_the_disk_is_short(building, monkeypatch):
    agent_stacks, st, req, calls, _ = building
    monkeypatch.setattr(agent_stacks, "_free", lambda path: req.need - 1)
    with pytest.raises(ActionError, match="needs 12.0 GiB free"):
        agent_stacks.build(req)
    assert calls == [] and os.listdir(st) == []
    monkeypatch.setattr(agent_stacks, "_free", lambda path: req.need)  # exactly enough is enough
    assert agent_stacks.build(req)["built"]


def test_a_stack_with_a_file_not_root_s_is_never_used_and_its_build_is_gone(building):
    agent_stacks, st, req, _, files = building
    files["lib/site-packages/sglang/x.py"] = (0o644, 65534)
    with pytest.raises(ActionError, match="has lib/site-packages/sglang/x.py, which a user other than root could "
                                          "change; not used"):
        agent_stacks.build(req)
    assert os.listdir(st) == []  # neither the stack nor its build directory


def test_a_half_stack_under_the_name_is_built_again_in_a_clean_environment(building, monkeypatch):
    agent_stacks, st, req, calls, files = building
    half = st / ("a" * 16)
    half.mkdir(parents=True)
    (half / "left-by-a-cut-build").write_text("")  # no specops-stack.json: not a stack
    files["lib/site-packages/sglang/__init__.py"] = (0o664, 0)  # group-writable, as a umask could leave it
    monkeypatch.setenv("UV_INDEX_URL", "http://roots-own/simple")
    monkeypatch.setenv("PIP_INDEX_URL", "http://roots-own/simple")
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere")
    assert agent_stacks.build(req)["built"]
    assert sorted(os.listdir(half)) == ["bin", "lib", "specops-stack.json"]
    assert oct(os.stat(half / "lib/site-packages/sglang/__init__.py").st_mode & 0o777) == "0o644"
    for argv, env in calls:
        assert "roots-own" not in str(env) and "VIRTUAL_ENV" not in env
        assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["UV_DEFAULT_INDEX"] == "http://u:pw@ix/simple"
        assert "pw" not in " ".join(argv)
