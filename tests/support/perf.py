"""A release's perf record (perf.json) as spec-bench writes it, for the tests of what reads one:
the gate (test_specbench_gate.py), the releases compared and listed (test_specbench_releases.py),
the report page (test_specbench.py)."""


def speed(tok_s, base=None, accept=3.0, c=1):
    lv = lambda t, a=None: {"concurrency": c, "figures": {"output_tok_s": t, **({"accept_length": a} if a else {})}}
    return {"service": "sglang", "spec": [lv(tok_s, accept)], "baseline": [lv(base)] if base else [],
            "speedup": {str(c): round(tok_s / base, 3)} if base else {}}
