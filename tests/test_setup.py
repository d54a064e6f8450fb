"""Issue 50, item 6: scripts/setup.sh printed some thirty pip warnings ("Location 'file:///…' is
ignored": a pip config that names a file:// index or find-links location with no page for a
project warns once per project looked up, none of it wrong).  Each step now keeps its output and
shows it only when it fails; its [setup] lines, and the builds' [sandbox] progress lines, stay.
The install step runs as setup.sh runs it, into a throwaway venv (never the project's .venv)."""
import os
import subprocess

import pytest

from support import ROOT


def setup(function: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """One of setup.sh's steps, the script sourced (which defines its steps and runs none)."""
    return subprocess.run(["bash", "-c", f'source scripts/setup.sh && {function} "$@"', "setup", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env or dict(os.environ), timeout=600)


def warning_pip(tmp_path, **over) -> dict:
    """The environment with one find-links location more, a directory that is not there: pip warns
    about it for every project it looks up, as it did about the file:// index on the issue's machine."""
    links = f"{os.environ.get('PIP_FIND_LINKS', '')} file://{tmp_path}/gone".strip()
    return {**os.environ, "PIP_FIND_LINKS": links, **over}


def test_a_step_is_silent_but_for_its_progress_and_says_everything_when_it_fails():
    ok = setup("quiet", "sh", "-c", 'echo "[sandbox] building the layer"; echo "WARNING: noise" >&2; echo out')
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "[sandbox] building the layer\n")
    failed = setup("quiet", "sh", "-c", 'echo "what went wrong"; echo "and why" >&2; exit 3')
    assert failed.returncode == 3 and failed.stdout == ""
    assert failed.stderr == "[setup] failed (exit 3): sh -c echo \"what went wrong\"; echo \"and why\" >&2; exit 3\n" \
                            "what went wrong\nand why\n"


@pytest.mark.slow
def test_the_install_step_says_its_two_lines_and_no_pip_warning(tmp_path):
    venv = tmp_path / "venv"
    res = setup("install_specops", str(venv), env=warning_pip(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == f"[setup] creating {venv}\n[setup] installing specops and its test tools into {venv}\n"
    assert "is ignored" not in res.stderr and res.stderr == "", res.stderr[:3000]
    assert subprocess.run([venv / "bin/python", "-c", "import specops, pytest"]).returncode == 0


def test_a_failed_install_shows_what_pip_said(tmp_path):
    """No index and nothing to find: pip cannot get the build's setuptools, and says so."""
    venv = tmp_path / "venv"
    res = setup("install_specops", str(venv), env=warning_pip(tmp_path, PIP_NO_INDEX="1"))
    assert res.returncode != 0
    assert "[setup] failed (exit 1): " in res.stderr and "-m pip install" in res.stderr, res.stderr
    assert "setuptools" in res.stderr and "is ignored" in res.stderr  # pip's own words, all of them
