"""The loader a host runs first (remote/shipping.py): which bytecode it keeps and runs as root,
and what it refuses; which hosts are sent the controller's compiled zip (remote/session.py).
The real loader, with python3 -I -S, its cache under tmp_path.  No fleet."""
import hashlib
import io
import marshal
import os
import subprocess
import sys
import time
import zipfile
import zlib
from importlib.util import MAGIC_NUMBER

from specops import layout
from specops.remote import shipping
from support.agentwire import ANSWER, REQUEST, frames, header, run_loader


def test_the_loader_builds_and_reuses_host_bytecode(tmp_path):
    """A first call keeps the agent as a sourceless zip named by hashes; a second reuses it; a
    replaced file is never run."""
    stdin = shipping.payload(REQUEST)
    for _ in range(2):
        res = run_loader(tmp_path / "agent", stdin)
        assert frames(res.stdout) == ANSWER, res.stderr
    (pyz,) = [p for p in (tmp_path / "agent").iterdir() if p.suffix == ".pyz"]
    assert all(n.endswith(".pyc") for n in zipfile.ZipFile(pyz).namelist())
    pyz.write_bytes(b"not what was built")
    res = run_loader(tmp_path / "agent", stdin)
    assert frames(res.stdout) == ANSWER, res.stderr
    (rebuilt,) = [p for p in (tmp_path / "agent").iterdir() if p.suffix == ".pyz"]  # a checked one serves
    assert rebuilt.read_bytes() != b"not what was built" and zipfile.is_zipfile(rebuilt)


