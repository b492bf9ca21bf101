#!/bin/bash
# Throwaway SLURM cluster whose N compute nodes are network namespaces (root only).
# Nodes ${PFX}1..N at $NET.1..N on bridge ${PFX}br0; slurmctld runs in its own namespace
# ${PFX}ctl at $NET.250; the caller's (root) namespace gets $NET.254 on the bridge.
# A private munged (socket, key, pid in $MH_DIR) keeps the machine's munge untouched.
# Everything started records a pidfile in $MH_DIR; down.sh stops it by pid.
set -euo pipefail
N=${N:-3}; D=${MH_DIR:?set MH_DIR to a scratch directory}; NET=${MH_NET:-10.77.0}; PFX=${MH_PFX:-mh}
BR=${PFX}br0; CTL=${PFX}ctl; CTL_ADDR=$NET.250; HOST_ADDR=$NET.254
log() { echo "[mh-up] $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 2; }
for c in slurmctld slurmd sbatch munged mungekey nft ip nsenter unshare; do
  command -v $c >/dev/null || { log "missing command: $c"; exit 2; }
done
if ip link show "$BR" >/dev/null 2>&1; then log "bridge $BR already exists: another cluster is up"; exit 3; fi

mkdir -p "$D"/state "$D"/log "$D"/munge
chmod 0711 "$D"                                   # munge must traverse; nothing secret here
chown munge:munge "$D"/munge; chmod 0755 "$D"/munge        # munged: socket dir must be o+x; key stays 0600
echo "$N" > "$D"/nodes; echo "$PFX" > "$D"/prefix; echo "$NET" > "$D"/net

# Private munge instance.
runuser -u munge -- mungekey -c -k "$D"/munge/munge.key
runuser -u munge -- /usr/sbin/munged --socket="$D"/munge/munge.sock --key-file="$D"/munge/munge.key \
  --pid-file="$D"/munge/munged.pid --log-file="$D"/munge/munged.log --seed-file="$D"/munge/munged.seed
cp "$D"/munge/munged.pid "$D"/munged.pid

# Network: the bridge, the root namespace's address on it, one namespace per node + slurmctld's.
ip link add "$BR" type bridge
ip addr add $HOST_ADDR/24 dev "$BR"
ip link set "$BR" up
# Bridged frames must not be filtered by a host firewall (e.g. left over from dockerd).
if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] \
   && { nft list ruleset 2>/dev/null | grep -q 'hook forward' || command -v dockerd >/dev/null; }; then
  sysctl -qw net.bridge.bridge-nf-call-iptables=0
fi
{ echo "127.0.0.1 localhost"; echo "$CTL_ADDR $CTL"; echo "$HOST_ADDR ${PFX}host";
  for j in $(seq 1 "$N"); do echo "$NET.$j $PFX$j"; done; } > "$D"/hosts
addns() {  # name addr veth
  ip netns add "$1"
  ip link add "$3" type veth peer name eth0 netns "$1"
  ip link set "$3" master "$BR" up
  ip -n "$1" addr add "$2"/24 dev eth0
  ip -n "$1" link set lo up
  ip -n "$1" link set eth0 up
}
addns "$CTL" "$CTL_ADDR" ${PFX}vc
for i in $(seq 1 "$N"); do addns "$PFX$i" "$NET.$i" ${PFX}v$i; mkdir -p "$D"/spool/$PFX$i; done

cat > "$D"/slurm.conf <<CONF
ClusterName=${PFX}ci
SlurmctldHost=$CTL($CTL_ADDR)
AuthInfo=socket=$D/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=5
MessageTimeout=5
KillWait=5
MinJobAge=30
NodeName=$PFX[1-$N] NodeAddr=$NET.[1-$N] NodeHostname=$PFX[1-$N] CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$D"/slurm.conf
innode() {  # namespace, then a command run with its own hostname and /etc/hosts
  nsenter --net=/run/netns/"$1" unshare --uts --mount sh -c \
    "mount --bind $D/hosts /etc/hosts && hostname $1 && exec $2"
}
innode "$CTL" "slurmctld -c -f $SLURM_CONF"
for i in $(seq 1 "$N"); do innode "$PFX$i" "slurmd -f $SLURM_CONF -N $PFX$i"; done
for _ in $(seq 1 160); do
  [ "$(sinfo -h -t idle -o %D 2>/dev/null)" = "$N" ] && { log "up: $N idle nodes"; exit 0; }
  sleep 0.25
done
log "nodes did not become idle in 40 s"; sinfo >&2 || true; exit 4
