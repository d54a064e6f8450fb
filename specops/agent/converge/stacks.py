"""Python stacks on the host: each an immutable venv under layout.STACKS_DIR, named by the hash
of what defines it, built by uv from its cache (hard links) beside the stack that serves, and
removed only when no kept release names it.

A stack is complete once its STACK_FILE is in it: it is built in a directory of its own
(STACKS_DIR/.build-<key>-<random>) and renamed into place only after its packages import, so
an interrupted build never leaves a half stack where a release could point.
"""
import os
import stat
import time

from specops.agent import safefs
from specops.agent.converge.checks import expect_in
from specops.agent.host import ActionError, on_interrupt, run_streamed, say
from specops.agent.lean import load
from specops.layout import STACK_FILE, STACKS_DIR, UNIT_DIR, UV_CACHE, UV_PIN, stack_disk_refusal

BUILD_PREFIX = ".build-"


def is_stack_name(name):
    return len(name) == 16 and all(c in "0123456789abcdef" for c in name)


def stack_of(path):
    """What a complete stack says defines it (None: not a stack of ours, or not complete)."""
    if os.path.dirname(path) != STACKS_DIR or not is_stack_name(os.path.basename(path)):
        return None
    try:
        with open(os.path.join(path, STACK_FILE)) as f:
            return load(f)
    except (OSError, ValueError):
        return None


def remove_tree(path):
    """Remove a directory right under STACKS_DIR, which must be ours: no link on the way, writable
    by root alone.  shutil.rmtree follows no link inside it (it walks by fd on Linux)."""
    fd, real = safefs.open_dir(STACKS_DIR)
    safefs.close((fd, real))
    if real != STACKS_DIR or os.path.dirname(path) != STACKS_DIR:
        raise ActionError("%s: not specops's own stacks directory (%s)" % (path, real))
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil  # a removal: status and a no-op list stacks only
        shutil.rmtree(path)


def free():
    """Free bytes where stacks are built."""
    return _free(STACKS_DIR)


