#!/usr/bin/env bash
# Idempotent set-up: system packages, a virtual environment in .venv (or $MONARCH_VENV),
# torch (CPU build where no GPU exists), and this project with its test extras (and the
# telemetry and stacks extras, whose tests need them) at the
# versions of requirements/lock.txt. Safe to run repeatedly.
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
# Install exact versions from requirements/lock.txt (regenerate it with scripts/lock.sh),
# and re-install when the lock or pyproject.toml changes. MONARCH_SETUP=latest (used by
# `scripts/test.sh --latest`) ignores the lock and upgrades to the newest releases instead.
LOCK=requirements/lock.txt
mode=${MONARCH_SETUP:-locked}
pyver=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
constraints=()
if [ "$mode" = locked ]; then
  if grep -qx "# python: $pyver (setup.sh uses this lock only with this Python version)" "$LOCK"; then
    constraints=(-c "$LOCK")
  else
    echo "[setup] warning: $LOCK is for another Python than $pyver; installing the newest" \
         "releases within pyproject.toml's bounds (run scripts/lock.sh to lock for $pyver)" >&2
  fi
fi
want="$mode $pyver $(cat pyproject.toml "$LOCK" | sha1sum | cut -c1-40)"
if [ "$mode" = latest ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch (CPU build unless a GPU is present)"
    if command -v nvidia-smi >/dev/null 2>&1; then
      "$VENV/bin/pip" install -q "${constraints[@]}" torch
    else
      "$VENV/bin/pip" install -q "${constraints[@]}" torch==2.13.0 ||
        "$VENV/bin/pip" install -q "${constraints[@]}" torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
  if [ "$mode" = latest ]; then
    echo "[setup] installing monarch-notebook with the newest releases of its dependencies" \
         "(torch kept at the build installed above)"
    "$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__)" > "$VENV/.torch-pin"
    "$VENV/bin/pip" install -q --upgrade --upgrade-strategy eager -c "$VENV/.torch-pin" -e ".[test,telemetry,stacks]"
  else
    echo "[setup] installing monarch-notebook and its test tools (versions from $LOCK)"
    "$VENV/bin/pip" install -q "${constraints[@]}" -e ".[test,telemetry,stacks]"
  fi
  echo "$want" > "$STAMP"
fi
# The Jupyter kernelspec for this environment.
"$VENV/bin/python" -m monarch_kernel install --sys-prefix >/dev/null 2>&1 || true
