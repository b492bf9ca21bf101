#!/bin/bash
# Tear down what up.sh started, by pidfile and by namespace membership, never by name.
# Safe to run on a half-built cluster and more than once.
set -uo pipefail
D=${MH_DIR:?set MH_DIR to a scratch directory}
[ -d "$D" ] || exit 0
N=$(cat "$D"/nodes 2>/dev/null || echo "${N:-3}"); PFX=$(cat "$D"/prefix 2>/dev/null || echo "${MH_PFX:-mh}")
export SLURM_CONF=$D/slurm.conf
log() { echo "[mh-down] $*" >&2; }
alive() { [ -r /proc/$1/stat ] && ! awk '{exit !($3=="Z")}' /proc/$1/stat; }
if [ -f "$SLURM_CONF" ] && [ -f "$D"/slurmctld.pid ]; then timeout 5 scancel --quiet --user="$(id -un)" 2>/dev/null; sleep 0.5; fi
pids=()
for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid "$D"/munged.pid; do
  [ -f "$f" ] && pids+=("$(cat "$f")")
done
# Anything still inside the cluster's namespaces (agents, srun steps, daemons).
for ns in "$PFX"ctl $(seq -f "$PFX%g" 1 "$N"); do
  mapfile -t nsp < <(ip netns pids "$ns" 2>/dev/null)
  pids+=("${nsp[@]}")
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for _ in $(seq 1 40); do
  left=0; for p in "${pids[@]}"; do alive "$p" && left=1; done
  [ $left = 0 ] && break; sleep 0.25
done
for p in "${pids[@]}"; do alive "$p" && { log "SIGKILL $p"; kill -KILL "$p" 2>/dev/null; }; done
sleep 0.2
# The host ends of the veths first: a namespace whose sockets are still closing outlives
# `ip netns del` for a while, and its veth pair with it (then the next up.sh finds the name).
for v in "$PFX"vc $(seq -f "${PFX}v%g" 1 "$N"); do ip link del "$v" 2>/dev/null; done
for ns in "$PFX"ctl $(seq -f "$PFX%g" 1 "$N"); do ip netns del "$ns" 2>/dev/null; done
ip link del "$PFX"br0 2>/dev/null
rm -rf "$D"
log "down"
exit 0
