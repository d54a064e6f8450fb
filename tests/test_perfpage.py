"""The report page reads what hosts recorded back before drawing it: a tampered perf.json or
manifest neither crashes `inv report` nor puts markup of its own into the page."""
from html.parser import HTMLParser

from support.perfpage import MARKUP, checked_page


def test_figures_that_are_strings_are_shown_absent_and_named_never_injected():
    perf = {"service": "sglang", "at": MARKUP, "verdict": MARKUP,
            "spec": [{"concurrency": 1, "figures": {"output_tok_s": MARKUP, "accept_length": "1e3",
                                                    "ttft_p50": MARKUP, "ttft_p99": 0.2, "itl_p50": "1e3"}},
                     {"concurrency": 8, "figures": {"output_tok_s": 300.5, "accept_length": 2.9}}],
            "baseline": [{"concurrency": 1, "figures": {"output_tok_s": "1e3"}},
                         {"concurrency": 8, "figures": {"output_tok_s": 310.0}}],
            "speedup": {"1": MARKUP, "8": 0.969}, "accept_length": {"1": "1e3", "8": 2.9}}
    releases = [{"stamp": "20261203T160000Z", "status": "deployed", "current": True, "summary": MARKUP,
                 "perf": {"sglang": perf}}]
    text, read = checked_page(releases, {"min_speedup": 1.0, "at_concurrency": 8})
    assert read.cells == {"1": "", "8": "300.5"}  # the string is absent, not 1000 and not markup
    assert "1000" not in text and "data-speedup=\"0.969\"" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # the verdict and summary, as text
    assert "perf.json holds 7 figure(s) that are not numbers, shown as -: spec output_tok_s at 1, " \
           "spec accept_length at 1, spec ttft_p50 at 1, spec itl_p50 at 1, baseline output_tok_s at 1 " \
           "and 2 more." in text
    assert text.count("<svg") == 3  # tok/s lines, accept length and speedup bars at 8


def test_a_record_of_the_wrong_shape_is_left_out_not_a_crash():
    odd = [
        "not a release",
        {"stamp": MARKUP, "status": ["x"], "current": "yes", "perf": "x"},
        {"stamp": "s2", "current": True, "perf": {"sglang": {"spec": [{"concurrency": MARKUP, "figures": {}},
                                                                      {"concurrency": 1.5}, "lv", None],
                                                             "speedup": [1], "baseline": {"a": 1}}},
         "verified": [{"name": "sglang", "checks": MARKUP, "generate": "x"}, "y"],
         "verify": [{"name": "sglang", "intended": [MARKUP]}]},
        {"stamp": "s3", "perf": {"sglang": {"spec": [{"concurrency": True, "figures": {"output_tok_s": 1e400}},
                                                     {"concurrency": 10 ** 400, "figures": {}}]}}},
    ]
    text, read = checked_page(odd, {"min_speedup": 1.0})
    assert read.cells == {} and "data-refused" in text and "a spec level&#x27;s concurrency" in text


def test_host_text_in_two_measured_releases_loads_and_stamps_is_escaped_and_a_tiny_figure_draws():
    """What the charts and the loads note show comes from the hosts too (review of issue 24: with
    the escaping removed there, every other test stayed green; 5e-324 crashed the axis)."""
    def measured(stamp, load, accept):
        perf = {"service": "sglang", "load": load, "accept_length": {"1": accept}, "speedup": {"1": 1.2},
                "spec": [{"concurrency": 1, "figures": {"output_tok_s": 100.0, "accept_length": accept}}]}
        return {"stamp": stamp, "status": "deployed", "perf": {"sglang": perf}}
    releases = [measured("20261203T160000Z" + MARKUP, {"requests": MARKUP, MARKUP: 1}, 5e-324),
                {**measured(MARKUP + "20261204T160000Z", {"requests": 64}, 1e-300), "current": True}]
    text, read = checked_page(releases, {"min_speedup": 1.0})
    assert "data-loads-differ" in text and text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
    from specops.output.charts import ticks
    assert ticks(5e-324) == [0.0, 1.0] and ticks(2.5) == [0, 1, 2, 3]


