"""The gate on what spec-bench measured (specops/flows/gate.py): the 0.61x case refused naming its
figures, a release compared with the previous one, the figures that passed it named, a bench with
no level.  No fleet."""
from support.perf import speed


def test_the_gate_refuses_the_0_61x_case_naming_the_figures():
    from specops.flows.gate import evaluate
    (why,) = evaluate({"min_speedup": 1.0}, speed(54.8, 90.0), None)
    assert why == "speedup 0.61x at concurrency 1 (54.8 tok/s with speculation, 90.0 without) is below min_speedup 1.0"
    assert evaluate({"min_speedup": 1.0}, speed(120.0, 90.0), None) == []
    assert evaluate({"min_speedup": 1.0}, speed(120.0), None) == ["min_speedup needs a baseline at concurrency 1, "
                                                                  "and there is none"]


def test_the_gate_compares_with_the_previous_release():
    from specops.flows.gate import evaluate
    gate = {"max_regression_pct": 10}
    (why,) = evaluate(gate, speed(80.0), speed(100.0))
    assert why == "80.0 tok/s at concurrency 1 is 20% below the previous release's 100.0 (max_regression_pct 10)"
    assert evaluate(gate, speed(95.0), speed(100.0)) == []  # 5% slower: kept
    assert evaluate(gate, speed(90.0), speed(100.0)) == []  # 10%: at the bound, kept
    assert len(evaluate(gate, speed(89.9), speed(100.0))) == 1  # past it
    assert evaluate(gate, speed(130.0), speed(100.0)) == []  # faster: kept
    assert evaluate(gate, speed(80.0), None) == []           # nothing to compare with
    assert evaluate({"min_accept_length": 2.0}, speed(100.0, accept=1.5), None) == [
        "accept length 1.5 at concurrency 1 is below min_accept_length 2.0"]


def test_a_passing_gate_names_the_figures_that_passed_it():
    """Issue 24 (a new user's rough edge): `deploy --bench` said nothing of a gate that passed."""
    from specops.flows.gate import checks
    gate = {"min_speedup": 1.0, "min_accept_length": 2.0, "max_regression_pct": 10}
    assert checks(gate, speed(120.0, 90.0, accept=3.0), speed(100.0)) == [
        (True, "speedup 1.33x at concurrency 1 (120.0 tok/s with speculation, 90.0 without) meets min_speedup 1.0"),
        (True, "accept length 3.0 at concurrency 1 meets min_accept_length 2.0"),
        (True, "120.0 tok/s at concurrency 1 is 20% above the previous release's 100.0 (max_regression_pct 10)")]
    assert checks({"max_regression_pct": 10}, speed(95.0), None) == [
        (True, "max_regression_pct 10 not checked: no earlier record at concurrency 1")]
    assert checks({"max_regression_pct": 10}, {**speed(50.0), "load": {"requests": 8}}, speed(100.0)) == [
        (True, "max_regression_pct 10 not checked: the previous record ran another load")]


def test_the_gate_names_a_bench_with_no_level():
    from specops.flows.gate import evaluate
    assert evaluate({"min_speedup": 1.0}, {"spec": []}, None) == ["the bench measured no level"]
