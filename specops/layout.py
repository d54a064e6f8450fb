"""Where specops keeps things on a host, and the defaults both sides assume.

Imported by the controller and by the agent (it travels in the agent's zip), so each
of these facts has exactly one definition.  Standard library only; Python 3.8+.
"""
import time

# The host lock: mkdir is atomic, so whoever creates the directory holds it.
LOCK_DIR = "/run/specops.lock"
LOCK_HOLDER = LOCK_DIR + "/holder.json"
LOCK_GUARD = "/run/specops.lock.guard"  # flock'd around every read-modify-write of the lock
LOCK_LEASE = 120.0  # seconds a lock stays held without a request of its run (the run renews it)
# Every command the agent starts holds a shared flock on this file (an fd it inherits) for as long
# as it lives: the lock is given back, or taken over, only once none is left.
CHILDREN_LOCK = "/run/specops.children"
CHILD_GRACE = 5.0   # seconds a stopped command has between SIGTERM and SIGKILL

# specops's own records on the host.
HOME = "/var/lib/specops"
STATE_FILE = HOME + "/state.json"          # bytecode purges and units' past invocations
UNIT_FACTS = HOME + "/units.json"          # each unit's last systemctl show, while it holds (unitkeep)
RELEASES = HOME + "/releases"              # <stamp>/{manifest.json, files/, previous/}; current → newest
RELEASES_KEPT = 5


