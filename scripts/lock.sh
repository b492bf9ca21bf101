#!/usr/bin/env bash
# Regenerate requirements/lock.txt, the exact versions `scripts/setup.sh` installs, with uv.
#   bash scripts/lock.sh            re-resolve after a change to pyproject.toml, keeping every
#                                   pin that still fits
#   bash scripts/lock.sh --upgrade  move every pin to the newest release within pyproject's
#                                   bounds (then run `bash scripts/test.sh` before committing)
# The lock is for the Python of the project's environment (CPython 3.11 on Linux x86_64 in
# CI); torch is left out of it (setup.sh installs the build that fits the machine) but
# torch's own dependencies are pinned. The extras `telemetry` (OpenTelemetry's SDK and
# OTLP exporter) and `stacks` (py-spy) are locked with `test`, so CI runs their tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MONARCH_VENV:-$PWD/.venv}
LOCK=requirements/lock.txt
TORCH=2.13.0
[ -x "$VENV/bin/python" ] || bash scripts/setup.sh
"$VENV/bin/python" -m uv --version >/dev/null 2>&1 || "$VENV/bin/pip" install -q "uv>=0.4"
upgrade=()
[ "${1:-}" = "--upgrade" ] && upgrade=(--upgrade)
links=()
for d in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$d"); done
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
echo "torch==$TORCH" > "$pins"
pyver=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$VENV/bin/python" -m uv pip compile pyproject.toml --extra test --extra telemetry --extra stacks -c "$pins" \
  --no-emit-package torch --python "$VENV/bin/python" "${links[@]}" "${upgrade[@]}" \
  --custom-compile-command "bash scripts/lock.sh" --quiet -o "$LOCK"
sed -i "1i # python: $pyver (setup.sh uses this lock only with this Python version)" "$LOCK"
echo "[lock] wrote $LOCK ($(grep -c '==' "$LOCK") pins, python $pyver)"