def test_the_agents_listing_passes_an_odd_record_on_instead_of_failing():
    from specops.agent.releases import _figures
    listed = _figures({"a": MARKUP, "b": {"spec": [{"raw": [1], "concurrency": 1}, "lv"], "baseline": None}})
    assert listed == {"a": MARKUP, "b": {"spec": [{"concurrency": 1}, "lv"], "baseline": []}}


def test_latencies_are_rounded_milliseconds_and_figures_rounded():
    """Issue 24 (a new user's rough edge): the ITL showed as 0.006669000000000001 (seconds)."""
    perf = {"service": "sglang", "at": "x", "verdict": "",
            "spec": [{"concurrency": 1, "figures": {"output_tok_s": 149.95, "accept_length": 3.2049,
                                                    "ttft_p50": 0.0421, "ttft_p99": 0.1,
                                                    "itl_p50": 0.006669000000000001, "itl_p99": 0.0125}}],
            "baseline": [{"concurrency": 1, "figures": {"output_tok_s": 90.04}}],
            "speedup": {"1": 1.6654}, "accept_length": {"1": 3.2049}}
    releases = [{"stamp": "20261203T160000Z", "status": "deployed", "current": True, "summary": "",
                 "perf": {"sglang": perf}}]
    text, _ = checked_page(releases)
    assert "<td>42.1 / 100.0</td><td>6.7 / 12.5</td>" in text and "(ms)</th>" in text
    assert ">90.0</td>" in text and ">3.20</td>" in text and "0.006669" not in text


class _Axes(HTMLParser):
    """Each chart's tick labels, by axis, and its texts (axis titles among them)."""

    def __init__(self):
        super().__init__()
        self.charts, self._axis = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "svg":
            self.charts.append({"x": [], "y": [], "texts": []})
        self._axis = dict(attrs).get("data-axis", "") if tag == "text" else None

    def handle_data(self, data):
        if self._axis is not None and self.charts:
            self.charts[-1][self._axis or "texts"].append(data)
            self._axis = None


def _lv(c, tok_s, base, accept):
    return {"concurrency": c, "figures": {"output_tok_s": tok_s, "accept_length": accept}}, \
        {"concurrency": c, "figures": {"output_tok_s": base}}


def _record(levels, load=None, verdict="v"):
    spec, base = zip(*[_lv(*lv) for lv in levels])
    return {"service": "sglang", "at": "t", "verdict": verdict, "spec": list(spec), "baseline": list(base),
            "speedup": {str(c): round(t / b, 3) for c, t, b, _ in levels},
            "accept_length": {str(c): a for c, _, _, a in levels}, **({"load": load} if load else {})}


LOAD = {"concurrency": [1, 8, 32], "requests": 64, "warmup": 4, "max_new_tokens": 128, "seed": 0,
        "prompts": "files/prompts.json", "prompts_sha256": "ab12"}


def test_the_charts_have_axis_ticks_with_values_and_units():
    """Issue 24 (a new user's rough edge): the charts had no ticks (two bare numbers on the tok/s
    axis, none on the bars') and no units.  Fixed figures, so the ticks are known: tok/s up to
    800 → 0..800 by 200; accept length up to 3.1 → 0..4 by 1; speedup up to 1.333 → 0..1.5 by 0.5."""
    perf = _record([(1, 120.0, 90.0, 3.1), (8, 300.5, 310.0, 2.9), (32, 610.0, 800.0, 2.7)], LOAD)
    releases = [{"stamp": "20261203T150000Z", "status": "deployed", "current": True, "perf": {"sglang": perf}}]
    text, _ = checked_page(releases, {"min_speedup": 1.0})
    axes = _Axes()
    axes.feed(text)
    tok_s, accept, speedup = axes.charts
    assert tok_s["y"] == ["0", "200", "400", "600", "800"] and tok_s["x"] == ["1", "8", "32"]
    assert "output (tok/s)" in tok_s["texts"] and "concurrency (requests in flight)" in tok_s["texts"]
    assert accept["y"] == ["0", "1", "2", "3", "4"] and accept["x"] == ["12-03 15:00"]
    assert "accept length (tokens per step)" in accept["texts"] and "release (UTC)" in accept["texts"]
    assert speedup["y"] == ["0", "0.5", "1", "1.5"] and "speedup (× baseline tok/s)" in speedup["texts"]
    assert "1.33x" in speedup["texts"] and "gate 1.0" in speedup["texts"]


