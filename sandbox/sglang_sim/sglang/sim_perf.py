"""The simulator's performance model: how long each decode step of a request takes, with and
without speculative decoding, given how many requests are running at once.

Only the simulator has this module; real SGLang measures instead.  The shape follows what a GPU
does, so both outcomes of speculation happen for real:

- a target decode step takes 1/TOK_S seconds for one running request, and BATCH_COST longer for
  each other running request (a bigger batch: tok/s per request falls with concurrency, the
  total rises less than linearly);
- with speculation, a step is `num_steps` draft steps (DRAFT_COST of a target step each) plus one
  target step that verifies `num_draft_tokens` tokens, which costs VERIFY_COST more per token
  and per running request (at a big batch the target is compute-bound, and verifying is work);
  each such step yields on average ACCEPT_LENGTH tokens (the bonus token included, as SGLang
  counts: completion tokens ÷ verify steps).

With a good draft (accept length 3.2, draft cost 0.15) speculation is ~2x faster alone and
falls off with concurrency; with a poor one (accept length 1.2, draft cost 0.3) it is ~0.6x as
fast even alone: the 54.8 against 90 tok/s case.

Knobs (environment): SGLANG_SIM_TOK_S (default 100), SGLANG_SIM_BATCH_COST (0.03),
SGLANG_SIM_ACCEPT_LENGTH (3.2), SGLANG_SIM_DRAFT_COST (0.15), SGLANG_SIM_VERIFY_COST (0.01).
"""
import os
import threading


def _knob(name, default):
    return float(os.environ.get("SGLANG_SIM_" + name, default))


class Model:
    """One server's decode timing; `running` is kept by begin()/end() around each request."""

    def __init__(self, speculative, num_steps=None, num_draft_tokens=None):
        self.speculative = bool(speculative)
        self.num_steps = int(num_steps or 3)
        self.num_draft_tokens = int(num_draft_tokens or (self.num_steps + 1))
        self.tok_s = _knob("TOK_S", 100)
        self.batch_cost = _knob("BATCH_COST", 0.03)
        self.accept = max(1.0, _knob("ACCEPT_LENGTH", 3.2))
        self.draft_cost = _knob("DRAFT_COST", 0.15)
        self.verify_cost = _knob("VERIFY_COST", 0.01)
        self.running = 0
        self._lock = threading.Lock()

    def begin(self):
        with self._lock:
            self.running += 1

    def end(self):
        with self._lock:
            self.running -= 1

    def target_step(self, running):
        return (1.0 + self.batch_cost * max(running - 1, 0)) / self.tok_s

    def step(self):
        """Seconds the next step takes now, and the tokens it yields on average."""
        running = max(self.running, 1)
        base = self.target_step(running)
        if not self.speculative:
            return base, 1.0
        verify = base * (1.0 + self.verify_cost * self.num_draft_tokens * running)
        return verify + self.num_steps * self.draft_cost * base, self.accept

    def steps(self, max_new_tokens):
        """(seconds, tokens) per step until max_new_tokens: accepted tokens are whole, and they
        add up to the mean accept length (as the real counts do over a request)."""
        made, owed = 0, 0.0
        while made < max_new_tokens:
            seconds, mean = self.step()
            owed += mean
            tokens = min(max(int(owed), 1), max_new_tokens - made)
            owed -= tokens
            made += tokens
            yield seconds, tokens