def test_a_kept_zip_is_hashed_again_only_when_its_identity_moves(tmp_path):
    """Hashing the ~700 KB zip is most of the loader's own cost on a no-op: it is skipped while the
    zip's device, inode, size, mtime and ctime are those kept when it was last hashed a clock tick
    after its last write (a second write in the same tick of a coarse clock would keep its ctime).
    A run that built the zip hashes it again as it ends, so the next is spared it.  A write in
    place, same size, is found and never run."""
    home, stdin = tmp_path / "agent", shipping.payload(REQUEST)
    hashing = '    with open(path, "rb") as f:\n'
    traced = shipping.LOADER.replace(hashing, '    sys.stderr.write("hashed\\n")\n' + hashing)
    assert traced.count('sys.stderr.write("hashed') == 1

    def run(hold=0.0):
        """The loader's run, its stdin held open `hold` s (a deploy's requests take that long)."""
        loader = traced.replace(repr(layout.AGENT_HOME), repr(str(home)))
        p = subprocess.Popen(["python3", "-I", "-S", "-c", loader], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdin.write(stdin)
        p.stdin.flush()
        time.sleep(hold)
        out, err = p.communicate()
        assert frames(out) == ANSWER, err
        return err.count(b"hashed")

    assert run(hold=0.3) == 1  # built, then hashed as the run ends: written long enough before
    (pyz,) = [p for p in home.iterdir() if p.suffix == ".pyz"]
    assert (home / (pyz.name[:-4] + ".seen")).exists()
    assert run() == 0 and run() == 0
    seen = home / (pyz.name[:-4] + ".seen")
    os.link(seen, tmp_path / "second-name")  # a record with two names is not trusted: hashed again
    assert run() == 1
    os.unlink(tmp_path / "second-name")
    assert run() == 0
    os.chown(seen, 65534, -1)  # another owner's record (the directory once open to others): hashed again
    assert run() == 1 and run() == 0
    data = pyz.read_bytes()
    with open(pyz, "r+b") as f:  # another zip, written over this one in place: same inode and size
        f.write(b"\0" * 64)
    assert run() == 2  # its times moved: hashed, refused, built again, hashed as the run ends
    (rebuilt,) = [p for p in home.iterdir() if p.suffix == ".pyz"]
    assert rebuilt.read_bytes() == data
    run()  # hashed again unless the last run ended a tick after it wrote the zip
    assert run() == 0


def test_the_loader_keeps_the_controllers_bytecode_only_for_its_own_magic(tmp_path):
    """The same MAGIC_NUMBER: the controller's compiled zip is what the host keeps (no compile
    there).  Another: the host compiles the source itself, and serves the same."""
    for magic in ("same", "other"):
        home = tmp_path / magic / "agent"
        stdin = shipping.payload(REQUEST)
        if magic == "other":  # and the controller's bytecode junk: were it kept, nothing would serve
            (sha, size, ours, made, made_sha), rest = header(stdin)
            junk = rest[:int(size)] + b"x" * int(made) + rest[int(size) + int(made):]
            stdin = b" ".join([sha, size, b"00" * (len(ours) // 2), made, made_sha]) + b"\n" + junk
        res = run_loader(home, stdin)
        assert frames(res.stdout) == ANSWER, res.stderr
        (pyz,) = home.iterdir()
        controllers = zlib.decompress(shipping.compiled())
        assert (pyz.read_bytes() == controllers) is (magic == "same")
        assert zipfile.ZipFile(pyz).namelist() == zipfile.ZipFile(io.BytesIO(controllers)).namelist()


def test_the_loader_refuses_an_upload_cut_short(tmp_path):
    """A compiled zip shorter than its header says (a cut connection): refused, nothing kept."""
    (sha, size, magic, made, made_sha), rest = header(shipping.payload(REQUEST))
    cut = b" ".join([sha, size, magic, b"%d" % (int(made) + 10), made_sha]) + b"\n" + rest[:int(size) + int(made)]
    res = run_loader(tmp_path / "agent", cut)
    assert res.returncode != 0 and b"corrupt" in res.stderr
    assert not list((tmp_path / "agent").iterdir())


def _evil_zip() -> bytes:
    """The controller's compiled agent with its main module replaced: what another controller's
    memo (poisoned, or of another build) could have left on a host."""
    out = io.BytesIO()
    good = zipfile.ZipFile(io.BytesIO(zlib.decompress(shipping.compiled())))
    with zipfile.ZipFile(out, "w") as z:
        for name in good.namelist():
            data = good.read(name)
            if name == "specops/agent/main.pyc":
                code = compile("def serve(i, o):\n    o.write(b'2\\nOW')\n", name, "exec")
                data = MAGIC_NUMBER + bytes(12) + marshal.dumps(code)
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def test_bytecode_another_controller_left_is_never_run(tmp_path):
    """A compiled zip under this source's name and a true hash of itself, but not the one this
    controller names: not run (it serves this controller's own bytecode instead), and kept for
    the controller it belongs to."""
    (sha, *_), _ = header(shipping.payload(REQUEST))
    home = tmp_path / "agent"
    home.mkdir(mode=0o700)
    evil = _evil_zip()
    theirs = home / ("%s.%s.%s.pyz" % (sha.decode(), sys.implementation.cache_tag, hashlib.sha256(evil).hexdigest()))
    theirs.write_bytes(evil)
    for with_compiled in (True, False):  # sent or not: the host runs only what this controller names
        res = run_loader(home, shipping.preamble(with_compiled) + shipping.frame(REQUEST))
        assert frames(res.stdout) == ANSWER, (res.stdout, res.stderr)
    assert theirs.read_bytes() == evil
    assert {p.name for p in home.iterdir() if p.suffix == ".pyz"} == {theirs.name, theirs.name.replace(
        hashlib.sha256(evil).hexdigest(), shipping.compiled_sha())}


def test_a_compiled_zip_not_the_one_named_is_refused(tmp_path):
    """The compiled zip's sha256 in the header is checked before it is kept: another zip of the
    right size is corrupt, never run."""
    (sha, size, magic, made, made_sha), rest = header(shipping.payload(REQUEST))
    other = zlib.compress(_evil_zip(), 6)
    stdin = b" ".join([sha, size, magic, b"%d" % len(other), made_sha]) + b"\n" + rest[:int(size)] + other \
        + rest[int(size) + int(made):]
    res = run_loader(tmp_path / "agent", stdin)
    assert res.returncode != 0 and b"corrupt" in res.stderr and b"OW" not in res.stdout
    assert not list((tmp_path / "agent").iterdir())


def test_an_agent_cache_others_may_write_is_refused(tmp_path):
    """AGENT_HOME writable by its group or by everyone: the loader stops before it reads or keeps
    anything (whoever can write there could swap the zip between its hash check and its import)."""
    for mode in (0o770, 0o707, 0o1777):
        home = tmp_path / oct(mode) / "agent"
        home.mkdir(parents=True)
        os.chmod(home, mode)
        res = run_loader(home, shipping.payload(REQUEST))
        assert res.returncode != 0 and b"must be a directory only its owner" in res.stderr, mode
        assert not list(home.iterdir())


def test_the_header_names_the_compiled_zip_sent_whatever_the_memo_kept(tmp_path, monkeypatch):
    """marshal's bytes depend on what a process imported: two controllers racing on one memo may
    keep one's zip beside the other's hash (the review of issue 49 saw it 6 times in 10), and every
    new host said "the upload is corrupt".  The hash sent is the hash of the bytes sent."""
    from specops import memo
    monkeypatch.setenv("SPECOPS_MEMO", str(tmp_path / "memo"))
    monkeypatch.delenv("SPECOPS_NO_MEMO", raising=False)
    for f in (shipping.artifact, shipping.compiled, shipping.compiled_sha):
        f.cache_clear()
    first = shipping.preamble()
    (_, _, _, _, sha_before), _ = header(first)
    other = zlib.compress(_evil_zip(), 6)  # another process's compiled zip, kept under the same key
    memo.put("agent", memo.key(shipping._RECIPE, "compiled", MAGIC_NUMBER.hex(), shipping.artifact()[1]), other)
    for f in (shipping.compiled, shipping.compiled_sha):
        f.cache_clear()
    try:
        (sha, size, _, made, made_sha), rest = header(shipping.preamble())
        sent = rest[int(size):int(size) + int(made)]
        assert sent == other and made_sha.decode() == hashlib.sha256(zlib.decompress(sent)).hexdigest() != \
            sha_before.decode()
    finally:
        for f in (shipping.artifact, shipping.compiled, shipping.compiled_sha):
            f.cache_clear()


def _other_magic(stdin: bytes) -> bytes:
    """The same upload from a controller whose python has another MAGIC_NUMBER."""
    (sha, size, ours, made, made_sha), rest = header(stdin)
    return b" ".join([sha, size, b"00" * (len(ours) // 2), made, made_sha]) + b"\n" + rest


def _name(sha: bytes, digest: str) -> str:
    return "%s.%s.%s.pyz" % (sha.decode(), sys.implementation.cache_tag, digest)


def test_on_a_host_of_other_magic_only_its_own_checked_bytecode_runs_and_is_reused(tmp_path):
    """Another controller's compiled zip (not the host's own, `host.`) is never run there; one of
    the host's own whose content is not its name is removed, never run; a link is never followed;
    what the host compiled is reused by the next run, not compiled again."""
    stdin = _other_magic(shipping.payload(REQUEST))
    (sha, *_), _ = header(stdin)
    home = tmp_path / "agent"
    home.mkdir(mode=0o700)
    evil = _evil_zip()
    digest = hashlib.sha256(evil).hexdigest()
    theirs, forged, linked = home / _name(sha, digest), home / _name(sha, "host." + "0" * 64), \
        home / _name(sha, "host." + digest)
    theirs.write_bytes(evil)
    forged.write_bytes(evil)
    (tmp_path / "evil.pyz").write_bytes(evil)
    linked.symlink_to(tmp_path / "evil.pyz")
    res = run_loader(home, stdin)
    assert frames(res.stdout) == ANSWER, (res.stdout, res.stderr)
    assert theirs.exists() and not os.path.lexists(forged)
    (own,) = [p for p in home.iterdir() if ".host." in p.name and p != linked and os.path.exists(p)]
    inode = own.stat().st_ino
    res = run_loader(home, stdin)
    assert frames(res.stdout) == ANSWER and own.stat().st_ino == inode  # reused: not compiled again


def test_the_compiled_agent_goes_only_to_a_host_this_controller_has_not_served(tmp_path, monkeypatch):
    """The `served` memo: the compiled zip is sent at a first contact only (a host keeps it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in ("SPECOPS_MEMO", "SPECOPS_NO_MEMO"):
        monkeypatch.delenv(name, raising=False)
    from specops.remote import become, session

    class Chan:
        def __init__(self):
            self.sent, self.out = b"", b""

        def sendall(self, data):
            self.sent += data
            self.out += b"2\n{}"  # the agent answers each request with {}

        def recv_ready(self):
            return bool(self.out)

        def recv(self, n):
            out, self.out = self.out, b""
            return out

        def recv_stderr_ready(self):
            return False

        def exit_status_ready(self):
            return False

    class Transport:
        def __init__(self, key):
            self.key = key

        def get_remote_server_key(self):
            return type("Key", (), {"asbytes": lambda _: self.key})()

    def sent_compiled(key):
        chan = Chan()
        monkeypatch.setattr(become, "start", lambda *a, **k: (chan, b""))
        monkeypatch.setattr(session.select, "select", lambda *a: None)
        s = session.AgentSession("h", Transport(key))
        s.call(b"{}")
        head = chan.sent.split(b"\n", 1)[0].split()
        return int(head[3]) > 0
    assert sent_compiled(b"host-key-1")  # first contact
    assert not sent_compiled(b"host-key-1")  # it keeps what it compiled, or compiles its own
    assert sent_compiled(b"host-key-2")  # another host (or this one reinstalled: a new key)


def test_a_zip_looked_at_within_a_tick_of_its_last_write_is_never_spared_its_hash(tmp_path):
    """The loader's clock played as if it looked at the zip in the tick it was last written: its
    identity then proves nothing (a second write in that tick keeps its times), so it is hashed on
    every run and nothing is kept."""
    home, stdin = tmp_path / "agent", shipping.payload(REQUEST)
    same_tick = shipping.LOADER.replace("    asked = time.time()\n", "    asked = os.lstat(path).st_ctime_ns / 1e9\n")
    assert same_tick != shipping.LOADER
    for _ in range(4):  # built (and hashed as it ends), then kept and hashed
        assert frames(run_loader(home, stdin, loader=same_tick).stdout) == ANSWER
        assert not [p for p in home.iterdir() if p.suffix == ".seen"]
