"""The agent as it travels: one zip, built in memory, cached on each host as bytecode.

A run starts one agent per host: a short loader (python3 -I -S -c) reads, on stdin, the
zip's sha256 and size, the controller's MAGIC_NUMBER, the size of the zip compiled by the
controller (COMPILE_ZIP) and that compiled zip's sha256; the zip, and the compiled zip when
sent; then it serves the run's requests, each a frame (its length on a line, then the JSON),
answering each with a frame on stdout.  The loader keeps, in AGENT_HOME (a root-only directory
it checks with lstat), sourceless zips of that code, named by the source's hash, the
interpreter's cache tag and their own hash, which it checks before use: a zip is hashed again
whenever its device, inode, size, mtime or ctime differ from those kept (NAME.seen) when it was
last hashed, a clock tick after its last write (a write moves the ctime, which only the clock
sets; ~2.5 ms a call spared on its ~700 KB).  A run that built one hashes it again as it ends,
so that the next run is spared it too.  It runs only
bytecode it can tie to this run: the compiled zip whose hash this controller names (for a
host whose interpreter has the controller's magic), or one it compiled itself ("host." before
its hash) from a source whose hash it checked: never another controller's bytecode, however
alike their sources.  When none is kept, it keeps the controller's compiled zip if its
interpreter has the controller's magic, else compiles the source itself (written O_EXCL and
fsync'd before the rename), and runs specops.agent.main from it.  Compiling the agent's
modules costs a host ~50 ms of CPU once per agent version; importing them as bytecode from
the zip costs ~3 ms.
"""
from __future__ import annotations

import hashlib
import io
import re
import shlex
import textwrap
import zlib
from functools import lru_cache
from pathlib import Path

from .. import memo
from ..layout import AGENT_HOME

from importlib.util import MAGIC_NUMBER  # noqa: E402

HERE = Path(__file__).resolve().parent.parent  # specops/: the agent's files are named from there
# What the host needs: the agent package and the modules it shares with the controller.
# Only modules of the tree (a regular file, a module's name): not an editor's lock file, a link
# or a scratch file that happens to sit there.
MEMBERS = ["__init__.py", "layout.py", "unitwords.py", *sorted(
    p.relative_to(HERE).as_posix() for d in ("protocol", "agent") for p in (HERE / d).rglob("*.py")
    if re.fullmatch(r"[a-z_0-9]+\.py", p.name) and not p.is_symlink() and p.is_file())]
MAIN = b"import sys\nfrom specops.agent.main import serve\nserve(sys.stdin.buffer, sys.stdout.buffer)\n"

# The agent's zip as bytecode (a sourceless zip): one definition, run by the loader on a host
# whose python3 the controller's bytecode does not fit, and by the controller for its own.
COMPILE_ZIP = """def compiled_zip(blob, magic):
    import io, marshal, zipfile
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            code = compile(src.read(name), "specops-agent/" + name, "exec", dont_inherit=True, optimize=0)
            dst.writestr(zipfile.ZipInfo(name + "c", (1980, 1, 1, 0, 0, 0)), magic + bytes(12) + marshal.dumps(code))
    return out.getvalue()
"""