def test_a_rolled_back_release_shows_its_figures_marked_and_other_loads_are_said():
    """Issue 24: a rolled-back release that was measured is shown, marked, in the table and as an
    outlined bar; releases measured with different loads (here max_new_tokens and requests) are
    said to be not like for like, next to the per-release charts; the same loads say nothing."""
    other = dict(LOAD, requests=12, max_new_tokens=48)
    releases = [
        {"stamp": "20261203T150000Z", "status": "deployed", "perf": {"sglang": _record([(1, 120.0, 90.0, 3.1)], LOAD)}},
        {"stamp": "20261204T090000Z", "status": "rolled-back", "perf": {"sglang": _record(
            [(1, 54.8, 90.0, 1.2)], other, "speculative decoding: 0.61x at concurrency 1")}},
        {"stamp": "20261205T100000Z", "status": "deployed", "current": True,
         "perf": {"sglang": _record([(1, 131.0, 90.0, 3.3)], other)}}]
    text, _ = checked_page(releases, {"min_accept_length": 2.0})
    assert "<td data-rolled-back>speculative decoding: 0.61x at concurrency 1 (measured, then rolled back)</td>" in text
    axes = _Axes()
    axes.feed(text)
    accept = axes.charts[1]
    assert accept["x"] == ["12-03 15:00", "12-04 09:00", "12-05 10:00"] and accept["texts"].count("rolled back") == 1
    assert text.count('fill="#fff"') == 2  # the rolled-back bar in outline, in both per-release charts
    assert "<p data-loads-differ>Not like for like: the releases in the charts below were measured with different " \
           "loads (max_new_tokens 128 in 12-03 15:00, 48 in 12-04 09:00 and 12-05 10:00; requests 64 in 12-03 " \
           "15:00, 12 in 12-04 09:00 and 12-05 10:00).</p>" in text
    same = [dict(r, perf={"sglang": dict(r["perf"]["sglang"], load=LOAD)}) for r in releases]
    assert "data-loads-differ" not in checked_page(same)[0]


def test_release_labels_read_as_dates_to_the_second_when_two_share_a_minute():
    """Stamps are layout.new_stamp()'s, to the microsecond ("20261205T165418.893910Z", as the
    fleet's are): read as "12-05 16:54", with seconds when two releases fall in one minute."""
    from specops.output.charts import bar_chart
    axes = _Axes()
    axes.feed(bar_chart("t", [("20261205T165418.893910Z", 3.0, ""), ("20261205T175446.079560Z", 2.0, "")], "y"))
    axes.feed(bar_chart("t", [("20261205T165418.893910Z", 3.0, ""), ("20261205T165446.079560Z", 2.0, "")], "y"))
    assert [c["x"] for c in axes.charts] == [["12-05 16:54", "12-05 17:54"], ["12-05 16:54:18", "12-05 16:54:46"]]
    releases = [{"stamp": stamp, "status": "deployed", "perf": {"sglang": _record([(1, 120.0, 90.0, 3.1)], load)}}
                for stamp, load in (("20261205T165418.893910Z", LOAD), ("20261205T165446.079560Z", dict(LOAD, seed=1)))]
    assert "(seed 0 in 12-05 16:54:18, 1 in 12-05 16:54:46)" in checked_page(releases)[0]  # the words read as the bars
