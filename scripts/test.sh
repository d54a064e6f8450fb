#!/usr/bin/env bash
# Set everything up, then run the whole test suite, sandbox fleet included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two workers, each with a sandbox fleet of its own (tests/support/site.py WORKER_SITES), taking whole
# files, longest first: most of a fleet test's time is a host's wait, not this machine's CPU.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=40 "$@"
