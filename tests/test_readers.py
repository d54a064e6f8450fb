"""The one reader of each fact that has several users (docs/ARCHITECTURE.md's table of homes):
ExecStart read back, host:port on the wire, the code a kept result depends on, the job after
`--`, a directory no one but the user and root can change.  No fleet."""
import socket
import sys
import threading
from pathlib import Path

import pytest
from invoke import Exit

from specops import cli, memo
from specops.agent.services import http
from specops.ops.unitfmt import exec_line, quote_word
from specops.unitwords import exec_words, interpreter

WORDS = ["/opt/v/bin/python", "-c", "print('$HOME 100%')", "a b", 'q"uote', "back\\slash", "$$", "%%i", ""]


def test_exec_start_is_read_back_as_the_words_it_was_written_from():
    """unitwords undoes what unitfmt writes: quotes, backslashes, systemd's $$ and %%."""
    assert exec_words(exec_line(WORDS)) == WORDS
    assert all(exec_words(quote_word(w)) == [w] for w in WORDS)
    assert interpreter(f"[Service]\nExecStart={exec_line(WORDS)}\n") == "/opt/v/bin/python"
    assert interpreter("[Service]\nExecStart=\"unclosed\n") is None and interpreter(None) is None


def test_a_request_names_an_ipv6_host_in_brackets_as_http_wants():
    seen = []
    server = socket.socket(socket.AF_INET6)
    server.bind(("::1", 0))
    server.listen(1)

    def answer():
        conn, _ = server.accept()
        seen.append(conn.recv(4096).decode())
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        conn.close()
    threading.Thread(target=answer, daemon=True).start()
    port = server.getsockname()[1]
    assert http.request("::1", port, "GET", "/health").body == b"ok"
    assert f"Host: [::1]:{port}\r\n" in seen[0]
    assert http.authority("10.0.0.1", 80) == "10.0.0.1:80" and http.authority("fd00::3", 8) == "[fd00::3]:8"
    server.close()


def test_the_code_id_changes_with_the_module_the_package_and_what_else_it_names(tmp_path):
    one, two = tmp_path / "a.py", tmp_path / "b.py"
    one.write_text("x = 1\n")
    two.write_text("x = 2\n")
    memo.code_id.cache_clear()
    ids = {memo.code_id(str(one), "yaml"), memo.code_id(str(two), "yaml"), memo.code_id(str(one), "jinja2"),
           memo.code_id(str(one), "yaml", "3.11")}
    assert len(ids) == 4


def test_the_job_after_dashes_is_one_command_line_or_words_that_stay_words(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["inv", "gpu-window", "--host", "h", "--", "python job.py --x 1"])
    assert cli.job_after_dashes("e.g.") == "python job.py --x 1"
    monkeypatch.setattr(sys, "argv", ["inv", "gpu-window", "--", "python", "a b.py"])
    assert cli.job_after_dashes("e.g.") == "python 'a b.py'"
    for argv in (["inv", "gpu-window", "--host", "h"], ["inv", "gpu-window", "--"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(Exit) as e:
            cli.job_after_dashes("inv gpu-window --host ct129 -- python job.py")
        assert e.value.code == 2
    assert "error: give the job after --, e.g. inv gpu-window --host ct129" in capsys.readouterr().err


def test_the_memo_and_monitoring_out_trust_a_directory_by_one_check(tmp_path, monkeypatch):
    """owndir.py: what it refuses, both refuse (the memo turns itself off; the task writes nothing)."""
    from roles import VOCABULARY
    from specops import inventory, owndir
    from specops.errors import UsageError
    from specops.fleetwide import prometheus
    monkeypatch.setattr(owndir, "untrusted", lambda path, sticky=True: f"{path} is refused here")
    monkeypatch.setenv("SPECOPS_MEMO", str(tmp_path / "memo"))
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    calls = []
    memo.cached("k", "n", lambda: calls.append(1) or b"x")
    memo.cached("k", "n", lambda: calls.append(1) or b"x")
    assert len(calls) == 2 and not (tmp_path / "memo").exists()
    example = inventory.load(Path(__file__).resolve().parent.parent / "inventory.example", VOCABULARY)
    with pytest.raises(UsageError, match=f"--out {tmp_path / 'prom'}: .* is refused here: nothing written"):
        prometheus.write(example, tmp_path / "prom")
    assert not (tmp_path / "prom").exists()
