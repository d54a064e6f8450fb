"""The climb's search on a small grid (specops/sglang/climb.py): a reading judged against its best
measured neighbour, and a small space swept when the climb stops.  No fleet."""
from specops.sglang import climb
from specops.sglang.tuning import Settings
from support.tuning import reader as _reader, space as _space


def test_a_small_space_is_swept_when_the_climb_stops_and_what_is_left_fits_its_restarts():
    """Seen on the fleet: a jittery reading left (5, 1, 6) under the start, the climb stepped
    sideways the other way and stopped, and the optimum two tokens values away was never read."""
    cands = _space()
    truth = {Settings(3, 1, 4): 400, Settings(3, 4, 4): 394, Settings(5, 1, 6): 390, Settings(1, 1, 2): 300,
             Settings(1, 4, 4): 320, Settings(5, 4, 4): 310, Settings(3, 4, 16): 470, Settings(5, 4, 16): 550}
    assert set(truth) == set(cands)
    stuck = climb.climb(cands, truth.get, Settings(3, 1, 4), budget=8)
    assert Settings(5, 4, 16) not in stuck.scores and not stuck.budget_spent  # the climb alone misses it
    c, finals = climb.search(cands, truth.get, truth.get, Settings(3, 1, 4), 12)
    assert set(c.scores) == set(cands) and climb.winner_of(c, finals) == Settings(5, 4, 16)


def test_a_slow_reading_beside_a_slow_neighbour_is_measured_again_against_its_best_neighbour():
    """Issue 49 (protective line 11): a reading is judged against its best measured neighbour, not
    its worst.  (1, 1, 2) reads slow once (80 for 200) when its neighbours (3, 1, 4) at 200 and
    (3, 4, 4), truly slow at 60, are both measured: against 200 it is an outlier and measured again;
    against 60 it would stand at 80 and drop a setting as good as the best."""
    cands = _space()
    start, slow_neighbour, c = Settings(3, 1, 4), Settings(3, 4, 4), Settings(1, 1, 2)
    assert {start, slow_neighbour} <= set(climb.neighbours(c, cands))
    truth = {s: 60.0 if s == slow_neighbour else 200.0 for s in cands}
    read, seen = _reader(truth, {c})
    out = climb.climb(cands, read, start, budget=100)
    assert seen[:3] == [start, slow_neighbour, slow_neighbour]  # both neighbours read before c is
    assert seen[3] == c and seen.count(c) == 2 and out.scores[c] == 200.0
    assert [a for a in out.again if a[0] == c] == [[c, 80.0, 200.0]]
