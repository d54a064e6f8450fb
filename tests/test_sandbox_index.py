"""The package index `inv sandbox.up` leaves running: `down` stops it, and only it.  No fleet: the
pid file is written by hand, and the index served on loopback."""
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import fleet, pkgindex, tasks
from support import ROOT

SITE_ARGS = ("soj", "192.168.245")  # never booted nor swept here: only its state directory is used


@pytest.fixture
def site(tmp_path):
    return fleet.Site(*SITE_ARGS, tmp_path / "site")


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def record(site, pid: int, start_time: str, argv: list[str]) -> None:
    site.state.mkdir(parents=True, exist_ok=True)
    (site.state / pkgindex.PID_FILE).write_text(json.dumps({"pid": pid, "start_time": start_time, "argv": argv}))


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path, started) -> tuple[subprocess.Popen, list[str]]:
    """A real index process on loopback, as `sandbox.up` starts one (in a session of its own)."""
    (tmp_path / "root").mkdir(exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", "sandbox.pkgindex", "serve", "127.0.0.1", str(port), str(tmp_path / "root")]
    proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started.append(proc)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, argv
        except OSError:
            assert time.monotonic() < deadline and alive(proc), "the index did not start"
            time.sleep(0.05)


def test_down_kills_no_unrelated_process_named_by_the_pid_file(site, started, monkeypatch, capsys):
    """A pid file naming a process that is not the index (`sleep 300`: a pid reused since, or a file
    written by hand) is removed, and the process left running: even with its own start time, and even
    with the index's command line written in the file."""
    sleeper = subprocess.Popen(["sleep", "300"])
    started.append(sleeper)
    swept = []
    monkeypatch.setattr(fleet, "DEFAULT_SITE", site)
    monkeypatch.setattr(fleet, "sweep", swept.append)  # the hosts' part of `down` is not this test's
    forged = [sys.executable, "-m", "sandbox.pkgindex", "serve", fleet.service_address(site), "8631",
              str(site.state / "index")]
    for argv in (["sleep", "300"], forged):
        record(site, sleeper.pid, start_time(sleeper.pid), argv)
        tasks.down()
        assert alive(sleeper), argv
        assert not (site.state / pkgindex.PID_FILE).exists()
        assert "package index stopped" not in capsys.readouterr().out
    assert swept == [site, site]


def test_an_index_whose_start_time_differs_is_not_killed_and_the_recorded_one_is(tmp_path, site, started):
    """The recorded start time is what tells the index started from a process that has its pid
    now: with another, nothing is killed; with its own, SIGTERM stops it and the pid file goes."""
    proc, argv = serve(tmp_path, started)
    record(site, proc.pid, str(int(start_time(proc.pid)) + 1), argv)
    assert pkgindex.recorded(site) is None
    assert pkgindex.stop_recorded(site) == "stale"
    assert alive(proc) and not (site.state / pkgindex.PID_FILE).exists()
    record(site, proc.pid, start_time(proc.pid), argv)
    assert pkgindex.recorded(site) == proc.pid
    assert pkgindex.stop_recorded(site) == "stopped"
    assert proc.wait(1) == -signal.SIGTERM  # stopped by SIGTERM, not killed
    assert not (site.state / pkgindex.PID_FILE).exists()
    assert pkgindex.stop_recorded(site) == "none"


def test_the_index_binds_its_port_before_it_starts_and_a_listener_already_there_is_an_error(tmp_path, monkeypatch):
    """The port is bound by the starter and handed to the server: nobody can take it between a
    check and the server's bind, and one already listening (someone else's) is refused, not
    mistaken for the index."""
    site = fleet.Site("sok", "127.0.99", tmp_path / "site")
    monkeypatch.setattr(fleet, "service_address_up", lambda site: None)  # 127.0.99.254 is loopback already
    root = tmp_path / "root"
    (root / "simple").mkdir(parents=True)
    index = pkgindex.Index.__new__(pkgindex.Index)  # no wheels to build: an empty index is enough here
    index.site, index.port, index.root, index.proc = site, free_port(), root, None
    squatter = socket.socket()
    squatter.bind((fleet.service_address(site), index.port))
    squatter.listen(1)
    try:
        with pytest.raises(RuntimeError, match="something not started by the sandbox holds it"):
            index.start()
        assert index.proc is None  # no server was started
        squatter.close()
        index.start()
        from urllib.request import urlopen
        assert urlopen(f"{index.url}/simple/", timeout=5).status == 200
        assert index.proc.args[-1].isdigit()  # the bound socket, handed over
    finally:
        squatter.close()
        index.stop()  # whatever happened: a server this test started ends with it
