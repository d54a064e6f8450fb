"""The peer's side of a host-to-host copy (hostfiles/peer_keys.py) and the inventory's peer
sources: no fleet needed.  The fleet test is tests/test_peercopy_fleet.py."""
import json
import os
import re
import time

import pytest

from specops import inventory
from specops.errors import UsageError
from specops.remote.hostfiles import peer_keys
from roles import VOCABULARY

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0bC4s8ZxYVn1sVd9H2B1d0jVb7bBqQ0C1u5lJjKf1"


@pytest.fixture
def peer(tmp_path, monkeypatch):
    home, model = tmp_path / "home", tmp_path / "model"
    home.mkdir()
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "a.safetensors").write_bytes(b"x" * 10)
    os.symlink("/etc/shadow", model / "leak")  # a link on the peer is not listed (rsync skips it too)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("rsync", "rrsync"):
        (bin_ / tool).write_text("#!/bin/sh\n")
        (bin_ / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    return home, model


def grant(home, model, key_id="0123456789abcdef", **over):
    req = {"op": "grant", "id": key_id, "key": KEY, "from": "10.9.8.7", "path": str(model), "minutes": 10,
           "for": "box"}
    return peer_keys.grant({**req, **over}, home=str(home))


def test_a_grant_is_one_restricted_line_and_a_revoke_takes_it_back(peer):
    home, model = peer
    (home / ".ssh").mkdir(mode=0o700)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAmine me@laptop")  # no final newline: the line kept, a newline added
    keys.chmod(0o640)
    got = grant(home, model)
    assert got["files"] == {"config.json": [2, (model / "config.json").stat().st_mtime_ns],
                            "sub/a.safetensors": [10, (model / "sub/a.safetensors").stat().st_mtime_ns]}
    lines = keys.read_text().splitlines()
    assert lines[0] == "ssh-ed25519 AAAAmine me@laptop" and len(lines) == 2
    assert lines[1].startswith(f'restrict,from="10.9.8.7",expiry-time="{got["expires"]}",'
                               f'command="{model.parent}/bin/rrsync -ro {model}" {KEY} specops-peer:0123456789abcdef:')
    assert lines[1].endswith(":box")
    assert oct(keys.stat().st_mode & 0o777) == "0o640"  # the user's own mode kept
    assert peer_keys.revoke({"id": "0123456789abcdef"}, home=str(home)) == {"removed": 1}
    assert keys.read_text() == "ssh-ed25519 AAAAmine me@laptop\n"


def test_stale_grants_are_swept_by_the_next_grant_or_revoke(peer):
    home, model = peer
    keys = home / ".ssh" / "authorized_keys"
    grant(home, model, "00000000000000aa", **{"for": "other"})
    epoch = keys.read_text().split(":")[-2]
    keys.write_text(keys.read_text().replace(f":{epoch}:", f":{int(time.time()) - 1}:"))  # its time has passed
    grant(home, model, "00000000000000bb", **{"for": "box"})
    assert "00000000000000aa" not in keys.read_text() and "00000000000000bb" in keys.read_text()
    # A run for box killed before its revoke: box's next grant drops its line (box's lock is held).
    grant(home, model, "00000000000000cc", **{"for": "other"})
    grant(home, model, "00000000000000dd", **{"for": "box"})
    text = keys.read_text()
    assert "00000000000000bb" not in text and "00000000000000cc" in text and "00000000000000dd" in text
    assert peer_keys.revoke({"id": "00000000000000ee"}, home=str(home)) == {"removed": 0}
    assert "00000000000000cc" in keys.read_text()  # not expired, not this revoke's: kept
    # cc's time passes; a revoke of another grant (dd's) is the only edit, and takes cc too.
    expire(keys, "00000000000000cc")
    assert peer_keys.revoke({"id": "00000000000000dd"}, home=str(home)) == {"removed": 2}
    assert "specops-peer" not in keys.read_text()
    # And a revoke of a key no longer there (its copy's revoke came first) still sweeps.
    grant(home, model, "00000000000000ff", **{"for": "other"})
    expire(keys, "00000000000000ff")
    assert peer_keys.revoke({"id": "00000000000000ee"}, home=str(home)) == {"removed": 1}
    assert keys.read_text() == ""


def expire(keys, key_id):
    """Make the grant of key_id one whose time has passed (its EPOCH a second ago)."""
    lines = keys.read_text().splitlines(True)
    (i, line), = [(i, l) for i, l in enumerate(lines) if f"specops-peer:{key_id}:" in l]
    mark = line.split()[-1].split(":")
    lines[i] = line.replace(":".join(mark), ":".join(mark[:2] + [str(int(time.time()) - 1)] + mark[3:]))
    keys.write_text("".join(lines))


def test_a_grant_expires_ten_minutes_from_now_by_the_clock(peer):
    """The bound is the wall clock's, read here: not what grant() answered."""
    home, model = peer
    before = time.time()
    got = grant(home, model)
    after = time.time()
    line = (home / ".ssh" / "authorized_keys").read_text()
    expiry = re.search(r'expiry-time="([0-9]{14})"', line).group(1)
    sshd_reads = time.mktime(time.strptime(expiry, "%Y%m%d%H%M%S"))  # local time, as sshd reads it
    epoch = int(line.split()[-1].split(":")[2])  # what the sweeps read
    for deadline in (sshd_reads, epoch):
        assert before + 600 - 1 <= deadline <= after + 600, (deadline - before, got["expires"])


@pytest.mark.parametrize("over, error", [
    ({"path": '/m" ,command="sh'}, "refusing the path"),
    ({"path": "models"}, "refusing the path"),
    ({"key": "ssh-rsa AAAA x"}, "not an ed25519 public key"),
    ({"key": KEY + "\nssh-ed25519 AAAAother"}, "not an ed25519 public key"),
    ({"from": "10.0.0.1\" ,x"}, "does not appear to be an IPv4 or IPv6 address"),
    ({"from": 'fe80::1%x,*",port-forwarding,permitopen="*:*'}, "a scoped address cannot be matched"),
    ({"path": "/models/it's"}, "refusing the path"),
    ({"id": "../x"}, "bad key id"),
    ({"for": "a b"}, "bad destination name"),
])
def test_a_grant_refuses_what_could_widen_the_line(peer, over, error):
    home, model = peer
    with pytest.raises((peer_keys.Refused, ValueError), match=error):
        grant(home, model, **over)
    assert not (home / ".ssh" / "authorized_keys").exists()


def test_a_directory_others_could_swap_is_not_served(peer, tmp_path):
    home, model = peer
    os.chmod(model, 0o777)
    with pytest.raises(peer_keys.Refused, match="can be changed by others than root and this user"):
        grant(home, model)
    os.chmod(model, 0o755)
    os.symlink(model, tmp_path / "via-link")
    with pytest.raises(peer_keys.Refused, match="is a symbolic link"):
        grant(home, tmp_path / "via-link")
    assert not (home / ".ssh" / "authorized_keys").exists()


def test_a_linked_authorized_keys_is_not_followed(peer, tmp_path):
    home, model = peer
    (home / ".ssh").mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    os.symlink(target, home / ".ssh" / "authorized_keys")
    with pytest.raises(peer_keys.Refused, match="a link is not followed"):
        grant(home, model)
    assert target.read_text() == "untouched\n"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_linked_ssh_directory_is_not_followed(peer, tmp_path, dangling):
    """~/.ssh a link someone made (to a directory of theirs, or to where one would be made):
    neither a grant nor a revoke goes through it, and nothing is made at its end."""
    home, model = peer
    theirs, expired_there = tmp_path / "theirs", "ssh-ed25519 AAAAtheirs x specops-peer:00000000000000aa:1:box\n"
    if not dangling:
        theirs.mkdir()
        (theirs / "authorized_keys").write_text(expired_there)  # a sweep through the link would drop it
    os.symlink(theirs, home / ".ssh")
    with pytest.raises(peer_keys.Refused, match=r"\.ssh is not a directory \(a link is not followed\)"):
        grant(home, model)
    with pytest.raises(peer_keys.Refused, match=r"\.ssh is not a directory \(a link is not followed\)"):
        peer_keys.revoke({"id": "00000000000000aa"}, home=str(home))
    assert os.path.islink(home / ".ssh")
    if dangling:
        assert not os.path.lexists(theirs)
    else:
        assert os.listdir(theirs) == ["authorized_keys"]
        assert (theirs / "authorized_keys").read_text() == expired_there


def test_peer_sources_are_checked_before_connecting(tmp_path):
    def load(source, hosts=("box", "other")):
        spec = {h: {"services": [{"name": "sglang", "model_path": "/m", "weights": source}]} if h == "box" else {}
                for h in hosts}
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": spec}}))
        return inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]
    from roles import models
    (op,) = models.ops(load({"source": "peer", "host": "other", "path": "/models/x", "address": "10.0.0.2"}))
    assert isinstance(op, models.Copied) and op.copy.address == "10.0.0.2" and op.copy.peer.name == "other"
    with pytest.raises(UsageError, match="a peer source needs host and path \\(path is missing\\)"):
        models.ops(load({"source": "peer", "host": "other"}))
    with pytest.raises(UsageError, match="the peer 'nobody' must be another host of the inventory"):
        models.ops(load({"source": "peer", "host": "nobody", "path": "/m"}))
    with pytest.raises(UsageError, match="the peer 'box' must be another host of the inventory"):
        models.ops(load({"source": "peer", "host": "box", "path": "/m"}))


