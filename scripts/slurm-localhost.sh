#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for tests/it/slurm.rs (scripts/test.sh). Nothing is written outside the state folder: its own slurm.conf (found through
# SLURM_CONF), its own ports, its own spool and logs, its own munged (socket and key); the system's
# /etc/slurm and /etc/munge, and any munged already running, are left alone.
#
#   scripts/slurm-localhost.sh start DIR   # install (apt-get, when allowed) and start; exit 0 when the node
#                                          # is idle, 3 with a "SKIPPED: ..." line when it cannot be had
#   scripts/slurm-localhost.sh stop DIR    # stop the daemons this script started for DIR, by their pids
#
# After `start`, `export SLURM_CONF=DIR/slurm.conf` reaches the cluster (DIR/env says so).
# Environment: FLASHTUNE_SLURM_INSTALL=0 forbids apt-get (the GPU machine has no network);
# FLASHTUNE_SLURM_GPUS=N gives the node N real GPUs (gres/gpu on /dev/nvidia0..N-1).
set -uo pipefail

cmd=${1:-}
state=${2:-}
[ -n "$state" ] && { [ "$cmd" = start ] || [ "$cmd" = stop ]; } || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
# Absolute, so that `stop` recognises the daemons' command lines whatever form of DIR it is given.
[ "$cmd" != start ] || mkdir -p "$state"
[ -d "$state" ] || exit 0
state=$(cd "$state" && pwd)

skip() {
  echo "SKIPPED: no Slurm ($*)"
  echo "SKIPPED: no Slurm ($*)" > "$state/skipped"
  exit 3
}

stop() {
  for name in slurmd slurmctld munged; do
    pidfile="$state/$name.started"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # Only a pid that is still the daemon this script started for this DIR (its command line names DIR).
    if [ -n "$pid" ] && grep -q "$name" "/proc/$pid/comm" 2>/dev/null &&
        tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$state/"; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$pidfile"
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi

rm -f "$state/skipped"
t0=$(date +%s)

missing() {
  for b in slurmctld slurmd srun sinfo squeue scancel sbatch munged; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { echo "$b"; return 0; }
  done
  return 1
}
export PATH="$PATH:/usr/sbin:/sbin"
if m=$(missing); then
  if [ "${FLASHTUNE_SLURM_INSTALL:-1}" = 0 ]; then
    skip "$m is not installed, and FLASHTUNE_SLURM_INSTALL=0 forbids installing it"
  elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    skip "$m is not installed, and installing it needs root and apt-get"
  fi
  echo "== installing slurmctld slurmd munge (apt-get)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >"$state/apt.log" 2>&1; then
    # An install cut short earlier (a killed CI job) blocks every later one until dpkg finishes it.
    if grep -q "dpkg was interrupted" "$state/apt.log"; then
      DEBIAN_FRONTEND=noninteractive dpkg --configure -a >>"$state/apt.log" 2>&1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$state/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >>"$state/apt.log" 2>&1 ||
      skip "apt-get install slurmctld slurmd munge failed: $(tail -1 "$state/apt.log")"
  fi
  m=$(missing) && skip "$m is still missing after apt-get"
fi

# munge: a munged of this cluster's own, on its own socket with its own key, both under DIR
# (slurm.conf's AuthInfo names the socket). A munged already running here (the system's, or another
# cluster's, another of these included) is neither reused nor touched, so `stop` stops no one else's.
# munged wants every folder above its socket searchable by all (DIR need not be readable).
sock_dir="$state/munge"
mkdir -p "$sock_dir"
chmod 711 "$state"
chmod 755 "$sock_dir"
sock="$sock_dir/socket"
(umask 077 && dd if=/dev/urandom of="$state/munge.key" bs=1 count=1024 status=none) ||
  skip "cannot write $state/munge.key"
munged --foreground --socket="$sock" --key-file="$state/munge.key" \
  --pid-file="$sock_dir/munged.pid" --seed-file="$sock_dir/munged.seed" >"$state/munged.log" 2>&1 &
echo $! > "$state/munged.started"
munge_ok() { munge --socket="$sock" -n </dev/null 2>/dev/null | unmunge --socket="$sock" >/dev/null 2>&1; }
for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
munge_ok || { stop; skip "munged did not start: $(tail -1 "$state/munged.log")"; }

host=$(hostname -s)
cpus=$(nproc)
# At least 8 CPUs on paper (SlurmdParameters=config_overrides): the tests run 4 workers beside a
# batch job on a 2-core machine; the workers mostly wait on the GPU.
[ "$cpus" -ge 8 ] || cpus=8
gpus=${FLASHTUNE_SLURM_GPUS:-0}
gres_line=""
node_gres=""
if [ "$gpus" -gt 0 ]; then
  gres_line="GresTypes=gpu"
  node_gres="Gres=gpu:$gpus"
  last=$((gpus - 1))
  if [ "$last" -eq 0 ]; then files=/dev/nvidia0; else files="/dev/nvidia[0-$last]"; fi
  echo "Name=gpu File=$files" > "$state/gres.conf"
else
  : > "$state/gres.conf"
fi
mkdir -p "$state/ctld" "$state/spool"
# Ports of its own, so a cluster already on this host (6817/6818, or another of these) is not disturbed.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=16817
while listening "$port" || listening $((port + 1)); do
  port=$((port + 2))
  [ "$port" -lt 17817 ] || skip "no two free ports between 16817 and 17817"
done
cat > "$state/slurm.conf" <<EOF
ClusterName=flashtune
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=60
$gres_line
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN $node_gres
PartitionName=flashtune Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$state/slurm.conf"
echo "export SLURM_CONF=$state/slurm.conf" > "$state/env"

slurmctld -D -i -f "$SLURM_CONF" >"$state/slurmctld.out" 2>&1 &
echo $! > "$state/slurmctld.started"
slurmd -D -f "$SLURM_CONF" >"$state/slurmd.out" 2>&1 &
echo $! > "$state/slurmd.started"

state_now=""
for _ in $(seq 120); do
  state_now=$(sinfo -h -N -o '%T' 2>/dev/null | head -1)
  [ "$state_now" = idle ] && break
  for d in slurmctld slurmd; do
    kill -0 "$(cat "$state/$d.started")" 2>/dev/null ||
      { why=$(tail -2 "$state/$d.out" "$state/$d.log" 2>/dev/null | grep -v '^==' | tail -1); stop; skip "$d exited: $why"; }
  done
  sleep 0.25
done
if [ "$state_now" != idle ]; then
  why=$(tail -1 "$state/slurmd.log" 2>/dev/null)
  stop
  skip "the node did not become idle within 30 s (state: ${state_now:-none}; slurmd: $why)"
fi
echo "== Slurm on $host: node idle after $(( $(date +%s) - t0 )) s ($cpus CPUs, $gpus GPUs); SLURM_CONF=$SLURM_CONF"
