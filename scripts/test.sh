#!/usr/bin/env bash
# Set everything up, then run the whole test suite. Extra arguments go to pytest.
#   bash scripts/test.sh             the locked set-up (requirements/lock.txt), as CI runs it
#   bash scripts/test.sh --latest    a separate environment (.venv-latest) with the newest
#                                    releases of every dependency: shows drift before a
#                                    user meets it
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--latest" ]; then
  shift
  export MONARCH_VENV=${MONARCH_LATEST_VENV:-$PWD/.venv-latest} MONARCH_SETUP=latest
fi
VENV=${MONARCH_VENV:-$PWD/.venv}
bash scripts/setup.sh
# -n 3: three workers (pytest-xdist); tests/conftest.py hands each worker whole test files,
# the ones that use the network-namespace cluster as one unit, the longest first. Three on
# 2 cores: with two, the cores were idle 41% of the run (tests wait for detections,
# timeouts and processes), with three 16%.
# MONARCH_TEST_WORKERS=0 (or a later `-n 0`) runs the suite in this one process.
# --durations=25: the slowest tests, printed at the end (the suite's wall time is kept
# under 8 minutes on the 2-core development machine)
exec "$VENV/bin/python" -m pytest -n "${MONARCH_TEST_WORKERS:-3}" --durations=25 "$@"
