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

Installed on each host by specops (it runs with the service's own interpreter).
"""
import logging
import os
import runpy
import signal
import sys


class Scrubbed:
    """A stream that writes what it is given with the secrets replaced."""

    def __init__(self, stream, scrub):
        self._stream, self._scrub = stream, scrub

    def write(self, text):
        return self._stream.write(self._scrub(text))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main():
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
    module, args = argv[0], argv[1:]
    sys.argv = [module] + args + extra
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