def _free(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def uv_tool(pip_args):
    """The pinned uv, in a tool venv of its own made once (from the package index or wheelhouse)."""
    from specops.agent.converge import installs  # a build's
    python = installs.tool_venv("uv-" + UV_PIN, "uv==" + UV_PIN, pip_args)
    return os.path.join(os.path.dirname(python), "uv")


def _uv_env(sources):
    from specops.agent.converge import installs
    return installs.clean_env(dict(installs.as_env(sources, installs.UV_ENV), UV_CACHE_DIR=UV_CACHE,
                                   UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1", UV_NO_PROGRESS="1",
                                   UV_LINK_MODE="hardlink"))


def root_only(root):
    """Make every file under root writable by root alone (a stack shares its files with uv's
    cache and with the other stacks: one file others could write is all of theirs; uv makes its
    .lock 0666).  Returns the first path not root's, which no chmod makes safe, else None."""
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            path = os.path.join(d, n)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid != 0:
                return path
            if st.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
    return None


def sweep_builds():
    """Remove what an interrupted build left (the host lock is held: no build is running)."""
    try:
        names = os.listdir(STACKS_DIR)
    except OSError:
        return
    for n in names:
        if n.startswith(BUILD_PREFIX):
            remove_tree(os.path.join(STACKS_DIR, n))


_NO_VERSION = r"no version of ([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==\S+"  # re's import: a build's alone


def build(a, allowed=()):
    """Answer a protocol.BuildStack (see there)."""
    if os.path.dirname(a.path) != STACKS_DIR or not is_stack_name(os.path.basename(a.path)):
        raise ActionError("not a stack path: %s" % a.path)
    if stack_of(a.path) is not None:
        return {"built": False}
    safefs.make_dir(os.path.dirname(STACKS_DIR), 0o755, 0, 0, parents=True)
    safefs.make_dir(STACKS_DIR, 0o755, 0, 0)
    sweep_builds()  # before the disk is measured: what a cut build left is not in the way
    free = _free(STACKS_DIR)
    if free < a.need:
        raise ActionError(stack_disk_refusal(os.path.basename(a.path), a.need, free))
    t0 = time.time()
    uv = uv_tool(a.uv_pip_args)
    safefs.make_dir(UV_CACHE, 0o700, 0, 0)
    if os.path.lexists(a.path):  # ours (a stack name) but not complete: built again
        remove_tree(a.path)
    import json
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp(prefix="%s%s-" % (BUILD_PREFIX, os.path.basename(a.path)), dir=STACKS_DIR)
    os.chmod(tmp, 0o755)
    forget = on_interrupt(lambda: shutil.rmtree(tmp, ignore_errors=True))
    umask = os.umask(0o022)  # what uv writes (and its cache, shared by every stack) is root's alone
    try:
        env = _uv_env(a.sources)
        # --relocatable: its scripts find their interpreter relative to themselves, so the finished
        # stack works after the rename into place.
        run_streamed([uv, "venv", "--quiet", "--relocatable", "--python", a.python, tmp], "uv venv", env=env)
        python = os.path.join(tmp, "bin", "python")
        install = [uv, "pip", "install", "--python", python, "--", *a.specs]  # requirements, never options
        try:
            run_streamed(install, "uv pip install " + " ".join(a.specs), env=env)
        except ActionError as e:
            import re
            stale = re.search(_NO_VERSION, str(e))
            if not stale:
                raise
            # uv answers from an index page it cached until the page's max-age (600 s on the public
            # index): a version published since reads as none.  Once, the page asked again.
            say("  uv saw no version %s in its cached index page: asking the index again "
                "(--refresh-package %s)" % (stale.group(0)[len("no version of "):], stale.group(1)))
            run_streamed(install[:3] + ["--refresh-package", stale.group(1)] + install[3:],
                         "uv pip install --refresh-package %s %s" % (stale.group(1), " ".join(a.specs)), env=env)
        got = expect_in(python, a.check, a.expect, "the new stack %s imports" % os.path.basename(a.path))
        loose = root_only(tmp)
        if loose:
            raise ActionError("the new stack %s has %s, which a user other than root could change; not used"
                              % (os.path.basename(a.path), loose[len(tmp) + 1:]))
        with open(os.path.join(tmp, STACK_FILE), "w") as f:
            json.dump(dict(a.defines, packages=got, built_at=time.time()), f, indent=1, sort_keys=True)
        os.rename(tmp, a.path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.umask(umask)
        forget()
    size = tree_size(a.path, set())
    say("  stack %s built in %.1fs: %.1f MiB of new files" % (os.path.basename(a.path), time.time() - t0, size / 2**20))
    return {"built": True, "seconds": round(time.time() - t0, 1), "bytes": size}


def tree_size(root, seen):
    """Bytes on disk of the files under root not already in `seen` (inodes): hard links are counted
    once across every tree measured with the same `seen`."""
    total = 0
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            try:
                st = os.lstat(os.path.join(d, n))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def listing():
    """The complete stacks on the host, what defines each and its packages (no sizes: cheap)."""
    try:
        names = sorted(n for n in os.listdir(STACKS_DIR) if is_stack_name(n))
    except OSError:
        return []
    out = []
    for n in names:
        info = stack_of(os.path.join(STACKS_DIR, n))
        if info is not None:
            out.append({"path": os.path.join(STACKS_DIR, n), "packages": info.get("packages") or {},
                        "defines": {k: v for k, v in info.items() if k not in ("packages", "built_at")}})
    return out


def stacks(uses):
    """The stacks on the host, each with the releases that name it (`uses`: path → [stamps]) and
    its size: `bytes` counts its files alone, `new` only those no stack listed before it shares
    (so the `new` figures add up to what the stacks take together); and the bytes of uv's cache
    that no stack shares (what building them again would not download)."""
    out, seen = [], set()
    for s in listing():
        out.append(dict(s, releases=uses.get(s["path"], []), bytes=tree_size(s["path"], set()),
                        new=tree_size(s["path"], seen)))
    return out, tree_size(UV_CACHE, seen) if os.path.isdir(UV_CACHE) else 0


def prune(kept):
    """Remove every complete stack no kept release names (`kept`: their paths), nor any unit file.
    Each is first renamed out of its name (atomic), so a cut removal leaves a build's leftovers,
    swept later, never a half stack under a stack's name."""
    kept = set(kept) | named_by_units()
    removed = []
    for s in listing():
        if s["path"] not in kept:
            import tempfile
            gone = tempfile.mkdtemp(prefix="%s%s-gone-" % (BUILD_PREFIX, os.path.basename(s["path"])), dir=STACKS_DIR)
            os.rename(s["path"], os.path.join(gone, "stack"))
            remove_tree(gone)
            removed.append(s["path"])
    return removed


def named_by_units():
    """The stacks the unit files in UNIT_DIR run (an ExecStart names its interpreter)."""
    out = set()
    try:
        names = [n for n in os.listdir(UNIT_DIR) if n.endswith(".service")]
    except OSError:
        return out
    for n in names:
        try:
            with open(os.path.join(UNIT_DIR, n)) as f:
                out.update(_stack_paths(f.read()))
        except OSError:
            continue
    return out


def _stack_paths(text):
    """The stack directories a unit file's text names (STACKS_DIR/ and 16 hex digits), without re:
    its import (~4 ms with enum) would cost every status and every monitored no-op."""
    found, at = set(), text.find(STACKS_DIR + "/")
    while at >= 0:
        name = text[at + len(STACKS_DIR) + 1:at + len(STACKS_DIR) + 17]
        if len(name) == 16 and all(c in "0123456789abcdef" for c in name):
            found.add(STACKS_DIR + "/" + name)
        at = text.find(STACKS_DIR + "/", at + 1)
    return found
