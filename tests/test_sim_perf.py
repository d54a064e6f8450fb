"""The simulator's performance model (sandbox/sglang_sim/sglang/sim_perf.py): both outcomes of
speculation happen, for the reasons they happen on a GPU.  No fleet needed."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sandbox" / "sglang_sim"))
from sglang.sim_perf import Model  # noqa: E402


def tok_s(model, running, n=256):
    """One request's decode tokens/s while `running` requests share the batch."""
    model.running = running
    seconds = tokens = 0
    for s, t in model.steps(n):
        seconds, tokens = seconds + s, tokens + t
    return tokens / seconds


@pytest.fixture
def knobs(monkeypatch):
    def set_(**values):
        for k, v in values.items():
            monkeypatch.setenv("SGLANG_SIM_" + k, str(v))
    return set_


def test_tok_s_per_request_falls_with_concurrency_and_the_total_still_rises(knobs):
    knobs(TOK_S=90)
    base = Model(None)
    assert tok_s(base, 1) == pytest.approx(90)
    assert tok_s(base, 8) < tok_s(base, 1) and 8 * tok_s(base, 8) > tok_s(base, 1)


def test_a_good_draft_pays_off_alone_and_less_so_in_a_big_batch(knobs):
    knobs(TOK_S=90, ACCEPT_LENGTH=3.2, DRAFT_COST=0.15)
    spec, base = Model("EAGLE3", 3, 4), Model(None)
    gain = {c: tok_s(spec, c) / tok_s(base, c) for c in (1, 8, 32)}
    assert gain[1] > 1.8 and gain[1] > gain[8] > gain[32], gain


def test_a_poor_draft_is_slower_than_none_the_54_8_against_90_case(knobs):
    knobs(TOK_S=90, ACCEPT_LENGTH=1.2, DRAFT_COST=0.3)
    spec = Model("EAGLE3", 3, 4)
    assert tok_s(spec, 1) == pytest.approx(54.8, rel=0.05)


def test_accepted_tokens_are_whole_and_average_to_the_accept_length(knobs):
    knobs(ACCEPT_LENGTH=2.5)
    steps = list(Model("EAGLE3", 3, 4).steps(100))
    assert all(isinstance(t, int) and t >= 1 for _, t in steps)
    assert sum(t for _, t in steps) == 100 and 100 / len(steps) == pytest.approx(2.5, rel=0.03)


def test_the_accept_length_sets_how_many_steps_not_how_long_each_takes(knobs):
    """What the regression gate's fleet test rests on (test_specbench_fleet.py): its releases differ
    only in accept length, so a request's 48 tokens take 15, 16 or 48 steps of one same duration,
    and the drops it gates (6% and 69%) are fixed by counts, whatever a loaded machine adds to a step."""
    knobs(TOK_S=100, DRAFT_COST=0.15)

    def steps(accept):
        knobs(ACCEPT_LENGTH=accept)
        return list(Model("EAGLE3", 3, 4).steps(48))
    runs = {a: steps(a) for a in (3.2, 3.0, 1.0)}
    assert {a: len(s) for a, s in runs.items()} == {3.2: 15, 3.0: 16, 1.0: 48}
    assert len({round(seconds, 12) for s in runs.values() for seconds, _ in s}) == 1


def test_the_accept_file_replaces_the_accept_rate_for_requests_that_start_after_it(knobs, tmp_path):
    """SGLANG_SIM_ACCEPT_FILE: read as a request starts; a request keeps the accept length it started
    with; a file that is gone, or holds no float, gives the knob back."""
    path = tmp_path / "accept_rate"
    knobs(ACCEPT_RATE=0.8, ACCEPT_FILE=path)
    model = Model("EAGLE3", 3, 4)
    knob = model.accept
    assert model.refresh_accept() == knob == pytest.approx((1 - 0.8 ** 4) / 0.2)
    running = model.steps(1000)
    next(running)  # started at the knob's accept length
    path.write_text("0.1\n")
    low = list(Model("EAGLE3", 3, 4).steps(200))
    assert model.refresh_accept() == pytest.approx((1 - 0.1 ** 4) / 0.9) and 200 / len(low) < 1.2
    assert 1000 / (1 + len(list(running))) > 2.5
    path.write_text("not a number")
    assert model.refresh_accept() == knob
    path.write_text("0.1")
    assert model.refresh_accept() < 1.2
    path.unlink()
    assert model.refresh_accept() == knob
    knobs(ACCEPT_LENGTH=2.5)  # a pinned accept length still wins
    path.write_text("0.1")
    assert Model("EAGLE3", 3, 4).refresh_accept() == 2.5
