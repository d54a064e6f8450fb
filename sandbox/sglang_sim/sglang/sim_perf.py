"""The simulator's performance model: how long each decode step of a request takes, with and
without speculative decoding, given how many requests are running at once, and how many tokens
a step yields for the speculative settings the server runs with.

Only the simulator has this module; real SGLang measures instead.  The shape follows what a GPU
and a draft do, so that tuning has a true optimum that moves with the load:

- a target decode step takes base(n) = (1 + BATCH_COST (n - 1)) / TOK_S seconds with n requests
  running (a bigger batch: tok/s per request falls, the total rises less than linearly);
- a speculative step is `num_steps` draft steps, DRAFT_COST base(n topk) each (the draft runs
  topk tokens of each request), plus one target step that verifies `num_draft_tokens` tokens:
  base(n) (1 + VERIFY_COST num_draft_tokens n)  (at a big batch the target is compute-bound, and
  every verified token is work);
- tokens per step (SGLang's accept length: completion tokens / verify steps, the bonus token
  included) follow Leviathan et al. (2023) for a chain of gamma drafted tokens each accepted
  with probability alpha:   L = (1 - alpha^(gamma + 1)) / (1 - alpha)
  where gamma = min(num_steps, num_draft_tokens - 1), the tree's depth.  A tree (topk > 1)
  spreads the draft tokens over w = min(topk, (num_draft_tokens - 1) / gamma) candidates per
  depth; a sibling is correlated with the first choice, so it counts TREE_GAIN of an
  independent try:   alpha_eff = 1 - (1 - alpha)^(1 + TREE_GAIN (w - 1)).
  A chain (topk 1, num_draft_tokens = num_steps + 1) has w = 1 and alpha_eff = alpha.

With alpha 0.8 and draft cost 0.15, speculation is ~2x faster alone and falls off with
concurrency, and more draft tokens pay alone but not at 32; with alpha 0.1 and draft cost 0.35
it is slower than no draft whatever the settings, and its accept length hardly moves (1.1 to
1.5): the 54.8 against 90 tok/s case, where the draft, not the settings, is the limit.

Knobs (environment): SGLANG_SIM_TOK_S (default 100), SGLANG_SIM_BATCH_COST (0.03),
SGLANG_SIM_ACCEPT_RATE (alpha, 0.8), SGLANG_SIM_TREE_GAIN (0.5), SGLANG_SIM_DRAFT_COST (0.15),
SGLANG_SIM_VERIFY_COST (0.01).  SGLANG_SIM_ACCEPT_LENGTH, when set, pins L whatever the settings
(tests that need an exact number of steps).

Alpha while the server runs: the file SGLANG_SIM_ACCEPT_FILE names (default
/run/sglang-sim/accept_rate), when it exists and holds a float, replaces SGLANG_SIM_ACCEPT_RATE
(clamped to [0, 1]); removing it (or writing something that is not a float) restores the knob.
Each request looks once, as it starts (steps()): a stat, and a read only when the file's mtime,
size or inode changed; a request keeps the L it started with.  It stands for traffic that moves
away from what the draft was trained on.  A pinned SGLANG_SIM_ACCEPT_LENGTH still wins, as it does
over the knob; steady_tok_s (the oracle) reads the knob, never the file.

Per draft: acceptance is a property of the draft's weights, so a draft's config.json may carry
"sim_accept_rate" and "sim_tree_gain" (keys only the simulator reads: real drafts have none, and
SGLang ignores unknown config keys); a server with that draft runs with them in place of
SGLANG_SIM_ACCEPT_RATE / SGLANG_SIM_TREE_GAIN (with_draft).  The accept file still wins over
both, and a pinned SGLANG_SIM_ACCEPT_LENGTH over all.  The oracle for such a draft is
steady_tok_s(with_draft(env, draft_config), concurrency, settings): the same env a test would
write by hand with SGLANG_SIM_ACCEPT_RATE / SGLANG_SIM_TREE_GAIN set to the draft's values.

Per prompt: how well a draft guesses depends on what it is asked (a draft trained on chat guesses
SQL badly), so SGLANG_SIM_FAMILY_ACCEPT (JSON {"word": alpha, ...}), or a draft's
"sim_family_accept_rate", gives the alpha of requests whose prompt holds that word (a family; the
first listed that matches wins; sim_tokens.py finds it in text or in token ids alike); other
requests run with the draft's alpha.  The accept file and a pinned length still win over it.  The
oracle for a family is steady_tok_s(family_env(env, word), ...).

Noise (opt-in, off by default, so the model above is exact unless a test asks): `speed`, the
factor this start's decode steps run at (sim_noise.py draws it: a jittered or slow start), divides
every step's seconds; and the first SGLANG_SIM_WARMUP_REQUESTS requests after the start (default 0)
each pay SGLANG_SIM_WARMUP_SECONDS (default 0.5) more before their first token, a JIT compile or
cache warm-up as a real server pays.  steady_tok_s knows neither: it is the noise-free optimum.
"""
import json
import os
import threading

