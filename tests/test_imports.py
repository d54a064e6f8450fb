"""What `import tasks` costs every `inv` run, a no-op deploy's among them.  No fleet."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Imported only by the tasks, roles' plans or inventories that use them: a deploy that reads no
# patch, no wheel and no INI inventory, and benches, tunes and reports nothing, never does.
NOT_AT_START = (
    "whatthepatch", "merge3", "pyflakes",  # a patch read, linted or applied
    "jinja2",  # a template rendered
    "urllib.request", "http.client", "html",  # a wheel's files read; the report's page
    "specops.inventory.ansible",  # an INI inventory
    "specops.flows.tuning", "specops.flows.specbench", "specops.flows.gate", "specops.flows.patching",
    "specops.fleetwide.report", "specops.fleetwide.monitoring", "specops.output.releases",
)


def test_importing_tasks_leaves_out_what_only_some_tasks_need():
    """In a fresh interpreter (this one has imported everything by now): tasks.py names every flow,
    and each is imported when a task first uses it."""
    res = subprocess.run([sys.executable, "-c", "import sys, tasks; print(' '.join(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "roles" in loaded and "specops.cli" in loaded  # the roles make the inventory's vocabulary
    assert sorted(m for m in NOT_AT_START if m in loaded) == []