def test_the_destination_must_be_roots_alone_all_the_way(tmp_path):
    """root's rsync writes by path, and the service reads by path: a directory on the way that a
    user could swap is named (weightsdir.unsettled), unless allow_shared_dirs lists where it is."""
    from specops.agent.host import user_name
    from specops.agent.weights.weightsdir import unsettled
    dest = tmp_path / "shared" / "weights"
    (dest / "sub").mkdir(parents=True)
    assert unsettled(str(dest)) is None  # /tmp is sticky: fine above root's own directories
    assert unsettled(str(tmp_path / "shared" / "not-yet" / "weights")) is None  # specops makes the rest
    os.chmod(tmp_path / "shared", 0o777)
    assert unsettled(str(dest)).endswith("/shared is writable by others (mode 777)")
    assert unsettled(str(dest), [str(tmp_path / "shared")]) is None
    os.chmod(tmp_path / "shared", 0o755)
    os.chown(dest / "sub", 1000, 1000)
    assert unsettled(str(dest)).endswith("/sub is not a directory of root's alone")
    os.chown(tmp_path / "shared", 1000, 1000)  # a user's directory holding root's: they can swap it
    assert unsettled(str(dest)).endswith("/shared is owned by %s" % user_name(1000))

def test_the_copy_trusts_only_the_host_key_the_controller_checked(tmp_path, monkeypatch):
    """rsync's ssh: no config of root's, the copy key only, no question asked, and the peer's host
    key the controller accepted as its only known host; a different key fails naming the address."""
    from specops import protocol
    from specops.agent.host import ActionError
    from specops.agent.weights import peercopy
    dest, where = tmp_path / "w", tmp_path / "key"
    dest.mkdir()
    where.mkdir()
    seen = []
    monkeypatch.setattr(peercopy, "run_owned", lambda argv, **kw: seen.append(argv) or (
        255, "", "Host key verification failed.\nrsync error: unexplained error (code 255)"))
    req = protocol.PeerCopy(id="i", user="specops-peer", address="192.0.2.7", port=22, host_key="ssh-ed25519 AAAAkey",
                            path="/models/m", dest=str(dest), files={"model.safetensors": [10, 1]}, source={})
    dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ActionError,
                           match="the peer's host key at 192.0.2.7 is not the one the controller accepted"):
            peercopy._copy_into(req, str(where), dfd)
    finally:
        os.close(dfd)
    (argv,) = seen
    ssh = argv[argv.index("-e") + 1].split()
    for option in ("StrictHostKeyChecking=yes", "BatchMode=yes", "IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null",
                   f"UserKnownHostsFile={where}/known_hosts", f"HostKeyAlias={peercopy.ALIAS}"):
        assert ssh[ssh.index(option) - 1] == "-o", option
    assert ssh[:3] == ["ssh", "-F", "/dev/null"]
    assert (where / "known_hosts").read_text() == f"{peercopy.ALIAS} ssh-ed25519 AAAAkey\n"
