"""Weights from the sandbox hub (tests/conftest.py's `hub`) refused before any byte moves: a
filesystem too small for them, a file name from the listing that leaves the directory, and a
weights directory owned by a user."""
import pytest

from sandbox import hub as hub_mod
from support.weights import TARGET, hub_service, run

pytestmark = pytest.mark.fleet


def test_a_filesystem_too_small_is_refused_before_any_byte_moves(sandbox, hub):
    h = sandbox.reset("t4")
    h.run("mkdir", "-p", TARGET)
    h.run("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", TARGET)
    served = hub.served()
    res, rep = run(sandbox, "t4", hub_service(hub))
    assert res.returncode == 1
    assert ("not enough disk for sandbox/tiny-llama@main in /models/hub-llama: need 8.0 MiB"
            in rep["error"]), rep["error"]
    assert "MiB free" in rep["error"]
    assert hub.served() == served
    assert not h.path("/etc/systemd/system/sglang.service").exists()


def test_a_name_that_leaves_the_directory_or_a_users_directory_is_refused(sandbox, hub):
    """A hostile listing (`../../etc/...`) is refused before any byte moves; a weights directory
    owned by a user is refused, and keeps its owner and mode."""
    h = sandbox.reset("t5")
    served = hub.served()
    res, rep = run(sandbox, "t5", hub_service(hub, repo=hub_mod.ESCAPE))
    assert res.returncode == 1
    assert "refusing the file name '../../etc/specops-escape.json' from the source" in rep["error"], rep["error"]
    assert hub.served() == served and not h.path("/etc/specops-escape.json").exists()
    h.run("mkdir", "-p", TARGET)
    h.run("chown", "nobody:nogroup", TARGET)
    h.run("chmod", "0700", TARGET)
    res, rep = run(sandbox, "t5", hub_service(hub))
    assert res.returncode == 1
    assert f"{TARGET}: {TARGET} is owned by nobody; weights go only into directories of root's" in rep["error"], \
        rep["error"]
    assert h.run("stat", "-c", "%U %a", TARGET).stdout.strip() == "nobody 700"
