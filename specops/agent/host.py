"""What every job of the agent shares: errors, progress lines, commands it runs (and stops
with itself), hashing, specops's state file, and cleaning text that came from the host."""
import grp
import os
import pwd
import stat
import sys
import time

try:  # the interpreter's own SHA-256: hashlib would load OpenSSL (~3 ms a call) for small files
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256

from specops.agent import children
from specops.agent.lean import dumps, load, loads, signal
from specops.layout import STATE_FILE

STREAM_TAIL = 30
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
    if text.isprintable():  # no control character at all (a progress line): re is not imported for it
        return text
    if not _CONTROL:
        import re
        # The whole sequence first: ESC alone would go and leave its "[2m" (a colour) in the text.
        _CONTROL.append(re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]"))
    return _CONTROL[0].sub("", text)


def sha256_file(path):
    """The hex sha256 of a file specops itself keeps (releases, backups): it follows no user's link."""
    with open(path, "rb") as f:
        return sha256_fd(f.fileno())


def sha256_fd(fd, h=None):
    """The hex sha256 of what an open file holds, read from its start (the fd stays open); with
    `h`, that hash (fed a prefix already) is the one fed and told."""
    h, offset = h or sha256(), 0
    while True:
        block = os.pread(fd, 1 << 20, offset)
        if not block:
            return h.hexdigest()
        h.update(block)
        offset += len(block)


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


def run_streamed(argv_or_cmd, desc, env=None, pass_fds=()):
    """Run a command (see _spawn), streaming its output as progress; raise on failure with the
    lines that say why (pip's ERROR lines, else the last few)."""
    import subprocess  # here and below: only a request that runs a command imports it
    # stdin: nothing (the agent's own carries the protocol; a prompt must fail, not read it)
    proc = children.spawn(argv_or_cmd, shell=isinstance(argv_or_cmd, str), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, bufsize=1,
                          env=env, pass_fds=pass_fds)
    tail, t0 = [], time.time()
    try:
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-STREAM_TAIL:]
            say("  | %5.1fs %s" % (time.time() - t0, line.rstrip()))
        rc = proc.wait()
    finally:
        children.end([proc])
    if rc != 0:
        why = [l.strip() for l in tail if l.strip().startswith("ERROR")] or [l.strip() for l in tail if l.strip()][-3:]
        raise ActionError("%s failed (exit %d): %s" % (desc, rc, clean(" | ".join(why))[-1500:]))


def run_owned(argv, input=None, env=None, progress=None, pass_fds=()):
    """(exit status, stdout, stderr) of a command (see _spawn); validators, the preflight, a
    download can run for long.  `progress` is called about once a second while it runs."""
    import subprocess
    proc = children.spawn(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env,
                  pass_fds=pass_fds)
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
        children.end([proc])
    return proc.returncode, out, err


def run_quiet(argv, timeout=None):
    """(exit status, stdout+stderr) of a short command."""
    import subprocess
    try:
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return res.returncode, res.stdout


def wall_time(monotonic_usec):
    """A systemd *TimestampMonotonic (microseconds since boot) as wall-clock seconds, to the
    microsecond (its realtime properties print whole seconds only), or None when unset."""
    usec = int(monotonic_usec or 0)
    return time.time() - time.monotonic() + usec / 1e6 if usec else None


def journal(unit, lines=25, invocation=None):
    """What one run of the unit logged last (`invocation`; the unit's current or last run when
    None), cleaned of control characters.  A progress bar's redraws (each a line of its own at
    debug priority: the launcher's relay) collapse to the last before the next line, and a
    line that holds \\r-redraws (an unrelayed server's bar) to its last state."""
    if invocation is None:
        _, out = run_quiet(["systemctl", "show", unit, "-p", "InvocationID", "--value"])
        invocation = out.strip()
    # The run's own lines, and what systemd (PID 1: a trusted field, where any user may log an
    # INVOCATION_ID of their own) said of it: "Main process exited, code=killed", an OOM kill.
    match = ["_SYSTEMD_INVOCATION_ID=" + invocation, "+", "INVOCATION_ID=" + invocation, "_PID=1"] \
        if invocation else ["-u", unit]
    _, out = run_quiet(["journalctl", *match, "-n", str(lines * 20), "--no-pager", "-o", "json", "--all",
                        "--output-fields=MESSAGE,PRIORITY"])
    return last_states(out.splitlines(), lines)


