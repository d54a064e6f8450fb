"""Pure logic: unit rendering, quoting, handlers, diffs, redaction.  No fleet."""
import shlex

import pytest

from specops.services import unitfile
from specops.errors import UsageError
from specops.inventory import Host
from specops.ops import handlers
from specops import protocol
from specops.ops.handlers import restart
from specops.ops import Context, Facts, File, Service, render, unified_diff
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


def test_service_start_is_left_to_a_pending_restart():
    facts = Facts({"files": {}, "venvs": {}, "checks": {},
                   "units": {"s": {"ActiveState": "inactive", "UnitFileState": "enabled"}}})
    assert Service("s").plan(facts, Context("h", False, notified=[restart("s")])).actions == []
    start = Service("s").plan(facts, Context("h", False)).actions[0]
    assert isinstance(start, protocol.StartUnit) and start.unit.name == "s"  # an accounted start


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
    """One definition (services/hardening.py) reaches the managed unit and spec-bench's transient
    baseline (BaselineStart.properties is kind.properties)."""
    from specops.services import kind_of
    from specops.services.hardening import PROPERTIES
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
