"""Every package install the agent makes, in one place: apt (protocol.AptInstall), a .deb the
controller pushed (protocol.DpkgInstall), a user's venv installed into
(protocol.PipInstall), a tool venv of specops's own (uv, the hub client: `tool_venv`), and the
environment both read their indexes from (`pip_env`, `as_env`).

An index URL may carry a password, and a command line is readable by every user of the host
(/proc/PID/cmdline): index options reach pip and uv only in their environment, never on their
command line (one limit: pip's build isolation, for a package that comes only as source, starts
a child pip with the indexes on its command line), and what root's own environment variables
say of indexes, requirements, constraints and install targets (for uv, of caches and Pythons
too) never reaches them; pip's config files do (root's choice on that host).  Requirements
follow `--`, so none is read as an option.  What they write is written with umask 022: root's
alone to change."""

import os
import re
import stat

from specops.agent import safefs
from specops.agent.host import ActionError, run_owned, run_streamed
from specops.layout import TOOLS_DIR

# pip's and uv's index options, as the environment variables each reads them from.
PIP_ENV = {"--index-url": "PIP_INDEX_URL", "--extra-index-url": "PIP_EXTRA_INDEX_URL",
           "--trusted-host": "PIP_TRUSTED_HOST", "--find-links": "PIP_FIND_LINKS", "--no-index": "PIP_NO_INDEX"}
# Of root's own pip variables, only these reach pip: how it connects (a proxy, a CA for a private
# index, timeouts) and its config and cache.  pip reads every long option from PIP_<NAME>: the
# others say where packages come from (its index options, --index-url's alias --pypi-url), which
# are installed (requirements, constraints, editables) or where they go (--target, --prefix, --user).
PIP_KEPT = {"PIP_PROXY", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_TIMEOUT", "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES",
            "PIP_CONFIG_FILE", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR"}
UV_ENV = {"--index": "UV_INDEX", "--default-index": "UV_DEFAULT_INDEX", "--find-links": "UV_FIND_LINKS",
          "--no-index": "UV_NO_INDEX"}
PIP = ["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
QUIET = ["-q"]  # a tool venv's install: its lines are not the user's concern


def as_env(args, names):
    """pip's or uv's index arguments as environment variables (several values: space-separated)."""
    env, i = {}, 0
    while i < len(args):
        name = names.get(args[i])
        if name is None:
            raise ActionError("not an index option: %s" % args[i])
        if args[i] == "--no-index":
            env[name], i = "1", i + 1
            continue
        env[name] = (env[name] + " " + args[i + 1]) if name in env else args[i + 1]
        i += 2
    return env


def clean_env(extra):
    """The environment for pip or uv: only what specops says of indexes and caches, no user
    config, and never a Python downloaded from the internet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(extra)
    return env


def pip_env(sources):
    """pip's environment: its indexes as specops says, of root's own pip variables only PIP_KEPT;
    its config (a proxy, a CA for a private index) and the rest of the environment kept."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PIP_") and k not in PIP_KEPT) and k != "VIRTUAL_ENV"}
    env.update(as_env(sources, PIP_ENV))
    return env


def pip_install(python, specs, sources, desc=None, quiet=False):
    """pip installs `specs` into the venv of `python`, its indexes in its environment."""
    umask = os.umask(0o022)
    try:
        run_streamed([python, "-I", *PIP, *(QUIET if quiet else []), "--", *specs],
                     desc or "pip install " + " ".join(specs), env=pip_env(sources))
    finally:
        os.umask(umask)


def install(a, allowed=()):
    """Answer a protocol.PipInstall (see there)."""
    pip_install(a.python, a.specs, a.sources, a.desc)


def apt_install(a, allowed=()):
    """Answer a protocol.AptInstall: the lists refreshed, then the packages (no pty for dpkg: its
    progress is not redrawn as a line per percent in the run's output)."""
    bad = [n for n in a.packages if not re.match(r"^[a-z0-9][a-z0-9+.-]+$", n)]  # ops/apt.py NAME
    if bad:
        raise ActionError("not a Debian package name: %r" % bad[0])
    run_streamed("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                 "--no-install-recommends -o Dpkg::Use-Pty=0 -- " + " ".join(a.packages), a.desc or "apt-get install")


def dpkg_install(a, allowed=()):
    """Answer a protocol.DpkgInstall.  The .deb is read through a descriptor opened without following
    a link (nor waiting on a FIFO), in a directory only root writes (the push's receiver made it so),
    and dpkg is given that same open file (/proc/self/fd): what was checked is what is installed.
    A failed install leaves the package as dpkg knew it before: purged when it had no record,
    removed (its conffiles kept) when it had one."""
    if not re.match(r"^[a-z0-9][a-z0-9+.-]+$", a.package):
        raise ActionError("not a Debian package name: %r" % a.package)
    fd = os.open(a.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        import hashlib  # a .deb's check: hashlib's OpenSSL is no probe's cost
        digest, st = hashlib.sha256(), os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_nlink != 1:
            raise ActionError("%s is not a file of root's alone" % a.path)
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            digest.update(block)
        if digest.hexdigest() != a.sha256:
            raise ActionError("%s is not the .deb the controller sent (sha256 %s, expected %s)"
                              % (a.path, digest.hexdigest()[:12], a.sha256[:12]))
        deb = "/proc/self/fd/%d" % fd
        _, named, err = run_owned(["dpkg-deb", "-f", deb, "Package"], pass_fds=(fd,))
        if named.strip() != a.package:
            raise ActionError("%s is %r, not %s" % (a.path, named.strip() or err.strip(), a.package))
        known = run_owned(["dpkg-query", "-W", a.package])[0] == 0
        try:
            # no prompt (a conffile of an earlier install is kept as it is)
            run_streamed(["dpkg", "--force-confdef", "--force-confold", "-i", deb], a.desc or "dpkg -i",
                         env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), pass_fds=(fd,))
        except ActionError as e:  # unmet Depends leave it unpacked, unconfigured: take it off again
            run_owned(["dpkg", "--remove" if known else "--purge", a.package])
            raise ActionError("%s; %s taken off again, as dpkg knew it before" % (e, a.package))
    finally:
        os.close(fd)
        try:
            os.unlink(a.path)
        except OSError:
            pass


def tool_venv(name, spec, sources):
    """A venv of specops's own under TOOLS_DIR (`name`), with `spec` installed, made once; its
    python.  Made whole before it is marked complete: an interrupted one is made again."""
    venv = os.path.join(TOOLS_DIR, name)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".complete")):
        umask = os.umask(0o022)
        try:
            safefs.make_dir(TOOLS_DIR, 0o755, 0, 0, parents=True)
            run_streamed(["python3", "-I", "-m", "venv", "--clear", venv], "tool venv " + venv)
            pip_install(python, [spec], sources, "install " + spec.replace("==", " "), quiet=True)
            open(os.path.join(venv, ".complete"), "w").close()
        finally:
            os.umask(umask)
    return python