ACCEPT_FILE = "/run/sglang-sim/accept_rate"
DRAFT_KNOBS = {"sim_accept_rate": "SGLANG_SIM_ACCEPT_RATE", "sim_tree_gain": "SGLANG_SIM_TREE_GAIN",
               "sim_family_accept_rate": "SGLANG_SIM_FAMILY_ACCEPT"}


def _knob(name, default, env=None):
    return float((os.environ if env is None else env).get("SGLANG_SIM_" + name, default))


def with_draft(env, draft_config):
    """`env` (SGLANG_SIM_* knobs) with the acceptance a draft's config.json carries in place of the
    knobs' (module docstring): what a server with that draft runs with, and the env that makes
    steady_tok_s the oracle for it."""
    out = dict(env)
    for key, knob in DRAFT_KNOBS.items():
        value = (draft_config or {}).get(key)
        if value is not None:
            out[knob] = json.dumps(value) if isinstance(value, dict) else str(float(value))
    return out


def families(env):
    """{word: alpha} of SGLANG_SIM_FAMILY_ACCEPT, in its order ({} when unset)."""
    return {str(k).lower(): float(v) for k, v in json.loads(env.get("SGLANG_SIM_FAMILY_ACCEPT") or "{}").items()}


def family_env(env, word):
    """`env` as a request of family `word` runs: its alpha in place of the draft's."""
    return dict(env, SGLANG_SIM_ACCEPT_RATE=str(families(env)[word]))


def accept_length(alpha, tree_gain, num_steps, topk, num_draft_tokens):
    """Mean tokens per verify step for these settings (the formula in the module's docstring)."""
    depth = max(1, min(num_steps, num_draft_tokens - 1))
    width = min(topk, max(1.0, (num_draft_tokens - 1) / depth))
    alpha = 1 - (1 - alpha) ** (1 + tree_gain * (width - 1))
    return depth + 1.0 if alpha >= 1 else (1 - alpha ** (depth + 1)) / (1 - alpha)


