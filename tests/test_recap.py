"""The recap counts what a run changed: a batch the host refused (its preflight failed, before
anything was changed) leaves its planned changes out of changed= and ok=.  A read-only task's
recap says what it looked at (and each such task asks for it); --json and inv report's page,
written at the end, fail in one line."""
import io
import json
import os
import sys
import types

import pytest

from specops import protocol
from specops.inventory import Host
from specops.ops import Context, Facts, Op
from specops.output.report import HostReport, Redactor, Reporter, recap
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


def _report(changes: int, same: int, error=None) -> HostReport:
    r = HostReport("a", error=error, elapsed=0.4)
    r.changes = [{"changed": True}] * changes + [{"changed": False}] * same
    return r


def test_a_read_only_task_s_recap_says_what_it_looked_at_never_converge_counters():
    """status and --check: drift is what differs from the inventory, not something changed;
    releases, facts, verify: read, nothing planned."""
    for report, said in ((_report(6, 11), "a            17 checked, 6 differ from the inventory  0.4s"),
                         (_report(0, 17), "a            17 checked, none differs from the inventory  0.4s"),
                         (_report(0, 0), "a            read  0.4s"),
                         (_report(0, 0, error="x"), "a            read, failed  0.4s")):
        out = Reporter(Redactor([]), show_diff=False, stream=io.StringIO())
        recap([report], out, read_only=True)
        printed = out.stream.getvalue()
        assert "RECAP (read only: no host changed)" in printed and said in printed.splitlines(), printed
        assert "changed=" not in printed and "ok=" not in printed


def test_a_check_run_is_read_only_whatever_the_task_says(monkeypatch, capsys):
    """play: --check (status sets it) or read_only gives the read-only recap; a deploy the counters."""
    from specops import cli
    monkeypatch.setattr(cli, "run_hosts", lambda hosts, body, roles, opts, out: [_report(6, 11)])
    monkeypatch.setattr(cli, "select", lambda sel, vocabulary, services: [Host("a", {})])
    for sel, read_only, said in ((cli.Selection(host="a", check=True), False, "6 differ from the inventory"),
                                 (cli.Selection(host="a"), True, "6 differ from the inventory"),
                                 (cli.Selection(host="a"), False, "ok=11  changed=6")):
        cli.play(lambda run: None, [], sel, vocabulary={}, stream=sys.stdout, exit_on_failure=False,
                 read_only=read_only)
        assert said in capsys.readouterr().out


def test_the_json_report_replaces_a_link_at_its_path_never_writes_through_it(tmp_path):
    """--json into a shared directory: a link someone put at that name is replaced by the report,
    its target left as it was (written whole, then renamed: owndir.write_whole)."""
    target, path = tmp_path / "someone-elses", tmp_path / "r.json"
    target.write_text("theirs")
    path.symlink_to(target)
    out = Reporter(Redactor([]), show_diff=False, stream=io.StringIO())
    recap([_report(1, 1)], out, str(path))
    assert target.read_text() == "theirs" and not path.is_symlink() and json.loads(path.read_text())["hosts"]["a"]


def _gone_while_running(directory):
    """A run_hosts (or play) whose hosts ran while `directory`, checked before, was taken away."""
    def ran(*args, **kwargs):
        directory.rmdir()
        return [_report(1, 1)]
    return ran


def test_a_json_report_that_cannot_be_written_after_the_run_is_one_line(tmp_path, monkeypatch):
    """Issue 50: --json's directory gone by the end of a run (checked before it) was a traceback
    after the hosts changed; it is one line (exit 1, a failure of the run), after the recap."""
    from specops import cli
    from specops.errors import SpecopsError
    (tmp_path / "d").mkdir()
    monkeypatch.setattr(cli, "run_hosts", _gone_while_running(tmp_path / "d"))
    monkeypatch.setattr(cli, "select", lambda sel, vocabulary, services: [Host("a", {})])
    out = io.StringIO()
    with pytest.raises(SpecopsError, match=rf"^--json {tmp_path}/d/r.json: not written \(No such file"):
        cli.play(lambda run: None, [], cli.Selection(host="a", json=str(tmp_path / "d" / "r.json")),
                 vocabulary={}, stream=out)
    assert "RECAP" in out.getvalue()


