"""Where a host's Python packages come from, as pip and uv are told: its wheelhouse alone
(air-gapped, pushed to REMOTE_WHEELHOUSE), or a first index (the torch variant's) and its
`package_index` (PyPI when none) and `extra_index`.  The agent hands these to the installers in
their environment, never on a command line (specops/agent/converge/installs.py); the redactor
hides their credentials (`secrets`)."""
from __future__ import annotations

from urllib.parse import urlsplit

from ..agent.converge import indexurl
from .stack import PYPI

REMOTE_WHEELHOUSE = "/var/cache/specops/wheelhouse"


def uv_sources(host, first_index=None):
    """uv's index arguments: the wheelhouse alone (air-gapped), or the torch variant's index
    (`first_index`, asked first, as uv asks an --index before the --default-index) with the
    package index and extra index behind it."""
    if host.get("wheelhouse"):
        return ["--no-index", "--find-links", REMOTE_WHEELHOUSE]
    out = ["--index", first_index] if first_index else []
    if host.get("extra_index"):
        out += ["--index", host["extra_index"]]
    return out + ["--default-index", host.get("package_index") or PYPI]


def pip_sources(host, first_index=None):
    """pip's index arguments for this host: its wheelhouse (air-gapped), or `first_index` (the
    torch variant's) then its package index and extra index."""
    if host.get("wheelhouse"):
        return ["--no-index", "--find-links", REMOTE_WHEELHOUSE]
    index = host.get("package_index") or PYPI
    out = ["--index-url", first_index, "--extra-index-url", index] if first_index else ["--index-url", index]
    if host.get("extra_index"):
        out += ["--extra-index-url", host["extra_index"]]
    # pip ignores plain-http indexes unless told; writing an http:// URL is that choice.
    trusted = {urlsplit(url).hostname for url in out[1::2] if url.startswith("http://")}
    for name in sorted(trusted):
        out += ["--trusted-host", name]
    return out


def secrets(host) -> list[str]:
    """What of the host's index URLs must never be printed: each one's password, or its user when
    that is a token given alone (the redactor's, specops/output/report.py)."""
    urls = (host.get("package_index"), host.get("extra_index"), (host.get("torch") or {}).get("index_url"))
    return [s for url in urls if url for s in indexurl.secrets(url)]
