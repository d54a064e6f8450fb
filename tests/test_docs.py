"""The README and docs/ point at things that exist: every relative link resolves to a file of the
repository (and its #fragment to a heading of the target, by GitHub's anchor rules), and every
path of the tree written in code (`specops/flows/rolling.py`, `roles/`, `agent/converge/stage.py`
for specops/agent/converge/stage.py) names a file or folder that is there, and a module named
alone (`parts.py`) a file of the tree.  docs/inventory.md names every key of the inventory's
vocabulary.  No fleet needed."""
import os
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Folders of the tree a path written in the docs starts with.
TOP = ("specops", "roles", "tests", "sandbox", "scripts", "bench", "files", "inventory.example", "inventory",
       "docs", ".ci")
# Where a path in the docs is read from: the root; the package (`agent/converge/stage.py`); the
# patch folder (a patch is named by its path inside the sglang package, `srt/models/llama.py`).
BASES = (ROOT, ROOT / "specops", ROOT / "files" / "patches")
# Named in the docs, git-ignored: written by `inv sandbox.up`, and the user's own (from inventory.example/).
GENERATED = {"sandbox/inventory", "inventory", "sandbox/prometheus"}  # written by the tasks the docs run
WRITTEN = re.compile(r"\.(merge|patch)-?\d[\w.]*$")  # what `inv patch --rebase` writes: FILE.merge-0.5.24
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)=\"([^\"]+)\"", re.I)
TREE_PATH = re.compile(r"(?<![\w./~$<-])((?:%s)/[\w./-]*)" % "|".join(re.escape(t) for t in TOP))
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def vocabulary() -> dict:
    """The inventory's vocabulary: each host var and its schema (the one place the tests read it from)."""
    import roles
    return roles.VOCABULARY


def split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, lines inside fenced code blocks)."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1) == fence:
            fence = None
        elif fence is None:
            prose.append(line)
        else:
            code.append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the text as shown (code spans and links
    read as their text, emphasis marks gone), lower case, punctuation and symbols dropped
    (letters, digits, marks, '_' and '-' kept), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    keep = (ch for ch in text.lower() if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return "".join(keep).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the file's headings (a repeated one gets -1, -2, ...), and any
    <a name/id> written in it."""
    prose, _ = split(path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Targets of the file's links (inline, images, reference definitions), outside code."""
    prose, _ = split(path.read_text())
    out = []
    for line in prose:
        line = CODE_SPAN.sub("", line)
        out += LINK.findall(line)
        m = REF_DEF.match(line)
        if m:
            out.append(m.group(1))
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in links(path):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # a web address: not checked here (no network in the unit tests)
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if file and (ROOT not in dest.parents and dest != ROOT or not dest.exists()):
            problems.append(f"{target}: no such file in the repository")
        elif fragment and dest.suffix != ".md":
            problems.append(f"{target}: a #fragment, but {file} is not a markdown file")
        elif fragment and fragment not in anchors(dest):
            problems.append(f"{target}: {dest.relative_to(ROOT)} has no heading with the anchor #{fragment}")
    return problems


def tree_paths(path: Path) -> list[str]:
    """Paths of the tree written in code: in a code span (a whole span that is a path ending in
    .py, with a '/', is read from the root or from specops/), or anywhere in a fenced block
    (paths that start with one of the tree's folders)."""
    prose, code = split(path.read_text())
    out = []
    for line in prose:
        for _, span in CODE_SPAN.findall(line):
            span = span.strip()
            found = TREE_PATH.findall(span)
            if found:
                out += found
            elif re.fullmatch(r"[\w.-]+(/[\w.-]+)+\.py", span):
                out.append(span)  # shorthand inside the package, e.g. agent/converge/stage.py
    for line in code:
        out += TREE_PATH.findall(line)
    return [p.rstrip(".,:;") for p in out]


def module_names(path: Path) -> list[str]:
    """Bare module file names written as a whole code span (`parts.py`)."""
    prose, _ = split(path.read_text())
    return [span.strip() for line in prose for _, span in CODE_SPAN.findall(line)
            if re.fullmatch(r"[\w.-]+\.py", span.strip())]


def tree_files() -> set[str]:
    """The base names of the tree's files (hidden folders, caches and builds left out)."""
    names = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "build")]
        names.update(files)
    return names


def missing_paths(path: Path) -> list[str]:
    problems = []
    for p in tree_paths(path):
        if any(p.rstrip("/") == g or p.startswith(g + "/") for g in GENERATED) or WRITTEN.search(p):
            continue
        if not any((base / p).exists() for base in BASES):
            problems.append(f"`{p}`: no such file or folder in the tree")
    names = tree_files()
    problems += [f"`{n}`: no file of that name in the tree" for n in module_names(path) if n not in names]
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc):
    assert not broken_links(doc), f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken_links(doc))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_of_the_tree_exists(doc):
    assert not missing_paths(doc), f"{doc.relative_to(ROOT)}:\n" + "\n".join(missing_paths(doc))


def test_every_docs_page_links_back_to_the_readme():
    for page in DOCS[1:]:
        if page.name == "RELIABILITY.md":
            continue  # written by the test session (tests/support/reliability.py)
        assert any(t.split("#")[0] == "../README.md" for t in links(page)), f"{page.name} has no link to the README"


def test_the_readme_links_every_docs_page():
    targets = {t.split("#")[0] for t in links(ROOT / "README.md")}
    assert not [p.name for p in DOCS[1:] if f"docs/{p.name}" not in targets]


