"""`inv spec-tune` on sandbox hosts, as the tune fleet tests run it: the inventory it tunes (with a
person's comments in the host's vars file), the run with its --json report, and the report's
tuning section as a browser renders it."""
import time

import yaml

from sandbox.provision import sandbox_service
from support.files import load_json

SPACE = {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4, 8], "num_draft_tokens": [2, 4, 8, 16]}
LOAD = ("--concurrency", "1", "--requests", "16", "--max-new-tokens", "48")
SPEC = "/var/lib/specops/releases/current/tune.json"


def write_inventory(sandbox, name, knobs, space=SPACE):
    """hosts.yml plus host_vars/NAME.yml holding the service, with comments of a person's."""
    inv = sandbox.inventory({name: {}})
    svc = sandbox_service(env=knobs, tune=space)
    text = yaml.safe_dump({"services": [svc]}, sort_keys=False)
    text = "# tuned by hand until now\n" + text.replace("num_steps: 3\n", "num_steps: 3  # the seeds' choice\n")
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{name}.yml").write_text(text)
    return inv


def tune(sandbox, name, inv, *args, timeout=900):
    report = sandbox.tmp / f"t{time.monotonic_ns()}.json"
    res = sandbox.inv("spec-tune", "--host", name, "--json", str(report), *LOAD, *args, inventory=inv, timeout=timeout)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def settings(spec):
    return spec["num_steps"], spec["eagle_topk"], spec["num_draft_tokens"]


def look_at_the_report(sandbox, inv, name, rec, drafts=0):
    """The report's tuning section as headless Chromium renders it (no network): a row per
    measured candidate with its speedups, the winner marked, every pruned combination listed;
    with `drafts`, that many rows side by side (the winner's marked) and a line each in the chart."""
    import subprocess
    from html.parser import HTMLParser
    page = sandbox.tmp / "report.html"
    res = sandbox.inv("report", "--host", name, "--out", str(page), inventory=inv)
    assert res.returncode == 0, res.stdout + res.stderr
    run = subprocess.run(["unshare", "--net", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "data-tune" in run.stdout, run.stderr[-2000:]

    class Read(HTMLParser):
        rows, winners, pruned, cells, where, drafts, draft_won, lines = [], [], 0, [], None, [], [], 0

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "table":
                self.where = "tune" if "data-tune" in a else "drafts" if "data-drafts" in a else None
            if tag == "tr" and self.where == "drafts":
                self.drafts.append([])
                if "data-winner" in a:
                    self.draft_won.append(len(self.drafts) - 1)
            if tag == "polyline":
                self.lines += 1
            if tag == "tr" and self.where == "tune":
                self.rows.append([])
                if "data-winner" in a:
                    self.winners.append(len(self.rows) - 1)
            if tag == "li" and self.where == "pruned":
                self.pruned += 1
            if tag == "ul" and "data-pruned" in a:
                self.where = "pruned"

        def handle_endtag(self, tag):
            if tag in ("table", "ul"):
                self.where = None

        def handle_data(self, data):
            if self.where == "tune" and self.rows and data.strip():
                self.rows[-1].append(data.strip())
            if self.where == "drafts" and self.drafts and data.strip():
                self.drafts[-1].append(data.strip())
    r = Read()
    r.feed(run.stdout)
    body = r.rows[1:]  # the header row first
    assert len(body) == len(rec["candidates"]) and r.pruned == len(rec["pruned"])
    for row, cand in zip(body, rec["candidates"]):
        assert row[0].startswith(cand["label"]) and row[2] == f"{cand['speedup']['1']:.2f}x"
    marked = [f"{c['label']} (winner)" for c in rec["candidates"]
              if c["settings"] == rec["winner"] and c["rung"] == "full" and c.get("draft") == rec.get("winner_draft")]
    assert marked and [body[i - 1][0] for i in r.winners] == marked
    if drafts:
        rows = r.drafts[1:]
        assert len(rows) == drafts and r.lines >= drafts, (r.drafts, r.lines)
        assert [rows[i - 1][0] for i in r.draft_won] == [f"{rec['winner_draft']} (winner)"]
