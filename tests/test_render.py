"""Pure logic: unit rendering, quoting, handlers, diffs, redaction.  No fleet."""
import shlex

import pytest

from specops.kinds import unitfile
from specops.errors import UsageError
from specops.inventory import Host
from specops.ops import handlers
from specops import protocol
from specops.ops.handlers import restart
from specops.ops import Context, Facts, File, render, unified_diff
from specops.output.report import Redactor
from specops.ops.unitfmt import envfile_line, exec_line, quote_word, unit_environment

SVC = {"name": "sglang", "model_path": "/models/Kimi K2.5", "port": 30001, "tp": 8,
       "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/k25-eagle3",
                       "num_steps": 15, "eagle_topk": 1, "num_draft_tokens": 16},
       "env_secret": {"HF_TOKEN": "hf_abc$def"}, "api_key": "sk-very-secret",
       "cuda_visible_devices": "0,1"}


def systemd_split(line: str) -> list[str]:
    """How systemd reads our ExecStart words (double-quoted, C escapes, $$ and %% doubled)."""
    words = shlex.split(line.replace("$$", "$").replace("%%", "%"), posix=True)
    return words


def test_unit_has_required_directives_and_no_secret():
    text = unitfile.unit_text(SVC, "/opt/sglang/venv")
    for line in ("Type=simple", "KillMode=control-group", "TimeoutStopSec=120", "Restart=on-failure",
                 "LimitNOFILE=65535", "EnvironmentFile=/etc/specops/sglang.env",
                 'Environment="CUDA_VISIBLE_DEVICES=0,1"'):
        assert line in text.splitlines()
    exec_start = next(l for l in text.splitlines() if l.startswith("ExecStart="))[len("ExecStart="):]
    argv = systemd_split(exec_start)
    # The launcher runs the module in-process and hands it the key from the 0600 env file: the key
    # is neither in the unit nor, expanded by systemd, in the process's command line.
    assert argv[:9] == ["/opt/sglang/venv/bin/python", "/usr/local/lib/specops/launch.py", "--secret",
                        "SGLANG_SPECOPS_API_KEY", "--api-key", "--on-signal", "SIGUSR2", "SGL_FORCE_SHUTDOWN=1",
                        "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "/models/Kimi K2.5"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert "$" not in exec_start.replace("$$", "")  # nothing for systemd to expand
    assert "sk-very-secret" not in text and "hf_abc" not in text


def test_env_file_holds_secrets_quoted():
    text = unitfile.env_text(SVC)
    assert 'HF_TOKEN="hf_abc\\$def"' in text.splitlines()
    assert 'SGLANG_SPECOPS_API_KEY="sk-very-secret"' in text.splitlines()


@pytest.mark.parametrize("word", ["plain", "with space", "$(touch /tmp/pwned)", "; rm -rf /", "it's",
                                  'say "hi"', "back\\slash", "100%", "${HOME}"])
def test_exec_words_round_trip(word):
    assert systemd_split(quote_word(word)) == [word]


def test_newlines_refused():
    with pytest.raises(UsageError, match="newlines"):
        quote_word("a\nExecStartPre=/bin/evil")
    with pytest.raises(UsageError, match="newlines"):
        envfile_line("X", "a\nY=b")
    with pytest.raises(UsageError, match="not a valid environment variable name"):
        unit_environment("BAD-NAME", "x")


def test_exec_line_expands_only_named_positions():
    assert exec_line(["/bin/a", "--k", "K"], {2: "K"}) == '"/bin/a" "--k" ${K}'


def test_template_is_strict():
    with pytest.raises(UsageError, match="templates/sglang.env.j2: 'secrets' is undefined"):
        render("sglang.env.j2", name="x")


def test_handlers_run_once_daemon_reload_first():
    acts = handlers.actions([restart("a"), handlers.DAEMON_RELOAD, restart("b"), restart("a"),
                             handlers.DAEMON_RELOAD])
    assert [(a.KIND, getattr(a, "unit", None) and a.unit.name) for a in acts] == [
        ("daemon-reload", None), ("restart", "a"), ("restart", "b")]


def facts_with(path, **fact):
    return Facts({"files": {path: {"path": path, **fact}}, "units": {}, "venvs": {}, "checks": {}})


def test_file_plan_diff_and_noop():
    import base64, hashlib
    old = b"a\nb\n"
    f = facts_with("/x", exists=True, type="file", sha256=hashlib.sha256(old).hexdigest(), size=4,
                   mode="0644", owner="root", group="root", content_b64=base64.b64encode(old).decode())
    op = File("/x", "a\nc\n", notify=[restart("s")])
    c = op.plan(f, Context("h", False))
    assert c.changed and c.notify == [restart("s")] and "-b\n+c\n" in c.diff
    assert isinstance(c.actions[0], protocol.Write)
    same = File("/x", old).plan(facts_with("/x", exists=True, type="file", sha256=hashlib.sha256(old).hexdigest(),
                                           size=4, mode="0644", owner="root", group="root"), Context("h", False))
    assert not same.changed and same.actions == []


def test_secret_file_diff_is_hidden():
    c = File("/e", "TOKEN=abc\n", secret=True).plan(facts_with("/e", exists=False), Context("h", False))
    assert "TOKEN" not in c.diff and "secret content: not shown" in c.diff



def test_redactor_hides_every_secret():
    r = Redactor([Host("h", {"services": [SVC]})])
    assert r("token hf_abc$def key sk-very-secret") == "token *** key ***"


def test_unified_diff_binary():
    assert "binary" in unified_diff(b"\xff\x00", b"\xfe", "f")


def test_the_launcher_sets_the_quick_stop_variable_in_its_own_process_on_the_signal(tmp_path):
    """Issue 23 item 9: SGLang reads SGL_FORCE_SHUTDOWN from its own environment after SIGTERM, and
    nothing outside a running process changes its environment: the launcher sets it there."""
    import signal
    import subprocess
    import sys
    (tmp_path / "server.py").write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print(os.environ.get('SGL_FORCE_SHUTDOWN')), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "said = False\n"
        "while True:\n"
        "    if os.environ.get('SGL_FORCE_SHUTDOWN') and not said:\n"
        "        said = print('set', flush=True) or True\n"
        "    time.sleep(0.05)\n")
    from pathlib import Path
    launcher = Path(__file__).resolve().parent.parent / "specops" / "remote" / "hostfiles" / "launch.py"
    for quick in (False, True):
        argv = [sys.executable, str(launcher), "--on-signal", "SIGUSR2", "SGL_FORCE_SHUTDOWN=1", "server"]
        p = subprocess.Popen(argv, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "ready\n"
        if quick:
            p.send_signal(signal.SIGUSR2)
            assert p.stdout.readline() == "set\n"  # the launcher set it: no race with the SIGTERM
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
        assert out.strip() == ("1" if quick else "None")


def test_every_unit_and_baseline_carries_the_sandboxing_and_a_user_only_when_asked():
    """One definition (kinds/hardening.py) reaches the managed unit and spec-bench's transient
    baseline (BaselineStart.properties is kind.properties)."""
    from specops.kinds import kind_of
    from specops.kinds.hardening import PROPERTIES
    lines = unitfile.unit_text(SVC, "/opt/sglang/venv").splitlines()
    for key, value in PROPERTIES.items():
        assert f"{key}={value}" in lines
    # Each protection by name (docs/security.md lists them): dropping one is seen here.
    assert {"NoNewPrivileges=yes", "ProtectSystem=full", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
            "ProtectKernelLogs=yes", "ProtectControlGroups=yes", "ProtectHostname=yes", "ProtectProc=invisible",
            "RestrictSUIDSGID=yes", "RestrictRealtime=yes", "RestrictNamespaces=yes", "LockPersonality=yes",
            "RestrictAddressFamilies=~AF_PACKET", "SystemCallArchitectures=native", "SystemCallErrorNumber=EPERM",
            "SystemCallFilter=~@clock @cpu-emulation @module @mount @obsolete @raw-io @reboot @swap",
            "UMask=0027"} <= set(lines)
    bounding = next(l for l in lines if l.startswith("CapabilityBoundingSet=~")).split("~")[1].split()
    assert len(bounding) == 26 and {"CAP_SYS_MODULE", "CAP_SYS_TIME", "CAP_SETUID", "CAP_NET_ADMIN", "CAP_MKNOD",
                                    "CAP_SYS_RAWIO", "CAP_BPF"} <= set(bounding)
    assert not {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_IPC_LOCK", "CAP_NET_RAW", "CAP_DAC_OVERRIDE"} & set(bounding)
    assert any(l.startswith("ExecStartPre=-+") and "nvidia-modprobe -u" in l for l in lines)  # nodes before sandbox
    assert not any(l.startswith(("User=", "StateDirectory=", "PrivateDevices=", "DeviceAllow=", "ProtectClock="))
                   for l in lines)  # root by default; nothing that hides or gates /dev/nvidia*
    as_user = {**SVC, "user": "sglang-svc"}
    lines = unitfile.unit_text(as_user, "/opt/sglang/venv").splitlines()
    assert {"User=sglang-svc", "StateDirectory=specops-home/sglang", "StateDirectoryMode=0700",
            "Environment=HOME=/var/lib/specops-home/sglang", "LimitMEMLOCK=infinity"} <= set(lines)
    own_home = {**as_user, "env": {"HOME": "/srv/h"}}  # the user's own HOME is not overridden
    assert not any(l.startswith("Environment=HOME=/var/lib") for l in unitfile.unit_text(own_home, "/v").splitlines())
    assert kind_of(as_user).properties(as_user)["User"] == "sglang-svc"
    assert set(PROPERTIES) <= set(kind_of(SVC).properties(SVC))



def test_specops_own_launcher_is_one_line_and_the_users_unit_keeps_its_diff():
    """Issue 38: the first `--check --diff` printed all of specops's own launcher; now one line,
    its old content never asked for, while the unit (the user's) keeps its unified diff."""
    import roles.sglang_service as role
    from specops.layout import LAUNCHER
    from sandbox.provision import sandbox_service
    ops = role.ops(Host("t1", {"services": [sandbox_service()]}))
    launcher = next(op for op in ops if getattr(op, "path", None) == LAUNCHER)
    assert launcher.wants().content == {}
    lines = len(role.LAUNCHER_SOURCE.decode().splitlines())
    new = launcher.plan(facts_with(LAUNCHER, exists=False), Context("h", True))
    assert new.diff == f"+ {LAUNCHER} (specops's launcher, {lines} lines)\n"
    old = launcher.plan(facts_with(LAUNCHER, exists=True, type="file", sha256="0" * 64, size=9, mode="0644",
                                   owner="root", group="root"), Context("h", True))
    assert old.diff == f"~ {LAUNCHER} (specops's launcher: not this specops's, replaced by its {lines} lines)\n"
    unit = next(op for op in ops if getattr(op, "path", "").endswith("/sglang.service"))
    assert unit.plan(facts_with(unit.path, exists=False), Context("h", True)).diff.count("\n+") > 10
    import roles.monitoring as monitoring
    from specops.layout import TEXTFILE_AGENT
    agent = next(op for op in monitoring.ops(Host("t1", {"monitoring": True}))
                 if getattr(op, "path", None) == TEXTFILE_AGENT)
    assert agent.plan(facts_with(TEXTFILE_AGENT, exists=False), Context("h", True)).diff == \
        f"+ {TEXTFILE_AGENT} (specops's agent, for the textfile, {len(agent.content)} bytes)\n"


def _unit_change(old_text, new_text):
    import base64, hashlib
    from specops.ops import unit_file
    op = unit_file("sglang", new_text)
    f = facts_with(op.path, exists=True, type="file", sha256=hashlib.sha256(old_text.encode()).hexdigest(),
                   size=len(old_text), mode="0644", owner="root", group="root",
                   content_b64=base64.b64encode(old_text.encode()).decode())
    return op.plan(f, Context("h", True)).diff


def test_an_execstart_diff_shows_the_arguments_that_changed():
    """Issue 38: a changed ExecStart= was one huge line each side; now the arguments that changed."""
    from sandbox.provision import sandbox_service
    before = sandbox_service()
    after = {**before, "speculative": {**before["speculative"], "num_steps": 5},
             "extra_args": ["--enable-torch-compile"]}
    diff = _unit_change(unitfile.unit_text(before, "/opt/specops/venvs/aaa"),
                        unitfile.unit_text(after, "/opt/specops/venvs/bbb"))
    assert ("\n~ExecStart: /opt/specops/venvs/aaa/bin/python → /opt/specops/venvs/bbb/bin/python; "
            "--speculative-num-steps 3 → 5; + --enable-torch-compile\n") in diff, diff
    assert "-ExecStart=" not in diff and "+ExecStart=" not in diff
    assert max(map(len, diff.splitlines())) < 160, diff
    gone = _unit_change(unitfile.unit_text(after, "/v"), unitfile.unit_text(before, "/v"))
    assert "~ExecStart: --speculative-num-steps 5 → 3; - --enable-torch-compile\n" in gone, gone
    # an unchanged ExecStart around another change is shortened, and the change is a plain diff
    env = _unit_change(unitfile.unit_text(before, "/v"), unitfile.unit_text({**before, "env": {"A": "1"}}, "/v"))
    assert ' ExecStart=… (unchanged)\n' in env and '-Environment="SGLANG_SIM_STARTUP_DELAY=1"' in env, env


def test_a_notified_handler_is_said_notified_not_run():
    """Issue 38: `handler daemon-reload sglang: run` was followed by `daemon-reload: not needed`:
    a handler is notified when planned; the batch's step runs it or says why it was not needed."""
    from types import SimpleNamespace
    from specops.converging import Converging
    from specops.ops import unit_file
    from specops.output.report import HostReport

    class Run(Converging):
        def __init__(self, check):
            self.host, self.quick, self.report = Host("t1", {}), (), HostReport("t1")
            self.opts = SimpleNamespace(check=check, verify_weights=False, run_checks=False)
            self.plan = [(SimpleNamespace(NAME="demo"), [unit_file("demo", "[Service]\nExecStart=/bin/true\n")])]
            self.out, self.said, self.sent = SimpleNamespace(change=lambda *a: None), [], []
            self.before_change, self.acted, self.applied = None, False, []

        def probe(self, ops, lock=False):
            return facts_with("/etc/systemd/system/demo.service", exists=False)

        def say(self, text):
            self.said.append(text)

        def call(self, req, on_stderr=None):
            self.sent.append(req)
            return protocol.ApplyResult(ok=True, results=[])
    for check, word in ((False, "notified"), (True, "would be notified")):
        run = Run(check)
        run.converge()
        assert [s for s in run.said if s.startswith("handler")] == [
            f"handler         daemon-reload demo: {word}", f"handler         restart demo: {word}"]


def test_no_kind_of_file_shadows_a_method_of_file_with_an_attribute():
    """model_patches.Patched once kept a flag in self.diff, which File.diff(old) became: every
    diff of a patched file failed with "'bool' object is not callable".  An attribute a subclass
    assigns must not be the name of a method of File."""
    import ast
    import inspect
    from roles import model_patches
    from specops.ops import files, systemd
    methods = {n for n, v in vars(files.File).items() if callable(v)}
    for cls in (model_patches.Patched, systemd.UnitFile):
        tree = ast.parse(inspect.getsource(cls))
        assigned = {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        assert not assigned & methods, (cls.__name__, assigned & methods)
