"""spec-tune's pure parts as the tuning tests drive them: a service and its host's vars file (with
a person's comments), and the record of a search whose window already ran, from made-up
measurements.  No fleet."""
from specops.sglang import climb, tuning
from specops.sglang.tuning import Settings

DRAFT = "/models/d"
SVC = {"name": "sglang", "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/d",
                                         "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}
ISSUE_SPACE = {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4, 8], "num_draft_tokens": [2, 4, 8, 16]}
HOST_VARS = """\
# t1: the box under the stairs
services:
  - name: sglang   # the one service
    model_path: /models/tiny-llama
    speculative:
      algorithm: EAGLE3
      draft_model_path: /models/tiny-llama-eagle3
      num_steps: 3      # tuned by hand, 2026-11
      eagle_topk: 1
      num_draft_tokens: 4
    port: 30000
"""


class QuietRun:
    """A host's run as the search sees it: host t1, and nothing said."""

    class host:
        name = "t1"

    def say(self, text):
        pass


def bench_level(c, tok_s, accept=None):
    from specops import protocol
    return protocol.BenchLevel(concurrency=c, figures={"output_tok_s": tok_s, "accept_length": accept, "failed": 0})


def search_record(measured, base_tok_s=100.0, now=Settings(3, 1, 4), min_speedup=1.0, again=None):
    """A Search whose window already ran: `measured` is [(settings, rung, tok/s, accept)] of the
    service's own draft; `again` the baseline's tok/s at the end (default: as at the start)."""
    from specops.flows import specbench
    from specops.flows.tuning_record import record
    from specops.flows.tuning_search import Search
    space = tuning.prune(SVC, tuning.asked_space(SVC, ISSUE_SPACE))
    s = Search(QuietRun(), SVC, space, tuning.Objective(at=1, min_speedup=min_speedup), specbench.Load(),
               specbench.Load(), 20, [DRAFT])
    s.base, s.base_again = [bench_level(1, base_tok_s)], [bench_level(1, again or base_tok_s)]
    s.climbs[DRAFT], s.finals[DRAFT] = climb.Climb(), {}
    for st, rung, tok_s, accept in measured:
        s.measured.append({"draft": DRAFT, "settings": st, "rung": rung, "levels": [bench_level(1, tok_s, accept)],
                           "score": tok_s, "out": None})
        if rung == "short":
            s.climbs[DRAFT].scores[st] = tok_s
        else:
            s.finals[DRAFT][st] = tok_s
    return record(s, now)


def host_vars_file(tmp_path, name, text=HOST_VARS):
    (tmp_path / "host_vars").mkdir(exist_ok=True)
    path = tmp_path / "host_vars" / f"{name}.yml"
    path.write_text(text)
    return path


NOISE_SPACE = {"num_steps": [1, 3, 5], "eagle_topk": [1, 4], "num_draft_tokens": [4, 16]}


def space():
    """The candidates of NOISE_SPACE, the noise and climb tests' small grid."""
    return tuning.prune(SVC, tuning.asked_space(SVC, NOISE_SPACE)).candidates


def reader(truth, slow):
    """Readings of `truth`; the first reading of each settings in `slow` at 0.4 of it."""
    seen = []

    def read(s):
        seen.append(s)
        return truth[s] * (0.4 if s in slow and seen.count(s) == 1 else 1.0)
    return read, seen
