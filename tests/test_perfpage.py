"""The report page reads what hosts recorded back before drawing it: a tampered perf.json or
manifest neither crashes `inv report` nor puts markup of its own into the page."""
from html.parser import HTMLParser

from specops.output import perfpage

# What the page itself draws; anything else in the output came from a host.
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "h4", "p", "section", "table",
             "tr", "th", "td", "ul", "li", "svg", "line", "text", "polyline", "circle", "rect"}
MARKUP = '<script>alert(1)</script><img src=x onerror=alert(2)>"'


class _Read(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.cells = set(), [], {}

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs += [k for k, _ in attrs]
        a = dict(attrs)
        if "data-tok-s" in a:
            self.cells[a["data-concurrency"]] = a["data-tok-s"]


def _page(releases, gate=None):
    text = perfpage.page([perfpage.service_section("t1", "sglang", releases, gate)])
    read = _Read()
    read.feed(text)
    assert read.tags <= PAGE_TAGS, read.tags - PAGE_TAGS
    assert not [a for a in read.attrs if a.startswith("on") or a in ("src", "href")]
    assert "<script" not in text.lower() and "<img" not in text.lower()
    return text, read


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
    text, read = _page(releases, {"min_speedup": 1.0, "at_concurrency": 8})
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
    text, read = _page(odd, {"min_speedup": 1.0})
    assert read.cells == {} and "data-refused" in text and "a spec level&#x27;s concurrency" in text



def test_the_agents_listing_passes_an_odd_record_on_instead_of_failing():
    from specops.agent.releases import _figures
    listed = _figures({"a": MARKUP, "b": {"spec": [{"raw": [1], "concurrency": 1}, "lv"], "baseline": None}})
    assert listed == {"a": MARKUP, "b": {"spec": [{"concurrency": 1}, "lv"], "baseline": []}}


def test_latencies_are_rounded_milliseconds_and_figures_rounded():
    """Issue 24 (a new user's rough edge): the ITL showed as 0.006669000000000001 (seconds)."""
    perf = {"service": "sglang", "at": "x", "verdict": "",
            "spec": [{"concurrency": 1, "figures": {"output_tok_s": 149.95, "accept_length": 3.2049,
                                                    "ttft_p50": 0.0421, "ttft_p99": 0.1, "itl_p50": 0.006669000000000001,
                                                    "itl_p99": 0.0125}}],
            "baseline": [{"concurrency": 1, "figures": {"output_tok_s": 90.04}}],
            "speedup": {"1": 1.6654}, "accept_length": {"1": 3.2049}}
    releases = [{"stamp": "20261203T160000Z", "status": "deployed", "current": True, "summary": "",
                 "perf": {"sglang": perf}}]
    text, _ = _page(releases)
    assert "<td>42.1 / 100.0</td><td>6.7 / 12.5</td>" in text and "(ms)</th>" in text
    assert ">90.0</td>" in text and ">3.20</td>" in text and "0.006669" not in text
