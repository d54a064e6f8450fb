"""The report page (specops/output/perfpage.py) as the tests read it: drawn for one service's
releases, and checked to hold no tag or attribute but those the page itself draws."""
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


def checked_page(releases, gate=None):
    """The page drawn for t1's releases of sglang, checked to hold no markup but its own: (its text,
    the parser that read it: its tags, attributes and tok/s cells)."""
    text = perfpage.page([perfpage.service_section("t1", "sglang", releases, gate)])
    read = _Read()
    read.feed(text)
    assert read.tags <= PAGE_TAGS, read.tags - PAGE_TAGS
    assert not [a for a in read.attrs if a.startswith("on") or a in ("src", "href")]
    assert "<script" not in text.lower() and "<img" not in text.lower()
    return text, read