LOADER = f"""import os, stat, sys, time
try:
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
try:
    from _frozen_importlib_external import MAGIC_NUMBER  # CPython's, loaded at start
except ImportError:
    from importlib.util import MAGIC_NUMBER
sha, size, magic, made_size, made_sha = sys.stdin.buffer.readline().decode().split()
mine = magic == MAGIC_NUMBER.hex()  # the controller's bytecode fits this interpreter
blob = sys.stdin.buffer.read(int(size))
made = sys.stdin.buffer.read(int(made_size))  # the zip compiled by the controller, for `magic`
home = {AGENT_HOME!r}
os.makedirs(home, 0o700, exist_ok=True)
st = os.lstat(home)
if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
    sys.exit("specops agent: %s must be a directory only its owner (uid %d) can use" % (home, os.getuid()))
prefix = "%s.%s." % (sha, sys.implementation.cache_tag)
def cached():
    for name in os.listdir(home):
        path = os.path.join(home, name)
        digest = name[len(prefix):-4]  # another controller's bytecode is not this run's to use
        ours = digest.startswith("host.") or mine and digest == made_sha
        if name.startswith(prefix) and name.endswith(".pyz") and ours:
            if trusted(path, digest.split(".")[-1]):
                return path
            os.unlink(path)  # not what its name says: never run, not kept
def trusted(path, digest):
    # A regular file of ours whose sha256 is `digest`: hashed unless its identity is the one kept
    # (NAME.seen) when it was last hashed, written a clock tick (2 s on a filesystem of whole
    # seconds) before that: any later write, even in the tick of the last one, moved its ctime.
    asked = time.time()
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return False
    if asked - st.st_mtime > 3600:
        os.utime(path)  # in use: the cleanup of other versions goes by this time
        return trusted(path, digest)
    ident = "%d %d %d %d %d" % (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    seen = path[:-4] + ".seen"
    if read_seen(seen) == ident:
        return True
    with open(path, "rb") as f:
        if sha256(f.read()).hexdigest() != digest:
            return False
    if st.st_ctime_ns / 1e9 < asked - (2 if st.st_ctime_ns % 1000000000 == 0 else 0.05):
        try:
            keep(seen, ident.encode(), sync=False)  # lost in a crash: hashed again, no harm
        except OSError:  # a full disk, a leftover .tmp: the next run hashes again
            pass
    return True
def read_seen(seen):
    try:
        fd = os.open(seen, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # ours, and under this name alone (not a link made to forge one)
        return f.read(200).decode("ascii", "replace") if st.st_uid == os.getuid() and st.st_nlink == 1 else None
def keep(path, data, sync=True):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.rename(tmp, path)
def build():
    if sha256(blob).hexdigest() != sha or len(made) != int(made_size):
        sys.exit("specops agent: the upload is corrupt")
    if made and mine:
        import zlib
        pyz = zlib.decompress(made)  # this interpreter's bytecode: compiled once, on the controller
        if sha256(pyz).hexdigest() != made_sha:
            sys.exit("specops agent: the upload is corrupt")
        digest = made_sha
    else:
{textwrap.indent(COMPILE_ZIP, " " * 8)}        pyz = compiled_zip(blob, MAGIC_NUMBER)
        digest = "host." + sha256(pyz).hexdigest()
    path = os.path.join(home, prefix + digest + ".pyz")
    keep(path, pyz)
    for old in os.listdir(home):  # other versions, unused for a day
        p = os.path.join(home, old)
        if not old.startswith(prefix) and time.time() - os.lstat(p).st_mtime > 86400:
            os.unlink(p)
    return path
kept = cached()
agent_zip = kept or build()
sys.path.insert(0, agent_zip)
from specops.agent.main import serve
serve(sys.stdin.buffer, sys.stdout.buffer)
if not kept:  # built by this run, which took a while: hashed again now, so that the next need not
    trusted(agent_zip, agent_zip[:-4].split(".")[-1])
"""
COMMAND = f"python3 -I -S -c {shlex.quote(LOADER)}"

