"""specops launcher: run a Python module as __main__ with secret flag values taken from the
environment, so that no secret appears on the command line (/proc/PID/cmdline, ps,
systemctl status) or in what the process logs.

    python launch.py [--secret ENV_VAR --flag]... [--on-signal SIGNAME VAR=VALUE] MODULE ARGS...

Each --secret pair moves the value of ENV_VAR (from the unit's 0600 EnvironmentFile) out of
the environment and appends `--flag value` to the arguments the module parses in-process;
the kernel's copy of the command line stays the one systemd started.  Log records and
anything written to stdout/stderr in this process have the values replaced by ***.

--on-signal: on SIGNAME, set VAR=VALUE in this process's own environment (os.environ), for a
module that reads VAR when it needs it: SGLang reads SGL_FORCE_SHUTDOWN after SIGTERM, so a
stop that need not drain sends SIGNAME first.  Nothing outside the process can change its
environment once it runs (a drop-in or `systemctl set-environment` reaches only later starts).

--relay PID (under systemd, started by the launcher): the module's stderr, which carries its
log and its progress bars, reaches the journal through this relay, a line per update.  tqdm
redraws a bar with \\r and ends a line only when the bar is done, and journald stores a line only
once it ends: without the relay a 20-minute weight load shows in the journal only at its end.  Its
stdout stays the journal's stream (how specops finds the module's leftover processes: procs.py).

Installed on each host by specops (it runs with the service's own interpreter).
"""
import logging
import os
import re
import runpy
import select
import signal
import subprocess
import sys
import time

REDRAW = b"<7>"  # journald's level prefix (SyslogLevelPrefix=, on by default): a redraw is debug


class Lines:
    """What the module writes, as the journal's lines: one per \\n, as journald makes them, and
    each \\r-redraw at once, marked REDRAW (a bar's redraws collapse to their last state when
    read: agent/host.py journal).  Text read after a redraw was shown starts a line of its own
    (another process's, usually); a line that ends (\\n) after a redraw within one read, which is
    the bar's last state or text written after it, is a plain line: nothing in it is collapsed."""

    MAX = 48 * 1024  # journald's LineMax: it cuts a longer line there

    def __init__(self):
        self.pending, self.redraw, self.shown = b"", False, False

    def feed(self, data):
        out = []
        for piece in re.split(b"([\r\n])", data):
            if piece == b"\r":
                if self.pending.strip() and not self.shown:
                    out.append((REDRAW if self.redraw else b"") + self.pending + b"\n")
                self.pending, self.shown, self.redraw = b"", False, True
            elif piece == b"\n":
                if not self.shown and (self.pending or not self.redraw):  # "\r\n" ends one line
                    out.append(self.pending + b"\n")
                self.pending, self.shown, self.redraw = b"", False, False
            elif piece:
                if self.shown:  # after a redraw shown, another process's line (a rare split redraw too)
                    self.pending, self.redraw = b"", False
                self.pending, self.shown = self.pending + piece, False
                if len(self.pending) >= self.MAX:
                    out.append((REDRAW if self.redraw else b"") + self.pending + b"\n")
                    self.pending = b""
        if self.redraw and self.pending.strip() and not self.shown:
            out.append(REDRAW + self.pending + b"\n")
            self.shown = True
        return out

    def flush(self):
        return [self.pending + b"\n"] if self.pending and not self.shown else []


def gone(proc):
    """Whether the process whose /proc directory `proc` holds open has ended (a zombie has): the
    directory stays that process's, whoever gets its pid next."""
    if proc is None:
        return True
    try:
        with open(os.open("stat", os.O_RDONLY, dir_fd=proc)) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (ProcessLookupError, FileNotFoundError):
        return True
    except (OSError, IndexError):  # not known to be gone: ending early would break the server's stderr
        return False


def relay(server):
    """--relay PID: stdin to stdout as Lines, until the end of stdin or of the server (PID): a
    leftover of the server may hold the pipe, and write to it, for ever, and the unit must stop.
    It forks and its first process leaves at once, so that it is nobody's child: a server that
    kills its children on the way out (SGLang's kill_process_tree) leaves it its last words."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if os.fork():
        os._exit(0)
    try:
        proc = os.open("/proc/%d" % server, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # gone already: what is in the pipe, then out
        proc = None
    lines, look = Lines(), 0.0
    try:
        while True:
            if time.monotonic() >= look:
                look = time.monotonic() + 1.0
                if gone(proc):
                    _drain(lines, time.monotonic() + 0.5)
                    break
            if not select.select([0], [], [], 1.0)[0]:
                continue
            data = os.read(0, 65536)
            if not data:
                break
            _write(lines.feed(data))
        _write(lines.flush())
    except OSError:  # the journal's end of the stream is gone
        pass


def _drain(lines, deadline):
    """What is in the pipe when the server has gone (its last words), for at most until deadline."""
    while time.monotonic() < deadline and select.select([0], [], [], 0.1)[0]:
        data = os.read(0, 65536)
        if not data:
            return
        _write(lines.feed(data))


def _write(lines):
    for line in lines:
        os.write(1, line)


def relay_stderr():
    """Send this process's stderr, and its children's, through the relay, when it is the journal's
    stream (systemd names it in JOURNAL_STREAM); if the relay cannot start, stderr stays as it is."""
    try:
        st = os.fstat(2)
    except OSError:
        return
    if os.environ.get("JOURNAL_STREAM") != "%d:%d" % (st.st_dev, st.st_ino):
        return
    try:
        read, write = os.pipe()
    except OSError:
        return
    try:  # no fork here (the server's interpreter may run threads already): the relay forks itself
        started = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--relay", str(os.getpid())],
                                   stdin=read, stdout=2, stderr=2, close_fds=True)
    except OSError:
        os.close(write)
        return
    finally:
        os.close(read)
    if started.wait() != 0:
        os.close(write)
        return
    sys.stderr.flush()
    os.dup2(write, 2)
    os.close(write)


class Scrubbed:
    """A stream that writes what it is given with the secrets replaced."""

    def __init__(self, stream, scrub):
        self._stream, self._scrub = stream, scrub

    def write(self, text):
        return self._stream.write(self._scrub(text))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main():
    if sys.argv[1:2] == ["--relay"]:
        return relay(int(sys.argv[2]))
    argv, secrets, extra = sys.argv[1:], [], []
    while argv[:1] == ["--secret"] and len(argv) >= 3:
        env, flag, argv = argv[1], argv[2], argv[3:]
        value = os.environ.pop(env, None)
        if not value:  # never start without the secret it was told to pass (an open server)
            sys.exit("launch.py: %s is not set (the unit's EnvironmentFile should set it)" % env)
        secrets.append(value)
        extra += [flag, value]
    if argv[:1] == ["--on-signal"] and len(argv) >= 3:
        signame, (var, _, value), argv = argv[1], argv[2].partition("="), argv[3:]
        signal.signal(getattr(signal, signame), lambda *_: os.environ.__setitem__(var, value))
    if not argv:
        sys.exit("usage: launch.py [--secret ENV_VAR --flag]... [--on-signal SIGNAME VAR=VALUE] MODULE ARGS...")
    if secrets:
        def scrub(text):
            for s in secrets:
                text = text.replace(s, "***")
            return text
        message = logging.LogRecord.getMessage
        logging.LogRecord.getMessage = lambda record: scrub(message(record))
        sys.stdout, sys.stderr = Scrubbed(sys.stdout, scrub), Scrubbed(sys.stderr, scrub)
    relay_stderr()  # the secrets are out of the environment it inherits
    module, args = argv[0], argv[1:]
    sys.argv = [module] + args + extra
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
