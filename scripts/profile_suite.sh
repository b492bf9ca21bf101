#!/usr/bin/env bash
# Where the suite's time goes: runs the README's test command (extra arguments go to
# pytest) while sampling how idle the cores are, and, as root with `acct` installed
# (apt-get install acct), records every process's CPU time with BSD process accounting.
# Prints the mean idle share of the cores, then the CPU time by command name (procs,
# agents, kernels...). A suite whose cores idle is waiting, not computing: more workers
# help; one whose cores are busy needs less work.
#   bash scripts/profile_suite.sh                 the whole suite
#   bash scripts/profile_suite.sh -m pure -n 0    a part of it
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

sample() {  # idle share of all cores every second, one line each, until killed
  local prev cur
  read -ra prev < <(head -1 /proc/stat)
  while sleep 1; do
    read -ra cur < <(head -1 /proc/stat)
    awk -v a="${prev[*]}" -v b="${cur[*]}" 'BEGIN {
      n = split(a, p, " "); split(b, c, " "); tot = 0
      for (i = 2; i <= 9 && i <= n; i++) tot += c[i] - p[i]
      if (tot > 0) printf "%.4f\n", (c[5] - p[5] + c[6] - p[6]) / tot }'
    prev=("${cur[@]}")
  done
}

accounting=""
if [ "$(id -u)" = 0 ] && command -v accton >/dev/null && command -v sa >/dev/null; then
  : > "$out/pacct" && accton "$out/pacct" >/dev/null && accounting=1
fi
sample > "$out/idle" &
sampler=$!
start=$(date +%s)
bash scripts/test.sh "$@"
rc=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
[ -n "$accounting" ] && accton off >/dev/null

echo "== profile: $(( $(date +%s) - start )) s in all (set-up included), $(nproc) cores"
awk '{ s += $1; n++ } END { if (n) printf "cores idle: %.0f%% of the run (%d samples)\n", 100 * s / n, n }' "$out/idle"
if [ -n "$accounting" ]; then
  echo "CPU by command (minutes of CPU, processes that ended during the run):"
  sa -f "$out/pacct" -a 2>/dev/null | head -12
else
  echo "(no per-process CPU: needs root and accton/sa from the acct package)"
fi
exit "$rc"
