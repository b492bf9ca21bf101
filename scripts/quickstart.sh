#!/usr/bin/env bash
# Set everything up and open the quickstart notebook in JupyterLab (loopback only) with the
# Monarch kernel. With --headless, execute the notebook and print its outputs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--headless" ]; then
  exec .venv/bin/python -m monarch_kernel.run_notebook notebooks/quickstart.ipynb
fi
exec .venv/bin/jupyter lab --ip=127.0.0.1 --no-browser notebooks/quickstart.ipynb
