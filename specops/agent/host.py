"""What every job of the agent shares: errors, progress lines, commands it runs (and stops
with itself), hashing, specops's state file, and cleaning text that came from the host."""
import grp
import json
import os
import pwd
import signal
import subprocess
import sys
import time

try:  # the interpreter's own SHA-256: hashlib would load OpenSSL (~3 ms a call) for small files
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256

from specops.layout import STATE_FILE

STREAM_TAIL = 30
_children = []  # commands we run, to stop with us
_cleanups = []  # callables that undo half-done work if we are interrupted


class ActionError(Exception):
    """A job failed on the host; the message is the one line the controller shows."""


def say(msg):
    """A progress line: stderr is streamed to the controller as it comes."""
    sys.stderr.write(clean(msg) + "\n")
    sys.stderr.flush()


_CONTROL = []


def clean(text):
    """Host-controlled text with terminal control sequences removed (newlines and tabs kept)."""
    if not _CONTROL:
        import re
        _CONTROL.append(re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]|\x1b\[[0-?]*[ -/]*[@-~]"))
    return _CONTROL[0].sub("", text)


def sha256_file(path):
    """The hex sha256 of a file specops itself keeps (releases, backups): it follows no user's link."""
    h = sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def user_name(uid):
    try:
        return pwd.getpwuid(uid)[0]
    except KeyError:
        return str(uid)


def group_name(gid):
    try:
        return grp.getgrgid(gid)[0]
    except KeyError:
        return str(gid)


def ids(owner, group):
    """(uid, gid) for names; -1 leaves that one unchanged."""
    try:
        uid = pwd.getpwnam(owner).pw_uid if owner else -1
        gid = grp.getgrnam(group).gr_gid if group else -1
    except KeyError as e:
        raise ActionError("no such user or group on the host: %s" % e)
    return uid, gid


def run_streamed(argv_or_cmd, desc, env=None):
    """Run a command in its own session, streaming its output as progress; raise on failure
    with the lines that say why (pip's ERROR lines, else the last few)."""
    shell = isinstance(argv_or_cmd, str)
    proc = subprocess.Popen(argv_or_cmd, shell=shell, stdout=subprocess.PIPE, start_new_session=True,
                            stderr=subprocess.STDOUT, universal_newlines=True, bufsize=1, env=env)
    _children.append(proc)
    tail, t0 = [], time.time()
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-STREAM_TAIL:]
        say("  | %5.1fs %s" % (time.time() - t0, line.rstrip()))
    rc = proc.wait()
    _children.remove(proc)
    if rc != 0:
        why = [l.strip() for l in tail if l.strip().startswith("ERROR")] or [l.strip() for l in tail if l.strip()][-3:]
        raise ActionError("%s failed (exit %d): %s" % (desc, rc, clean(" | ".join(why))[-1500:]))


def run_owned(argv, input=None, env=None, progress=None):
    """(exit status, stdout, stderr) of a command that stops with us: in its own session, killed
    with its children if we are interrupted (validators, the preflight, a download can run for
    long).  `progress` is called about once a second while it runs."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            start_new_session=True, env=env)
    _children.append(proc)
    try:
        if progress is None:
            out, err = proc.communicate(input)
        else:
            import threading  # only here: the agent starts on every call
            box = {}
            worker = threading.Thread(target=lambda: box.update(res=proc.communicate(input)), daemon=True)
            worker.start()
            while worker.is_alive():
                progress()
                worker.join(1)
            out, err = box.get("res") or ("", "its output was lost")
    finally:
        _children.remove(proc)
    return proc.returncode, out, err


def run_quiet(argv, timeout=None):
    """(exit status, stdout+stderr) of a short command."""
    try:
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return res.returncode, res.stdout


def journal(unit, lines=25):
    """The last lines the unit logged, cleaned of control characters."""
    _, out = run_quiet(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"])
    return clean(out.strip())


def on_interrupt(cleanup):
    """Register undo work for an interruption; returns a function that unregisters it."""
    _cleanups.append(cleanup)
    return lambda: cleanup in _cleanups and _cleanups.remove(cleanup)


def run_cleanups():
    """Do what is still registered for an interruption: on a signal, and when the session ends
    (a copy key that no copy used goes with the session that made it)."""
    for cleanup in list(_cleanups):
        try:
            cleanup()
        except Exception:
            pass
    del _cleanups[:]


def _interrupted(*_):
    run_cleanups()
    for proc in _children:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
    os._exit(130)


def die_with_connection():
    """If the SSH session dies (or Ctrl-C reaches us), undo half-done work and stop what we started:
    the kernel sends SIGTERM when sshd's session process goes."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _interrupted)
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


# ---- specops's record on the host: bytecode purges, units' past invocations ----

def read_state():
    """specops's own record on the host (STATE_FILE): bytecode purges, the units' past runs."""
    try:
        with open(STATE_FILE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_state(state):
    """Replace the record atomically (written, fsync'd, renamed)."""
    os.makedirs(os.path.dirname(STATE_FILE), mode=0o700, exist_ok=True)
    tmp = STATE_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, STATE_FILE)


def update_state(change):
    """Read, change (a function of the state dict), write: one writer at a time holds the lock."""
    state = read_state()
    change(state)
    write_state(state)