def _bar(text):
    """Which bar a redraw is of: its description, up to its percentage or a parenthesis ("" for a
    bar drawn before it had one)."""
    import re
    return re.split(r"\s*\d+%|\(", text, 1)[0].strip().rstrip(":")


def last_states(rows, lines):
    """The last `lines` of journalctl -o json's rows, each bar at its last state (journal)."""
    entries = []
    for row in rows:
        try:
            entry = loads(row)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # bytes that are not printable text, or a field logged twice
            message = " ".join(m for m in message if isinstance(m, str)) or \
                bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(errors="replace")
        if not isinstance(message, str):
            continue
        states = [part for part in message.split("\r") if part.strip()]
        text = clean(states[-1] if states else message).rstrip()
        bar = _bar(text) if entry.get("PRIORITY") == "7" else None
        if bar is not None and entries and entries[-1][1] in (bar, ""):
            entries.pop()  # the bar's earlier state, or a first draw made before its description was set
        entries.append((text, bar))
    return "\n".join(text for text, _ in entries[-lines:])


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
    if children.state["locked"]:
        children.hold()  # kept until we exit: the host lock also waits for the cleanups below
    children.end(list(children.running))  # first: a cleanup may remove what one of them still uses
    run_cleanups()
    os._exit(130)


def die_with_connection(out=None):
    """If the SSH session dies (or Ctrl-C reaches us), stop what we started and undo half-done work.
    When the channel is closed under a running request, sshd signals nothing and only closes its
    ends of our pipes, so a thread waits for the controller's end of `out` to go and signals us
    then: sshd's own death closes them too.  Where `out` is no pipe or socket (no such thread),
    the kernel sends SIGTERM when our parent goes (PR_SET_PDEATHSIG)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _interrupted)
    try:
        fd = out.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # not a real channel (a test's buffer)
        mode = 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        import _thread  # one daemon thread: threading's Python layer is not needed for it
        _thread.start_new_thread(_watch, (fd,))
        return
    try:
        import ctypes  # only here: ~1 ms of a host's CPU a call (measured with the rest lean), which the thread spares
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _watch(fd):
    """Block until no one reads `fd` any more (POLLERR on a pipe, POLLHUP on a socket), then
    interrupt the main thread as a signal would: its request stops where it is."""
    import select
    poller = select.poll()
    poller.register(fd, 0)  # no events asked: only the error and hang-up ones, always reported
    while not poller.poll():
        pass
    if children.state["busy"]:  # between requests, serve() sees the end of its input and returns
        os.kill(os.getpid(), signal.SIGTERM)


# ---- specops's record on the host: bytecode purges, units' past invocations ----

def read_state():
    """specops's own record on the host (STATE_FILE): bytecode purges, the units' past runs."""
    try:
        with open(STATE_FILE) as f:
            return load(f)
    except (OSError, ValueError):
        return {}


def write_state(state):
    """Replace the record atomically (written, fsync'd, renamed)."""
    os.makedirs(os.path.dirname(STATE_FILE), mode=0o700, exist_ok=True)
    tmp = STATE_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write(dumps(state, sort_keys=True))  # one line: json.dump and indent use the pure-Python encoder
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, STATE_FILE)


def update_state(change):
    """Read, change (a function of the state dict), write: one writer at a time holds the lock."""
    state = read_state()
    change(state)
    write_state(state)
