"""Issue 50, item 2: `inv sandbox.up` run again replaced the running host without a word, and a
deploy the README's first command made was gone.  It now says so, and what goes, before it
sweeps.  No fleet: a host's state directory is written by hand, its nspawn a process standing in."""
import os
import subprocess
import sys

import pytest

from sandbox import fleet, tasks


@pytest.fixture
def site(tmp_path):
    return fleet.Site("sow", "192.168.249", tmp_path / "site")  # never booted nor swept: its state directory only


def host_dir(site, name: str, pid: int):
    h = fleet.Host(name, 0, site)
    h.dir.mkdir(parents=True)
    (h.dir / "nspawn.pid").write_text(str(pid))
    return h


def nspawn(started, h) -> int:
    """A process that stands for the host's systemd-nspawn: its command line names the host's root."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-D", str(h.merged)])
    started.append(p)
    return p.pid


def test_no_host_dead_host_or_pid_taken_since_is_nothing_running(site, started):
    assert fleet.running(site) == [] and tasks.replacing(site) is None  # no state directory at all
    gone = subprocess.Popen(["true"])
    gone.wait()
    host_dir(site, "sandbox", gone.pid)  # left by a killed run: its sweep loses nothing
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(other)
    host_dir(site, "sandbox2", other.pid)  # a pid taken since (after a reboot): not this host's nspawn
    assert fleet.running(site) == [] and tasks.replacing(site) is None


def test_stop_never_signals_a_process_a_stale_pid_file_names(site, started):
    """A pid taken since (after a reboot) by another process: the host's stop, and so the sweep,
    leave it running (never kill a process that cannot be attributed)."""
    from sandbox import boot
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(other)
    h = host_dir(site, "sandbox", other.pid)
    assert h.pid() is None
    boot.stop(h, grace=0.5)
    assert other.poll() is None


def test_a_running_host_is_named_with_what_goes(site, started):
    h = fleet.Host("sandbox", 0, site)
    host_dir(site, "sandbox", nspawn(started, h))
    assert fleet.running(site) == ["sandbox"]
    assert tasks.replacing(site) == "replacing the running host sandbox: its deploys, services and files go"
    site.inventory_dir.mkdir(parents=True)
    (site.inventory_dir / "hosts.yml").write_text("all: {}\n")
    assert tasks.replacing(site) == (f"replacing the running host sandbox: its deploys, services and files go, "
                                     f"and {site.inventory_dir / 'hosts.yml'} is written anew")
    for name in ("sandbox2", "sandbox1"):
        host_dir(site, name, nspawn(started, fleet.Host(name, 0, site)))
    assert tasks.replacing(site).startswith("replacing the 3 running hosts sandbox, sandbox1, sandbox2: their "
                                            "deploys, services and files go, and ")


class FakeFleet:
    """Fleet's constructor checks and `up` sweeps: what `tasks.up` is seen saying between them."""
    said: list = []

    def __init__(self, names, layers, site, flavour):
        self.hosts, self.site = [fleet.Host(n, i + 1, site) for i, n in enumerate(names)], site

    def up(self):
        hosts = self.site.state / "hosts"  # what its sweep would find
        FakeFleet.said.append(("up", sorted(d.name for d in hosts.iterdir()) if hosts.is_dir() else []))
        return self


def test_up_says_it_replaces_a_running_host_before_it_sweeps(site, started, monkeypatch, capsys):
    monkeypatch.setattr(fleet, "DEFAULT_SITE", site)
    monkeypatch.setattr(fleet, "Fleet", FakeFleet)
    monkeypatch.setattr(tasks.provision, "layer", lambda kind: site.state / "layer")
    monkeypatch.setattr(tasks, "_index_up", lambda s: "http://192.168.249.254:8")
    monkeypatch.setattr(tasks.aptrepo, "controller_deb", lambda name: None)
    monkeypatch.setattr(tasks.aptrepo, "serve", lambda *a, **k: None)
    monkeypatch.setattr(tasks.provision, "write_inventory", lambda f: site.inventory_dir)
    monkeypatch.setattr(tasks.base, "log", lambda msg: FakeFleet.said.append(("log", msg)))
    FakeFleet.said = []
    tasks.up()  # nothing runs: nothing said
    assert FakeFleet.said == [("up", [])]
    host_dir(site, "sandbox", nspawn(started, fleet.Host("sandbox", 0, site)))
    FakeFleet.said = []
    tasks.up()
    assert FakeFleet.said == [("log", "replacing the running host sandbox: its deploys, services and files go"),
                              ("up", ["sandbox"])]
    assert "1 sandbox host(s) up" in capsys.readouterr().out


def test_a_pid_file_names_its_process_by_pid_and_start_time(site, started):
    """The pid file boot.start writes (pid and start time): the process it names is the host's; the
    same pid with another start time (a process that took the pid since) is not, even when its
    command line names the host's root."""
    from sandbox import boot
    h = fleet.Host("sandbox", 0, site)
    pid = nspawn(started, h)
    h.dir.mkdir(parents=True)
    ticks = int(boot.start_time(pid))
    uptime = float(open("/proc/uptime").read().split()[0]) * os.sysconf("SC_CLK_TCK")
    assert 0 <= uptime - ticks < 60 * os.sysconf("SC_CLK_TCK")  # started just now: the right field
    (h.dir / "nspawn.pid").write_text(f"{pid} {ticks}")
    assert h.pid() == pid and fleet.running(site) == ["sandbox"]
    (h.dir / "nspawn.pid").write_text(f"{pid} {ticks - 1}")
    assert h.pid() is None and fleet.running(site) == []
