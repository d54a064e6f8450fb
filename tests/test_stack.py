"""Stacks without a fleet: what names a stack, the build a missing one plans, the disk it asks
for, how pip and uv are given their indexes, a version's files read from its wheel before its stack
is built, and a rollback to a release whose interpreter is gone (the agent's builds:
test_stack_build.py; its pruning: test_stack_prune.py)."""
import json
import os

import pytest

from roles import gpu_stack
from specops import inventory, protocol
from specops.errors import UsageError
from specops.layout import DEFAULT_VENV, STACKS_DIR
from specops.ops import Context, Facts
from specops.sglang import stack
from roles import VOCABULARY

PINS = {"torch": {"version": "2.9.1", "cuda": "auto", "index_url": "http://ix/whl/{variant}"},
        "sglang": {"version": "0.5.23"}, "package_index": "http://ix/simple"}
GPU = {"present": True, "driver": "575.57.08", "gpus": []}


def host(tmp_path, **over):
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {**PINS, **over}}}}))
    return inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]


def test_a_stack_is_named_by_what_defines_it(tmp_path):
    a = stack.venv_of(host(tmp_path))
    assert a.startswith(STACKS_DIR + "/") and len(a.rsplit("/", 1)[1]) == 16
    assert stack.venv_of(host(tmp_path)) == a  # the same pins, the same stack
    assert stack.venv_of(host(tmp_path, sglang={"version": "0.5.24"})) != a
    assert stack.venv_of(host(tmp_path, packages=["tqdm==4.70.1"])) != a
    assert stack.venv_of(host(tmp_path, package_index="http://other/simple")) == a  # where from is not what
    assert stack.venv_of(host(tmp_path, venv="/opt/mine")) == "/opt/mine"  # the user's own venv
    assert stack.venv_of({"services": []}) == DEFAULT_VENV  # nothing pinned: what is installed there


def plan(h, facts):
    (op,) = [o for o in gpu_stack.ops(h) if isinstance(o, gpu_stack.Stack)]
    return op.plan(Facts({"venvs": {}, "gpu": GPU, **facts}), Context("box", False))


def test_a_missing_stack_is_one_build_with_the_variant_index_asked_first(tmp_path):
    h = host(tmp_path)
    c = plan(h, {})
    (build,) = c.actions
    assert isinstance(build, protocol.BuildStack) and build.path == stack.venv_of(h)
    assert build.specs == ["torch==2.9.1+cu128", "sglang==0.5.23"]
    # uv asks an --index before the --default-index: torch's variant first, everything else after
    assert build.sources == ["--index", "http://ix/whl/cu128", "--default-index", "http://ix/simple"]
    assert build.expect == {"torch": "2.9.1", "torch.version.cuda": "12.8", "sglang": "0.5.23"}
    assert build.need == stack.NEED_FIRST_TORCH
    cached = {"stacks": [{"path": "/x", "packages": {"torch": "2.9.1", "torch.version.cuda": "12.8"}}]}
    assert plan(h, cached).actions[0].need == stack.NEED_OTHERWISE  # its torch is in uv's cache already
    assert plan(host(tmp_path, stack_need_gib=1.5), {}).actions[0].need == int(1.5 * 2**30)


def test_a_built_stack_is_never_installed_into(tmp_path):
    h = host(tmp_path)
    listed = [{"path": stack.venv_of(h), "packages": {}}]
    ok = {"venvs": {stack.venv_of(h): {"exists": True, "torch_cuda": "12.8", "packages": {}}}, "stacks": listed}
    assert plan(h, ok).actions == []
    wrong = {"venvs": {stack.venv_of(h): {"exists": True, "torch_cuda": "12.6", "packages": {}}}, "stacks": listed}
    with pytest.raises(Exception, match="wants cu128: set torch.cuda"):
        plan(h, wrong)
    # a venv at the stack's path without its stack file (a cut build or removal) is built again
    half = {"venvs": {stack.venv_of(h): {"exists": True, "torch_cuda": "12.8", "packages": {}}}}
    assert isinstance(plan(h, half).actions[0], protocol.BuildStack)


def test_a_new_stack_is_said_by_the_versions_it_moves_from_the_one_that_runs(tmp_path):
    """Issue 38: --check said a new stack by its hash; a person upgrades "sglang 0.5.23 → 0.5.24"."""
    svc = {"services": [{"name": "sglang", "model_path": "/models/m"}]}
    old, new = stack.venv_of(host(tmp_path, **svc)), host(tmp_path, sglang={"version": "0.5.24"}, **svc)
    unit = f'[Service]\nExecStart="{old}/bin/python" /usr/local/lib/specops/launch.py --port 30000\n'
    runs = {"units": {"sglang": {"text": unit}},
            "stacks": [{"path": old, "packages": {"torch": "2.9.1", "torch.version.cuda": "12.8", "sglang": "0.5.23"}}]}
    assert plan(new, runs).summary == "sglang 0.5.23 → 0.5.24; build with uv: torch==2.9.1+cu128 sglang==0.5.24"
    assert plan(new, {"units": {}}).summary.startswith("build with uv: ")  # nothing runs yet: nothing moves
    assert stack.versions({"sglang": "0.5.24", "torch": "2.9.1+cu128", "flash-linear-attention": "import failed: x"},
                          {"sglang": "0.5.23", "torch": "2.9.1+cu128"}) == "sglang 0.5.23 → 0.5.24, torch 2.9.1+cu128"