def test_report_s_page_that_cannot_be_written_after_the_run_is_one_line(tmp_path, monkeypatch, capsys):
    """inv report --out: the same, for the page it writes once the hosts were read."""
    from invoke import Exit
    import tasks
    (tmp_path / "d").mkdir()
    monkeypatch.setattr(tasks, "select", lambda sel: [Host("a", {})])
    monkeypatch.setattr(tasks, "play", _gone_while_running(tmp_path / "d"))
    monkeypatch.setattr(tasks, "report_mod", types.SimpleNamespace(page=lambda hosts, reports: "<html>"))
    with pytest.raises(Exit) as ended:
        tasks.report.body(None, host="a", out=str(tmp_path / "d" / "r.html"))
    err = capsys.readouterr().err
    assert ended.value.code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: --out {tmp_path}/d/r.html: not written (No such file"), err


def test_an_unwritable_json_report_after_ctrl_c_is_said_and_the_run_still_ends_as_ctrl_c(tmp_path, monkeypatch,
                                                                                           capsys):
    """Ctrl-C, then --json's directory gone: one line, and exit 130 as any Ctrl-C'd run's."""
    from invoke import Exit
    from specops import cli
    from specops.output.report import Interrupted
    (tmp_path / "d").mkdir()

    def cut(*args, **kwargs):
        raise Interrupted(_gone_while_running(tmp_path / "d")())
    monkeypatch.setattr(cli, "run_hosts", cut)
    monkeypatch.setattr(cli, "select", lambda sel, vocabulary, services: [Host("a", {})])
    with pytest.raises(Exit) as ended:
        cli.play(lambda run: None, [], cli.Selection(host="a", json=str(tmp_path / "d" / "r.json")),
                 vocabulary={}, stream=io.StringIO())
    err = capsys.readouterr().err
    assert ended.value.code == 130 and err.startswith("interrupted\nerror: --json ") and err.count("\n") == 2, err


def test_where_no_file_can_be_made_is_said_before_the_run(tmp_path, monkeypatch):
    """outfile.check, which every path written at a run's end passes before any connection (the
    cases of tests/test_usage_errors.py run the tasks): a file where its directory should be, a
    directory no file can be made in (as os.access says: root may write anywhere)."""
    from specops import outfile
    from specops.errors import UsageError
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match=rf"^--json {tmp_path}/f/r.json: {tmp_path}/f is not a directory$"):
        outfile.check(str(tmp_path / "f" / "r.json"), "--json")
    outfile.check("r.json", "--json")  # in the working directory
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(UsageError, match=rf"^--out {tmp_path}/r.html: no file can be made in {tmp_path} "):
        outfile.check(str(tmp_path / "r.html"), "--out")


TASKS = [(["facts"], True), (["verify"], True), (["releases"], True), (["report", "--out", "{tmp}/r.html"], True),
         (["patch", "srt/x.py", "--fetch"], True), (["deploy"], False), (["rollback"], False), (["stop"], False)]


@pytest.mark.parametrize("words, read_only", TASKS, ids=[words[0] for words, _ in TASKS])
def test_each_read_only_task_asks_play_for_the_read_only_recap(tmp_path, monkeypatch, words, read_only):
    """facts, verify, releases, report and patch change no host: each tells play so (its recap says
    what it looked at); a task that changes hosts does not.  Each is run as `inv` parses it, its
    play recorded in place of a run (nothing connects), against a throwaway inventory."""
    from invoke import Program
    import tasks
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    a: {address: 127.0.0.1, ssh_port: 9}\n")
    asked = []
    monkeypatch.setattr(tasks, "play", lambda *args, **kwargs: asked.append(kwargs) or [])
    monkeypatch.setattr(tasks, "report_mod", types.SimpleNamespace(page=lambda hosts, reports: "<html>"))
    monkeypatch.setattr(tasks, "patching", types.SimpleNamespace(body=lambda *args: None))
    argv = [w.replace("{tmp}", str(tmp_path)) for w in words]
    Program(namespace=tasks.ns, binary="inv").run(["inv", *argv, "-i", str(tmp_path / "hosts.yml"), "--host", "a"],
                                                   exit=False)
    assert [bool(kw.get("read_only")) for kw in asked] == [read_only]
