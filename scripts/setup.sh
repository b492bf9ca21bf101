#!/usr/bin/env bash
# Idempotent set-up: system packages, a virtual environment in .venv, torch (CPU build
# where no GPU exists), and this project with its test extras. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${MONARCH_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMP=$VENV/.monarch-setup-stamp

need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v slurmctld >/dev/null 2>&1 || need_apt+=(slurm-wlm munge)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
[ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-server openssh-client)
if [ ${#need_apt[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing system packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# Re-install only when the project's dependency list changed.
want=$(sha1sum pyproject.toml | cut -c1-40)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch (CPU build unless a GPU is present)"
    if command -v nvidia-smi >/dev/null 2>&1; then
      "$VENV/bin/pip" install -q torch
    else
      "$VENV/bin/pip" install -q torch==2.13.0 || "$VENV/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
  echo "[setup] installing monarch-notebook and its test tools"
  "$VENV/bin/pip" install -q -e ".[test]"
  echo "$want" > "$STAMP"
fi
# The Jupyter kernelspec for this environment.
"$VENV/bin/python" -m monarch_kernel install --sys-prefix >/dev/null 2>&1 || true