def test_a_stack_the_disk_cannot_hold_is_refused_at_plan_time(tmp_path):
    with pytest.raises(Exception, match=r"needs 12.0 GiB free on /opt/specops/venvs; 3.0 GiB free"):
        plan(host(tmp_path), {"stacks_free": 3 * 2**30})
    assert plan(host(tmp_path), {"stacks_free": 13 * 2**30}).actions


def test_index_urls_reach_pip_and_uv_in_their_environment_not_their_command_line():
    from specops.agent.converge import installs
    uv = installs.as_env(["--index", "http://u:pw@a/whl/cu128", "--index", "http://b/x",
                          "--default-index", "http://u:pw@c/simple"], installs.UV_ENV)
    assert uv == {"UV_INDEX": "http://u:pw@a/whl/cu128 http://b/x", "UV_DEFAULT_INDEX": "http://u:pw@c/simple"}
    pip = installs.as_env(["--no-index", "--find-links", "/w"], installs.PIP_ENV)
    assert pip == {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/w"}
    with pytest.raises(Exception, match="not an index option: --pre"):
        installs.as_env(["--pre"], installs.UV_ENV)


def test_every_pip_call_takes_its_indexes_from_its_environment(tmp_path, monkeypatch):
    """A user's venv (PythonPackages), the router's venv and the tool venvs (uv, the hub client):
    one mechanism, the index password never on a command line (/proc/PID/cmdline is every
    user's to read), requirements after `--`, written with umask 022, root's own PIP_* dropped."""
    from roles import router_stack
    from specops.agent.converge import installs
    calls = []

    def spawn(argv, desc, env=None):
        umask = os.umask(0)
        os.umask(umask)
        calls.append((argv, env or {}, umask))
        if argv[1:4] == ["-I", "-m", "venv"]:
            os.makedirs(os.path.join(argv[-1], "bin"), exist_ok=True)
    monkeypatch.setattr(installs, "run_streamed", spawn)
    monkeypatch.setattr(installs, "TOOLS_DIR", str(tmp_path / "tools"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://roots-own/simple")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/private-ca.pem")  # root's own pip settings but indexes stay
    secret = "https://u:s3cret@ix.example/simple"
    h = host(tmp_path, venv="/opt/v", package_index=secret)
    (packages,) = [op for op in gpu_stack.ops(h) if isinstance(op, gpu_stack.PythonPackages)]
    (pip,) = [a for a in packages.plan(Facts({"venvs": {}, "gpu": GPU}), Context("box", False)).actions
              if isinstance(a, protocol.PipInstall)]
    router = {**h.vars, "services": [{"name": "r", "kind": "router", "port": 30100, "workers": ["w"]}]}
    (rpip,) = [a for a in router_stack.RouterPackage(router, router["services"][0], "/opt/r").plan(
        Facts({"venvs": {}}), Context("box", False)).actions if isinstance(a, protocol.PipInstall)]
    for action in (pip, rpip):
        installs.install(action)
    installs.tool_venv("hf-1", "huggingface_hub==1", ["--index-url", secret])
    pips = [c for c in calls if "pip" in c[0]]
    assert len(pips) == 3
    for argv, env, umask in pips:
        assert "s3cret" not in " ".join(argv), argv
        assert secret in (env.get("PIP_INDEX_URL", "") + " " + env.get("PIP_EXTRA_INDEX_URL", "")).split(), env
        assert "roots-own" not in str(env) and env.get("PIP_CERT") == "/etc/ssl/private-ca.pem"
        assert "PIP_CONFIG_FILE" not in env  # pip.conf (a proxy, a CA) still read
        assert argv[argv.index("--") + 1:] and not any(a.startswith("-") for a in argv[argv.index("--") + 1:])
        assert umask == 0o022
    assert all(c[2] == 0o022 for c in calls)  # the tool venv itself too


def test_an_air_gapped_stack_needs_uv_in_the_wheelhouse(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "sglang-0.5.23-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(UsageError, match="has no uv"):
        gpu_stack.ops(host(tmp_path, wheelhouse=str(wheels)))
    (wheels / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"x")
    assert gpu_stack.ops(host(tmp_path, wheelhouse=str(wheels)))


def test_the_files_of_a_version_not_installed_come_from_its_wheel_in_memory(tmp_path):
    """What the patch check reads before a stack is built: the wheel's file and its RECORD sha256."""
    from sandbox import provision
    from specops.agent.converge import wheelfiles
    provision.sim_wheel(tmp_path / "wheels", "0.5.24")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    got = wheelfiles.read("sglang", "0.5.24", ["sglang/srt/models/llama.py", "sglang/nope.py"],
                          wheelhouse=str(tmp_path / "wheels"))
    want = (provision.SIM_SRC / "versions/0.5.24/sglang/srt/models/llama.py").read_bytes()
    assert got["sglang/srt/models/llama.py"] == want
    assert got["sglang/nope.py"] is None
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
    with pytest.raises(wheelfiles.SourceError, match="no sglang 0.5.99"):
        wheelfiles.read("sglang", "0.5.99", [], wheelhouse=str(tmp_path / "wheels"))
    # a built stack's files are read where they are installed: the probe's answer is empty
    assert wheelfiles.fact({"stack": "", "dist": "sglang", "version": "0.5.99", "files": [], "indexes": []}) == {
        "error": "no wheelhouse and no package index to read sglang 0.5.99 from"}


def test_a_wheel_from_an_index_keeps_its_credentials_on_their_host(tmp_path):
    """PEP 503 page on one loopback address with a link that redirects to another: the wheel is
    read, the credentials went to the index's host only, and never into an error."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from sandbox import provision
    from specops.agent.converge import wheelfiles
    wheel = provision.sim_wheel(tmp_path, "0.5.24")
    data, seen = wheel.read_bytes(), []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append((self.server.server_address[0], self.path, self.headers.get("Authorization")))
            if self.path == "/simple/sglang/":
                body = (f'<a href="../../files/{wheel.name}#sha256={hashlib.sha256(data).hexdigest()}">'
                        f"{wheel.name}</a>").encode()
            elif self.path.startswith("/files/"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.2:{other.server_address[1]}/cdn/{wheel.name}")
                self.end_headers()
                return
            else:
                body = data
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    index, other = ThreadingHTTPServer(("127.0.0.1", 0), Handler), ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    for server in (index, other):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://user:s3cret@127.0.0.1:{index.server_address[1]}/simple"
        got = wheelfiles.fact({"stack": STACKS_DIR + "/" + "f" * 16, "dist": "sglang", "version": "0.5.24",
                               "files": ["sglang/srt/models/llama.py"], "indexes": [url]})
        assert got["sglang/srt/models/llama.py"]["content_b64"]
        assert [(host, auth is not None) for host, _, auth in seen] == [
            ("127.0.0.1", True), ("127.0.0.1", True), ("127.0.0.2", False)]
        missing = wheelfiles.fact({"stack": STACKS_DIR + "/" + "f" * 16, "dist": "sglang", "version": "0.5.99",
                                   "files": [], "indexes": [url]})
        assert missing["error"] == f"http://127.0.0.1:{index.server_address[1]}: no sglang 0.5.99 there " \
                                   f"(it has 0.5.24)", missing  # the index named, its credentials and path not
    finally:
        for server in (index, other):
            server.shutdown()


def test_a_rollback_to_a_release_whose_interpreter_is_gone_is_refused(tmp_path):
    """The unit quotes every ExecStart word, so the interpreter's path starts with a quote: it is
    read as systemd reads it, and a missing one refuses the rollback before anything is put back."""
    from specops.agent import rollback
    from specops.agent.host import ActionError
    from specops.ops.unitfmt import exec_line
    here = tmp_path / "venv" / "bin" / "python"
    here.parent.mkdir(parents=True)
    here.write_text("")
    for python, refused in ((str(here), False), (str(tmp_path / "gone" / "bin" / "python"), True)):
        unit = tmp_path / "sglang.service"
        unit.write_text(f"[Service]\nExecStart={exec_line([python, '-m', 'sglang.launch_server'])}\n")
        assert unit.read_text().split("ExecStart=")[1].startswith('"') or " " not in python
        if refused:
            with pytest.raises(ActionError, match=f"release r1 runs {python}, which is no longer on the host"):
                rollback._runnable({"stamp": "r1"}, {"/etc/systemd/system/sglang.service": str(unit)})
        else:
            rollback._runnable({"stamp": "r1"}, {"/etc/systemd/system/sglang.service": str(unit)})


def test_going_back_takes_what_a_file_was_before_its_first_change_after_the_target():
    """Release r1 did not manage /etc/x; r2 changed it (keeping what it was), r3 changed it again
    (keeping r2's).  Back to r1 is what it was before r2, whatever order the releases come in."""
    from specops.agent import rollback
    r1 = {"stamp": "20260101T000000.000000Z", "files": ["/etc/unit"]}
    r2 = {"stamp": "20260102T000000.000000Z", "files": ["/etc/unit", "/etc/x"],
          "previous": {"/etc/x": {"sha256": "aa"}, "/etc/new": None}}  # as the manifest keeps it
    r3 = {"stamp": "20260103T000000.000000Z", "files": ["/etc/unit", "/etc/x"],
          "previous": {"/etc/x": {"sha256": "bb"}}}
    for deployed in ([r1, r2, r3], [r3, r2, r1]):
        want = rollback._state_at(r1, deployed)
        assert want["/etc/x"].endswith(f"{r2['stamp']}/previous/etc/x")
        assert want["/etc/new"] is None  # it was not there: it goes
        assert want["/etc/unit"].endswith(f"{r1['stamp']}/files/etc/unit")