def new_stamp() -> str:
    """A release's name, given by the controller before it changes anything: UTC, sortable,
    unique to the microsecond (tests deploy twice within a second)."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + ".%06dZ" % int(now % 1 * 1e6)


def release_dir(stamp: str) -> str:
    return RELEASES + "/" + stamp


AGENT_HOME = HOME + "/agent"               # the agent's zip, cached by its sha256
VENV_CACHE = HOME + "/venvs.json"          # what each venv's interpreter said, while its dirs are unchanged

# Where a batch writes before it renames: a new directory specops creates beside the target
# (same filesystem, so the rename is atomic), named with this prefix and a random suffix.
STAGE_PREFIX = ".specops-stage-"
# systemd-analyze verify of the unit alone, not of everything it pulls in (a third of the CPU),
# failing on its warnings too.  systemd older than 250 does not know it: the agent then
# verifies without it.
UNIT_ONLY = "--recursive-errors=no"
WEIGHTS_DIR = HOME + "/weights"            # a manifest per weights directory specops fetched
TOOLS_DIR = HOME + "/tools"                # venvs of the tools specops runs on the host (hf-<pin>)
PEER_DIR = HOME + "/peer"                  # <id>/: the key of a copy from a peer, while it runs
HF_PIN = "2.4.0"                           # the huggingface_hub that fetches weights
APPLY_JOURNAL = HOME + "/apply.json"       # a switch's progress while it changes things (kept if cut off)
# Faults on request (the sandbox's fault tests): an action kind the next batch fails at, or dies at.
# In /run, which only root can write, and read only when root's own regular file.
FAULTS = "/run/specops-faults.json"

# Python stacks: one immutable venv per distinct stack (interpreter, torch and its CUDA variant,
# fla, sglang, the other pins), named by the hash of what defines it, built by uv beside the one
# that serves.  A release names the stack it runs; rollback points the unit back at an older one.
STACKS_DIR = "/opt/specops/venvs"          # <hash>/ (a stack), .build-<hash>-<random>/ (one being built)
STACK_FILE = "specops-stack.json"          # inside a stack: what defines it, written last
UV_PIN = "0.13.9"                          # the uv that builds stacks (TOOLS_DIR/uv-<pin>)
UV_CACHE = "/opt/specops/uv-cache"         # uv's cache: stacks hard-link their files from it (so: one filesystem)


def stack_disk_refusal(stack: str, need: int, free: int) -> str:
    """A stack the disk cannot hold, said the same at plan time and on the host before the build."""
    return "building the stack %s needs %.1f GiB free on %s; %.1f GiB free: nothing was changed" % (
        stack, need / 2**30, STACKS_DIR, free / 2**30)
# A patched file's upstream content, kept by the sha256 its package's RECORD gives it (hex), so a
# diff patch can be applied again to the file it was cut against once the installed one is patched.
UPSTREAM_DIR = HOME + "/upstream"
TRAFFIC_DIR = HOME + "/traffic"  # root's, 0700: <service>.<random>/ while a traffic sample is taken and used
DEBS_DIR = HOME + "/debs"  # a .deb the controller pushed, there until dpkg has installed it

# Services.
UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/specops"                   # <service>.env, mode 0600: the secrets
API_KEY_ENV = "SGLANG_SPECOPS_API_KEY"     # the env-file key that holds a service's API key
ADMIN_API_KEY_ENV = "SGLANG_SPECOPS_ADMIN_API_KEY"  # ... and its admin key (SGLang's --admin-api-key)
# service key → (env-file variable, the server's flag): the secrets the launcher hands a server
# in-process, never on its command line
SECRET_FLAGS = {"api_key": (API_KEY_ENV, "--api-key"), "admin_api_key": (ADMIN_API_KEY_ENV, "--admin-api-key")}
LAUNCHER = "/usr/local/lib/specops/launch.py"  # runs a service's module with its secret flags off argv
BASELINE_PREFIX = "specops-baseline-"      # spec-bench's transient unit: <prefix><service>
WINDOW_PREFIX = "specops-window-"          # a GPU window's job runs in the scope <prefix><16 hex digits>
WINDOW_STOP_SEC = 5                        # the job's SIGTERM grace when its window ends
DEFAULT_VENV = "/opt/sglang/venv"


def venv_python(venv: str) -> str:
    """The interpreter of a venv (a stack's, the router's, a user's)."""
    return f"{venv}/bin/python"


# Monitoring: node_exporter's textfile collector reads TEXTFILE_DIR (Debian's default for its
# prometheus-node-exporter); the timer that refreshes specops's file there runs the agent from
# TEXTFILE_AGENT (the agent's zip, as the monitoring role installs it).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE_NAME = "specops.prom"
TEXTFILE_AGENT = "/usr/local/lib/specops/agent.pyz"
NODE_EXPORTER_PORT = 9100  # prometheus-node-exporter's default --web.listen-address
VERDICTS = HOME + "/verdicts.json"         # each service's last verify: passed or not, and when
DEFAULT_PORT = 30000

# Package paths resolved on the host by a venv's own interpreter: pkg:<venv>:<package>/<path>.
PKG_PREFIX = "pkg:"


def unit_path(name: str) -> str:
    return "%s/%s.service" % (UNIT_DIR, name)


def env_file(name: str) -> str:
    return "%s/%s.env" % (ENV_DIR, name)


def pkg_key(venv: str, rel: str) -> str:
    """A path inside an installed package, resolved on the host by the venv's interpreter."""
    return "%s%s:%s" % (PKG_PREFIX, venv, rel)


def split_pkg_key(key: str):
    """pkg:<venv>:<package>/<inner> → (venv, package, inner)."""
    _, venv, rel = key.split(":", 2)
    package, _, inner = rel.partition("/")
    return venv, package, inner


PYCACHE = "__pycache__"
CHECKED_HASH = (3).to_bytes(4, "little")  # PEP 552 .pyc flags: hash-based, checked on every import
# A validator that compiled a module says so on its stdout, one line per file:
# BYTECODE_LINE + JSON [staged path, sha256 of the source it read, .pyc name, base64 .pyc].
BYTECODE_LINE = "specops-pyc "


def is_bytecode_of(filename: str, module: str) -> bool:
    """<module>.<tag>[.opt-N].pyc: every interpreter tag and optimisation level."""
    return filename.startswith(module + ".") and filename.endswith(".pyc") \
        and filename[len(module) + 1:].count(".") >= 1


def restart_stamp_is_stale(started, changes) -> bool:
    """The stale-code rule: a service runs old code when it started before the newest change
    (a managed file's mtime, or a bytecode purge) among `changes` [(time, what)]."""
    newest = max(changes, default=None)
    return bool(started and newest and newest[0] > started)
