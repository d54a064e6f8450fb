"""Who deployed a release and from what (specops/provenance.py, issue 46): the commits read from git
on the controller, "+dirty" when a work tree has changes, left out when git cannot say (never a
failed deploy); read once per run by the tasks that record releases, and carried by every release
record the run sends.  No fleet."""
import getpass
import io
import json
import os
import socket
import subprocess
import time

import pytest

from specops import cli, protocol, provenance
from specops.errors import ApplyFailed, SpecopsError
from specops.inventory import Host
from specops.output.report import Redactor, Reporter
from specops.run import HostRun, Options
from roles import VOCABULARY

PROV = protocol.Provenance(user="alice", controller="laptop", checkout="3f2a9c1d4e5f" + "0" * 28 + "+dirty")


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit: an inventory directory, and a git-ignored one."""
    r = tmp_path / "ops"
    (r / "inventory" / "host_vars").mkdir(parents=True)
    (r / "inventory" / "hosts.yml").write_text("all: {}\n")
    (r / "README").write_text("x\n")
    (r / ".gitignore").write_text("/mine/\n")
    (r / "mine").mkdir()
    git(tmp_path, "init", "-q", str(r))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "one")
    return r


def test_a_clean_work_tree_is_its_head_and_a_change_or_a_new_file_makes_it_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert provenance.commit(repo) == head and len(head) == 40
    (repo / "README").write_text("changed\n")
    assert provenance.commit(repo) == head + "+dirty"
    git(repo, "checkout", "-q", "README")
    assert provenance.commit(repo) == head
    (repo / "new").write_text("untracked\n")
    assert provenance.commit(repo) == head + "+dirty"


def test_an_inventory_is_its_repository_s_head_only_where_it_is_tracked_and_dirty_by_its_own_changes(repo):
    head = git(repo, "rev-parse", "HEAD")
    read = lambda path: provenance.read(str(path)).inventory  # noqa: E731
    assert read(repo / "inventory") == head and read(repo / "inventory" / "hosts.yml") == head
    (repo / "README").write_text("changed\n")  # the repository is dirty, the inventory is not
    assert read(repo / "inventory") == head
    (repo / "inventory" / "host_vars" / "t1.yml").write_text("port: 1\n")  # a host added, not committed
    assert read(repo / "inventory") == head + "+dirty"
    (repo / "mine" / "hosts.yml").write_text("all: {}\n")  # git-ignored (the default inventory/ is)
    assert read(repo / "mine") is None and read(repo / "mine" / "hosts.yml") is None


def test_not_a_repository_and_git_absent_slow_or_failing_leave_the_commit_out_never_fail(repo, tmp_path, monkeypatch):
    outside = tmp_path / "plain"
    outside.mkdir()
    assert provenance.commit(outside) is None
    monkeypatch.setattr(provenance, "CHECKOUT", repo)
    got = provenance.read(str(repo / "inventory"))
    assert got.checkout == git(repo, "rev-parse", "HEAD")
    assert (got.user, got.controller) == (getpass.getuser(), socket.gethostname())
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    monkeypatch.setenv("PATH", str(bin_))  # no git at all
    got = provenance.read(str(repo / "inventory"))
    assert got.checkout is None and got.inventory is None and got.user and got.controller
    fake = bin_ / "git"
    monkeypatch.setattr(provenance, "GIT_TIMEOUT", 0.3)
    for script in ("#!/bin/sh\necho 'fatal: oops' >&2; exit 128\n", "#!/bin/sh\nexec /bin/sleep 5\n"):
        fake.write_text(script)
        fake.chmod(0o755)
        t0 = time.monotonic()
        got = provenance.read(str(repo / "inventory"))
        assert (got.checkout, got.inventory) == (None, None) and time.monotonic() - t0 < 3


def test_a_run_that_records_releases_reads_it_once_for_all_its_hosts_and_others_never(monkeypatch, tmp_path):
    calls, seen = [], []
    monkeypatch.setattr(provenance, "read", lambda inventory: calls.append(inventory) or PROV)
    monkeypatch.setattr(cli, "select", lambda sel, vocabulary, services=None: [Host("t1", {}), Host("t2", {})])
    monkeypatch.setattr(cli, "run_hosts", lambda hosts, body, roles, opts, out: seen.append(opts.provenance) or [])
    monkeypatch.setattr(cli, "recap", lambda *a, **k: 0)
    sel = cli.Selection(all=True, inventory=str(tmp_path))
    cli.play(lambda run: None, [], sel, task="deploy", vocabulary=VOCABULARY)
    assert calls == [str(tmp_path)] and seen == [PROV]
    cli.play(lambda run: None, [], sel, task="status", vocabulary=VOCABULARY)
    assert calls == [str(tmp_path)] and seen == [PROV, None]


def test_every_release_record_a_run_sends_carries_it_and_it_survives_the_wire():
    from specops.flows import pipeline
    sent = []
    host = Host("t1", {})
    run = HostRun(host, [], Options(provenance=PROV), Reporter(Redactor([host]), show_diff=False, stream=io.StringIO()))
    run.call = lambda req, **kw: sent.append(req) or protocol.RecordResult(stamp="s", files=0)
    pipeline.record(run, "/var/lib/specops/releases/20261207T000000Z")
    from support.runs import switchless_run
    attempt = switchless_run(["apt-get install x"], sent)
    attempt.opts = run.opts
    with pytest.raises(SpecopsError):
        pipeline.failed(attempt, "/r/20261208T000000Z", ApplyFailed("apt failed", protocol.PREPARE))
    assert [r.provenance for r in sent] == [PROV, PROV] and sent[1].status == protocol.ROLLED_BACK
    for req in sent:
        wire = json.loads(json.dumps(protocol.encode(req)))
        assert wire["provenance"] == {"user": "alice", "controller": "laptop", "checkout": PROV.checkout,
                                      "inventory": None}
        assert protocol.decode_request(wire) == req
    older = protocol.encode(sent[0])
    del older["provenance"]  # a record without one (a switch cut off, recorded by the agent) still reads
    assert protocol.decode_request(older).provenance is None


def test_the_checkout_read_is_this_repository_s_head():
    """The commit a deploy from this checkout records (when git is here and this is a clone)."""
    head = subprocess.run(["git", "-C", str(provenance.CHECKOUT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    assert provenance.commit(provenance.CHECKOUT).split("+")[0] == head.stdout.strip()
    assert os.path.samefile(provenance.CHECKOUT / "specops" / "provenance.py", provenance.__file__)


def test_git_runs_no_program_the_repository_names_and_reads_no_other_repository(repo, tmp_path, monkeypatch):
    """specops runs as root: a repository's fsmonitor or hooks never run, and GIT_* of the caller's
    environment (a hook's GIT_DIR) never points git elsewhere."""
    marker = tmp_path / "ran"
    git(repo, "config", "core.fsmonitor", f"touch {marker}; false")
    git(repo, "config", "core.hooksPath", str(tmp_path))
    (repo / "README").write_text("changed\n")
    head = git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    assert provenance.commit(repo) == head + "+dirty"
    assert not marker.exists()