def test_slugs_follow_githubs_rules(tmp_path):
    """Anchors as GitHub makes them (checked against headings of this repository on github.com's
    rules: github-slugger), and links that miss are found."""
    assert slug("Does speculative decoding pay off?") == "does-speculative-decoding-pay-off"
    assert slug("Many workers behind SGLang's router") == "many-workers-behind-sglangs-router"
    assert slug("`inv deploy --bench`: the gate") == "inv-deploy---bench-the-gate"
    assert slug("Routers and rolling deploys — a [link](x.md)") == "routers-and-rolling-deploys--a-link"
    assert slug("Air-gapped hosts (wheelhouse)") == "air-gapped-hosts-wheelhouse"
    doc = tmp_path / "docs"
    doc.mkdir()
    (doc / "a.md").write_text("# Top\n## Same\n## Same\n```\n# not a heading\n```\n")
    assert anchors(doc / "a.md") == {"top", "same", "same-1"}


def test_the_tutorial_says_what_each_command_promises_and_the_runner_checks_it():
    """tests/support/tutorial.py: exit codes and words from the comments, variables kept for later lines."""
    import subprocess
    from support import tutorial
    text = ('x\n```bash\nI="-a"  # a\necho $I  # says "-a", says "b"\nfalse  # exits 1\n# only words\n```\n'
            '```text\nno\n```\n')
    got = tutorial.steps(text)
    assert [(s.command, s.exits, s.says) for s in got] == [('I="-a"', 0, []), ("echo $I", 0, ["-a", "b"]),
                                                           ("false", 1, [])]
    res = tutorial.run(got[1], got[:1], ROOT / "nowhere", {})
    assert res.stdout == "-a\n" and tutorial.broken_promises(got[1], res) == ["no 'b' in its output"]
    assert tutorial.broken_promises(got[2], subprocess.CompletedProcess([], 0, "", "")) == ["exit 0, not 1"]
    steps = tutorial.steps()
    assert steps[0].command == tutorial.SETUP and any(s.exits for s in steps) and all(s.command for s in steps)


def key_paths(schema, path: tuple = ()) -> list[tuple]:
    """Every key of a schema, as a path: ('services', 'gate', 'load', 'seed').  Mappings are walked,
    a list of mappings (`services: [SERVICE]`) and a required key (Req) as what they hold, and each
    mapping a OneOf allows (`monitoring: true` or `{textfile_dir, refresh}`); a mapping of free keys
    (MapOf: `env`, `draft_config`) has none to name."""
    from specops.inventory import checker as s
    if isinstance(schema, s.Req):
        return key_paths(schema.schema, path)
    if isinstance(schema, s.OneOf):
        return [p for option in schema.options for p in key_paths(option, path)]
    if isinstance(schema, list) and len(schema) == 1:
        return key_paths(schema[0], path)
    if isinstance(schema, dict):
        return [p for k, v in schema.items() for p in [path + (k,), *key_paths(v, path + (k,))]]
    return []


def yaml_keys(value) -> set[str]:
    """The keys of every mapping in a parsed YAML value, however deep."""
    if isinstance(value, dict):
        return {str(k) for k in value} | {k for v in value.values() for k in yaml_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in yaml_keys(v)}
    return set()


def keys_written(path: Path, names: set[str]) -> set[str]:
    """The keys a page writes as keys, in code: a code span that is a key or a dotted path of
    keys (`monitoring`, `tune.traffic`; each part one of `names`, so `config.json` names none), or
    YAML that sets or lists keys (`host_key_policy: accept-new`, `{timeout, stall_timeout}`), and
    the keys of the mappings of a ```yaml block (which must parse)."""
    text = path.read_text()
    prose, _ = split(text)
    out = set()
    for line in prose:
        for _, span in CODE_SPAN.findall(line):
            span = span.strip()
            parts = span.split(".")
            if all(part in names for part in parts):
                out.update(parts)
                continue
            try:
                out |= yaml_keys(yaml.safe_load(span))
            except yaml.YAMLError:
                pass  # not YAML: a command, a path, a message
    for block in re.findall(r"^ {0,3}```ya?ml[ \t]*\n(.*?)^ {0,3}```", text, re.M | re.S):
        out |= yaml_keys(yaml.safe_load(block))
    return out


def test_the_inventory_page_names_every_key_of_the_vocabulary():
    """Every key of the inventory's vocabulary (the host vars, and every key nested in them: a
    service's, `speculative`'s, `weights`', `gate.load`'s, `monitoring`'s mapping's...) is written
    as a key in docs/inventory.md (keys_written): in a code span that is the key or a dotted path
    through it (`monitoring`, `tune.traffic`), in a span of YAML that sets or lists it
    (`watch: {for: 30m}`, `{budget, drafts, traffic}`), or as a key in a ```yaml block
    (`  traffic: 200`).  Strict: a word of prose does not count, nor part of a longer name
    (`stall_timeout` is not `timeout`), nor a span of a file name (`config.json`) or a command
    (`--traffic 200`).  Fair: a key is matched by its name, not its path, so a name that several
    keys share (`port`, `version`, `min_accept_length`) is covered where the page names it once."""
    paths = key_paths(vocabulary())
    written = keys_written(ROOT / "docs" / "inventory.md", {p[-1] for p in paths})
    missing = [".".join(p) for p in paths if p[-1] not in written]
    assert not missing, "docs/inventory.md does not name these keys of the inventory:\n" + "\n".join(missing)


def test_the_readme_fits_on_a_page():
    """At most 200 lines: the rest is in docs/, which the README's table points at."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