class Model:
    """One server's decode timing; `running` is kept by begin()/end() around each request."""

    def __init__(self, speculative, num_steps=None, num_draft_tokens=None, eagle_topk=None, env=None):
        env = os.environ if env is None else env  # with_draft's, for a draft that carries its acceptance
        self.speculative = bool(speculative)
        self.num_steps = int(num_steps or 3)
        self.num_draft_tokens = int(num_draft_tokens or (self.num_steps + 1))
        self.topk = int(eagle_topk or 1)
        self.tok_s = _knob("TOK_S", 100, env)
        self.batch_cost = _knob("BATCH_COST", 0.03, env)
        pinned = env.get("SGLANG_SIM_ACCEPT_LENGTH")
        self._pinned = max(1.0, float(pinned)) if pinned else None
        self._alpha = _knob("ACCEPT_RATE", 0.8, env)
        self._tree_gain = _knob("TREE_GAIN", 0.5, env)
        self._families = families(env)
        self.accept_file = env.get("SGLANG_SIM_ACCEPT_FILE", ACCEPT_FILE)
        self._file_seen = None  # (mtime_ns, size, inode) of the file last looked at; None: absent
        self.accept = self._accept_length(self._alpha)
        self.draft_cost = _knob("DRAFT_COST", 0.15, env)
        self.verify_cost = _knob("VERIFY_COST", 0.01, env)
        self.speed = 1.0  # this start's (sim_noise.py), set once the server has drawn it
        self._warmups = int(env.get("SGLANG_SIM_WARMUP_REQUESTS", "0"))
        self.warmup_seconds = _knob("WARMUP_SECONDS", 0.5, env)
        self.running = 0
        self._lock = threading.Lock()

    @property
    def settings(self):
        """[num_steps, eagle_topk, num_draft_tokens], as sim_noise's files name them; None without
        speculation."""
        return [self.num_steps, self.topk, self.num_draft_tokens] if self.speculative else None

    def _accept_length(self, alpha):
        if self._pinned is not None:
            return self._pinned
        return accept_length(alpha, self._tree_gain, self.num_steps, self.topk, self.num_draft_tokens)

    def accept_for(self, prompt):
        """The accept length of a request of `prompt` (text or token ids) starting now: the accept
        file's or the knob's (refresh_accept), or its family's when it has one and no file says."""
        accept = self.refresh_accept()
        if not self._families or self._file_seen is not None:
            return accept
        from sglang import sim_tokens  # the server's package (the oracle loads this file alone)
        word = sim_tokens.family(prompt, self._families)
        return accept if word is None else self._accept_length(self._families[word])

    def refresh_accept(self):
        """The accept length for a request starting now: follow the accept file (module docstring)."""
        try:
            st = os.stat(self.accept_file)
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            seen = None
        with self._lock:
            if seen != self._file_seen:
                self._file_seen = seen
                alpha = self._alpha
                if seen is not None:
                    try:
                        with open(self.accept_file) as f:
                            alpha = min(1.0, max(0.0, float(f.read().strip())))
                    except (OSError, ValueError):
                        pass
                self.accept = self._accept_length(alpha)
            return self.accept

    def begin(self):
        with self._lock:
            self.running += 1

    def take_warmup(self):
        """Extra seconds before a starting request's first token: the warm-up, for the first
        SGLANG_SIM_WARMUP_REQUESTS requests of this start only."""
        with self._lock:
            if self._warmups <= 0:
                return 0.0
            self._warmups -= 1
            return self.warmup_seconds

    def end(self):
        with self._lock:
            self.running -= 1

    def target_step(self, running):
        return (1.0 + self.batch_cost * max(running - 1, 0)) / self.tok_s

    def step(self, accept=None):
        """Seconds the next step takes now, and the tokens it yields on average (`accept`: the
        request's accept length, self.accept unless given)."""
        running = max(self.running, 1)
        base = self.target_step(running)
        if not self.speculative:
            return base / self.speed, 1.0
        verify = base * (1.0 + self.verify_cost * self.num_draft_tokens * running)
        draft = self.draft_cost * self.target_step(running * self.topk)  # the draft's batch: topk per request
        return (verify + self.num_steps * draft) / self.speed, self.accept if accept is None else accept

    def steps(self, max_new_tokens, prompt=""):
        """(seconds, tokens) per step until max_new_tokens: accepted tokens are whole, and they
        add up to the mean accept length (as the real counts do over a request), the one in force
        when the request starts (refresh_accept).  The first step carries the request's warm-up, if
        it pays one (take_warmup)."""
        made, owed = 0, 0.0
        accept = self.accept_for(prompt)
        extra = self.take_warmup()
        while made < max_new_tokens:
            seconds, mean = self.step(accept)
            owed += mean
            tokens = min(max(int(owed), 1), max_new_tokens - made)
            owed -= tokens
            made += tokens
            yield seconds + extra, tokens
            extra = 0.0


def steady_tok_s(env, concurrency, settings=None):
    """Output tok/s with `concurrency` requests decoding at once, for knobs `env` (SGLANG_SIM_*)
    and speculative `settings` (num_steps, eagle_topk, num_draft_tokens), or None without
    speculation: the model above in closed form, the oracle tests judge spec-tune by (for a draft
    that carries its own acceptance, give it with_draft(env, that draft's config))."""
    base = lambda n: (1.0 + _knob("BATCH_COST", 0.03, env) * (n - 1)) / _knob("TOK_S", 100, env)  # noqa: E731
    if settings is None:
        return concurrency / base(concurrency)
    steps, topk, draft = settings
    accept = accept_length(_knob("ACCEPT_RATE", 0.8, env), _knob("TREE_GAIN", 0.5, env), steps, topk, draft)
    step = base(concurrency) * (1.0 + _knob("VERIFY_COST", 0.01, env) * draft * concurrency) \
        + steps * _knob("DRAFT_COST", 0.15, env) * base(concurrency * topk)
    return concurrency * accept / step
