#!/usr/bin/env bash
# Set everything up and open the quickstart notebook in JupyterLab (loopback only) with the
# Monarch kernel. With --headless, execute the notebook and print its outputs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${MONARCH_VENV:-$PWD/.venv}
if [ "${1:-}" = "--headless" ]; then
  exec "$VENV/bin/python" -m monarch_kernel.run_notebook notebooks/quickstart.ipynb
fi
ALLOW=()
[ "$(id -u)" = 0 ] && ALLOW=(--allow-root)
echo "[quickstart] JupyterLab on 127.0.0.1: open the URL printed below (kernel: Monarch (Python 3))"
exec "$VENV/bin/jupyter" lab --ip=127.0.0.1 --no-browser "${ALLOW[@]}" notebooks/quickstart.ipynb
