"""A local user who owns a parent listed in allow_shared_dirs makes the weights directory herself,
in the instant between the agent's check and its mkdir, with a `.part` of hers inside: the agent
must not take the directory over, must never write into her `.part`, and a served file that is
not root's alone is drift however its size and mtime look.  The race is made certain here: the
mkdir the agent calls first lets her win (as a 3 s delay did on the fleet), then runs."""
import os
import stat

import pytest

from specops.agent import safefs
from specops.agent import weights as agent_weights
from specops.agent.host import ActionError
from specops.agent.weights import hub, weightsdir

HER = 4242  # a local user's uid (no account needed: ownership is all that counts)
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def shared(tmp_path):
    """Her directory, listed in allow_shared_dirs, where the weights directory is still to be made."""
    d = tmp_path / "shared"
    d.mkdir(mode=0o755)
    os.chown(d, HER, HER)
    return d


def test_a_weights_directory_she_made_first_is_refused_not_taken_over(shared, monkeypatch):
    dest = shared / "weights"
    real_mkdir = os.mkdir

    def she_wins(name, mode=0o777, *, dir_fd=None):
        if name == "weights" and not os.path.exists(dest):
            real_mkdir(name, 0o755, dir_fd=dir_fd)  # hers, made first
            os.chown(name, HER, HER, dir_fd=dir_fd)
            fd = os.open(str(dest / (SHARD + ".part")), os.O_WRONLY | os.O_CREAT, 0o644)
            os.fchown(fd, HER, HER)
            os.close(fd)
        return real_mkdir(name, mode, dir_fd=dir_fd)
    monkeypatch.setattr(safefs.os, "mkdir", she_wins)
    with pytest.raises(ActionError, match=r"weights: a directory of (uid )?4242's, not made by specops; refused"):
        weightsdir.open_dest(str(dest), [str(shared)])
    st = os.stat(dest)
    assert st.st_uid == HER and stat.S_IMODE(st.st_mode) == 0o755  # left as she made it, not chowned to root
    assert os.stat(dest / (SHARD + ".part")).st_uid == HER


def test_a_part_file_not_root_s_is_never_written_into(tmp_path, monkeypatch):
    dest = tmp_path / "weights"
    dest.mkdir(mode=0o755)
    part = dest / (SHARD + ".part")
    part.write_bytes(b"")
    os.chown(part, HER, HER)
    monkeypatch.setattr(hub, "ask", lambda *a, **k: pytest.fail("the hub client was handed her file"))
    dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    req = type("Req", (), {"dest": str(dest), "repo": "org/model"})()
    try:
        with pytest.raises(ActionError, match=rf"{SHARD}.part is (uid )?4242's \(mode 644\), not root's: refused"):
            hub.download(req, "/nonexistent/python", dfd, "c" * 40, [{"name": SHARD, "size": 10}], None)
    finally:
        os.close(dfd)
    assert part.read_bytes() == b"" and os.stat(part).st_uid == HER


def test_a_served_file_not_root_s_alone_is_drift_whatever_its_size_and_mtime(tmp_path):
    shard = tmp_path / SHARD
    shard.write_bytes(b"x" * 4096)
    st = os.lstat(shard)
    known = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    assert agent_weights._same(os.lstat(shard), known)
    os.chown(shard, HER, HER)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not agent_weights._same(os.lstat(shard), known)  # hers: she could have rewritten it
    os.chown(shard, 0, 0)
    os.chmod(shard, 0o666)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not agent_weights._same(os.lstat(shard), known)  # anyone's to write


def test_a_peer_copy_takes_again_a_file_not_root_s_alone_rather_than_keep_it(tmp_path, monkeypatch):
    """rsync's quick check (size and mtime) would keep her rewritten shard, and the drift would
    never settle: the agent removes it first, so the copy brings it anew as root's."""
    import types
    from specops.agent.weights import peercopy
    dest = tmp_path / "weights"
    dest.mkdir(mode=0o755)
    shard = dest / SHARD
    shard.write_bytes(b"hers" * 1024)
    os.chown(shard, HER, HER)
    st = os.stat(shard)
    seen = []

    class Moved(Exception):
        pass

    def rsync(argv, env=None, progress=None):
        seen.append(shard.exists())
        raise Moved()
    monkeypatch.setattr(peercopy, "run_owned", rsync)
    monkeypatch.setattr(agent_weights, "check_disk", lambda *a: None)
    req = types.SimpleNamespace(files={SHARD: (st.st_size, st.st_mtime_ns)}, dest=str(dest), peer="p", path="/m",
                                address="192.0.2.1", port=22, user="root", host_key="k", verify=False,
                                source_address="192.0.2.2")
    where = tmp_path / "key"
    where.mkdir()
    dfd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Moved):
            peercopy._copy_into(req, str(where), dfd)
    finally:
        os.close(dfd)
    assert seen == [False]  # gone before rsync ran: it is copied anew
