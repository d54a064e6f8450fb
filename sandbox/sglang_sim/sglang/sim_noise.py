"""The simulator's noise at start: the factor a server's decode steps run at for its whole life,
drawn once as it starts (sim_perf.Model.speed divides every step's seconds by it).  Off unless
asked, so every test that asks nothing sees the performance model exactly.

Real servers are not equally fast from one start to the next (clocks, placement, a neighbour on
the box), and now and then one comes up markedly slow; a tuner that reads one measurement per
start must survive that.  Two knobs (the environment):

  SGLANG_SIM_NOISE        e.g. "jitter=0.03,slow=0.1,seed=7" (each optional; 0 by default): the
                          factor is gauss(1, jitter), times uniform(0.35, 0.6) with probability
                          `slow`, from random.Random seeded by seed, the speculative settings and
                          how many times this host started those settings before (a counter per
                          settings in SGLANG_SIM_NOISE_STARTS, default
                          /run/sglang-sim/noise_starts.json): successive starts draw differently,
                          and the n-th start of some settings draws the same in every run
  SGLANG_SIM_SLOW_FILE    a planted slow start, for a test that must know where the slow reading
                          falls (default /run/sglang-sim/slow.json): when present, a JSON list of
                          {"settings": [num_steps, eagle_topk, num_draft_tokens], "factor": 0.4,
                          "starts": 1}; a server that starts with those settings while the entry's
                          starts is above 0 runs at `factor`, and takes one off starts in the file
                          (so the first start of those settings is slow, the next normal)

Both factors multiply.  The files are read-modified-written under an flock of their directory
(two servers starting at once each take their own count), rewritten atomically (a temp file in
the same directory, then os.replace), and never through a symbolic link (O_NOFOLLOW): a link
there is refused (logged; the server runs at its normal speed, the link and its target left as
they are).  A planted start the server cannot take off the file is not applied either, so that
one entry can never slow more starts than it says.
"""
import contextlib
import errno
import fcntl
import json
import logging
import os
import random
import tempfile

STARTS_FILE = "/run/sglang-sim/noise_starts.json"
SLOW_FILE = "/run/sglang-sim/slow.json"
NOISE_KEYS = ("jitter", "slow", "seed")
log = logging.getLogger("sglang")


def start_speed(settings, env=None):
    """This start's factor for speculative `settings` ([num_steps, eagle_topk, num_draft_tokens],
    None without speculation): the drawn one times the planted one; 1.0 when neither is asked."""
    env = os.environ if env is None else env
    factor = drawn(settings, env.get("SGLANG_SIM_NOISE"), env.get("SGLANG_SIM_NOISE_STARTS", STARTS_FILE))
    factor *= planted(settings, env.get("SGLANG_SIM_SLOW_FILE", SLOW_FILE))
    if factor != 1.0:
        log.info("The sandbox's noise: this start runs at %.3f of the model's speed", factor)
    return factor


def parse_noise(text):
    """SGLANG_SIM_NOISE as {jitter, slow, seed}; ValueError names the setting it cannot read."""
    out = {"jitter": 0.0, "slow": 0.0, "seed": "0"}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        key, sep, value = (x.strip() for x in part.partition("="))
        try:
            if not sep or key not in NOISE_KEYS:
                raise ValueError
            out[key] = value if key == "seed" else float(value)
        except ValueError:
            raise ValueError("SGLANG_SIM_NOISE: %r is not one of jitter=NUMBER, slow=NUMBER, seed=TEXT"
                             % part) from None
    return out


def drawn(settings, noise, starts_file):
    """The random factor (module docstring); 1.0 when SGLANG_SIM_NOISE is unset."""
    if not noise:
        return 1.0
    knobs = parse_noise(noise)
    key = ",".join(map(str, settings)) if settings else "none"
    try:
        os.makedirs(os.path.dirname(starts_file) or ".", exist_ok=True)
        with _locked(starts_file):
            counts = _read(starts_file) or {}
            count = int(counts.get(key, 0))
            counts[key] = count + 1
            _write(starts_file, counts)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        # The draw still happens, as the first start's: noise that cannot be counted is noise still
        log.warning("%s: cannot count this start (%s); drawing as the first", starts_file, _why(e))
        count = 0
    rnd = random.Random("%s|%s|%d" % (knobs["seed"], key, count))
    factor = rnd.gauss(1.0, knobs["jitter"])
    if rnd.random() < knobs["slow"]:
        factor *= rnd.uniform(0.35, 0.6)
    return max(factor, 0.05)  # a wide jitter must not make a step take forever, or go back in time


def planted(settings, slow_file):
    """The planted factor for `settings` (module docstring), taken off the file; 1.0 when none."""
    if not settings:
        return 1.0
    try:
        os.lstat(slow_file)
    except OSError:  # nothing there, or nothing this server may see: every start says nothing of it
        return 1.0
    try:
        with _locked(slow_file):
            entries = _read(slow_file)
            for entry in entries or []:
                if [int(v) for v in entry["settings"]] == list(settings) and int(entry["starts"]) > 0:
                    entry["starts"] = int(entry["starts"]) - 1
                    factor = float(entry["factor"])
                    _write(slow_file, entries)
                    return factor
    except FileNotFoundError:  # gone meanwhile: nothing planted
        pass
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.error("%s: no planted slow start taken (%s)", slow_file, _why(e))
    return 1.0


def _why(e):
    if isinstance(e, OSError) and e.errno == errno.ELOOP:
        return "a symbolic link, not followed"
    return "%s: %s" % (type(e).__name__, e)


@contextlib.contextmanager
def _locked(path):
    # The directory's lock needs no write access of its own, and no file that could be a link.
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path):
    """The JSON in `path`, None when there is no such file; OSError (ELOOP) for a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        return json.load(f)


def _write(path, value):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # read by tests and people, never a secret
            json.dump(value, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