# A file pushed from the controller, written by root on the host (so a login user with sudo
# can push too): into a root-owned directory that no one else can write, never through a link,
# as NAME.part renamed only when it has all TOTAL bytes; from OFFSET on when a cut push is resumed.
RECEIVER = """import os, stat, sys
dest, total, offset = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
parts = dest.strip("/").split("/")
fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
for name in parts[:-1]:
    try:
        os.mkdir(name, 0o755, dir_fd=fd)
    except FileExistsError:
        pass
    nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
    os.close(fd)
    fd = nfd
st = os.fstat(fd)
if st.st_uid != 0 or st.st_mode & 0o022:
    sys.exit("specops: %s is not a directory only root can write" % os.path.dirname(dest))
part = parts[-1] + ".part"
out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (0 if offset else os.O_TRUNC), 0o644, dir_fd=fd)
if not stat.S_ISREG(os.fstat(out).st_mode) or os.fstat(out).st_size < offset:
    sys.exit("specops: cannot resume %s at %d" % (dest, offset))
os.ftruncate(out, offset)
os.lseek(out, offset, 0)
while True:
    block = sys.stdin.buffer.read(1 << 20)
    if not block:
        break
    view = memoryview(block)
    while view:
        view = view[os.write(out, view):]
os.fsync(out)
if os.fstat(out).st_size != total:  # cut short: kept as .part, to resume from
    sys.exit("specops: %s has %d of %d bytes; kept to resume" % (dest, os.fstat(out).st_size, total))
os.rename(part, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
"""


def receive_command(dest: str, total: int, offset: int = 0) -> str:
    return f"python3 -I -S -c {shlex.quote(RECEIVER)} {shlex.quote(dest)} {total} {offset}"


@lru_cache(maxsize=1)
def artifact() -> tuple[bytes, str]:
    """(zip bytes, sha256): deterministic, so the same code always has the same hash.  Kept by
    the memo under its members' contents and this module's own (how it is zipped): deflating
    them costs ~15 ms a run, reading and hashing them ~2."""
    members = [*((f"specops/{m}", (HERE / m).read_bytes()) for m in MEMBERS), ("__main__.py", MAIN)]
    name = memo.key(_RECIPE, *(part for n, data in members for part in (n, data)))
    data = memo.cached("agent", name, lambda: _zip(members))
    return data, hashlib.sha256(data).hexdigest()


_RECIPE = Path(__file__).read_bytes()  # this module: how the zip and its bytecode are made


def _zip(members) -> bytes:
    import zipfile  # only when the memo has not kept this zip
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


def preamble(with_compiled: bool = True) -> bytes:
    """What the loader reads first: the zip's hash and size, this interpreter's MAGIC_NUMBER, the
    size of the zip compiled for it (deflated, ~250 KB; 0 when not sent) and the sha256 of that
    zip (inflated: the only controller's bytecode the host may run); the zip, then the compiled one.
    A host whose python3 has that magic keeps the compiled zip instead of compiling the agent
    itself (~50 ms of its CPU on first contact with a new agent).  It is sent only to a host this
    controller has not served this agent before (session.AgentSession): the others keep theirs."""
    data, sha = artifact()
    made = compiled() if with_compiled else b""
    return b"%s %d %s %d %s\n%s%s" % (sha.encode(), len(data), MAGIC_NUMBER.hex().encode(), len(made),
                                      compiled_sha().encode(), data, made)


@lru_cache(maxsize=1)
def compiled() -> bytes:
    """The agent's zip as the loader compiles it, for this interpreter, deflated; kept by the memo."""
    data, sha = artifact()

    def build():
        space: dict = {}
        exec(COMPILE_ZIP, space)
        return zlib.compress(space["compiled_zip"](data, MAGIC_NUMBER), 6)
    return memo.cached("agent", memo.key(_RECIPE, "compiled", MAGIC_NUMBER.hex(), sha), build)


@lru_cache(maxsize=1)
def compiled_sha() -> str:
    """The sha256 of compiled(), inflated: how the loader names and checks it.  Taken from the
    bytes this process sends, never kept apart from them: marshal's output depends on what the
    process imported, so two controllers racing on one memo may keep the zip of one (~2 ms)."""
    return hashlib.sha256(zlib.decompress(compiled())).hexdigest()


def frame(message: bytes) -> bytes:
    """One request or answer on the wire: its length on a line, then the JSON."""
    return b"%d\n%s" % (len(message), message)


def payload(request_json: bytes) -> bytes:
    """stdin for a one-shot agent that answers a single request, then exits."""
    return preamble() + frame(request_json)
