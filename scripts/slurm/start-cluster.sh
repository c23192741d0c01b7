#!/usr/bin/env bash
# Start a one-node Slurm cluster on this host (controller and only compute node), for the tests
# marked `slurm` and for CI. Idempotent: run it again and it only starts what is not running.
#
#   sudo scripts/slurm/start-cluster.sh          # install (Debian/Ubuntu apt), configure, start
#   MLHPC_SLURM_PARTITION=debug                  # partition name (default: debug)
#   MLHPC_SLURM_WAIT_S=120                       # how long to wait for the node to be idle
#
# What it does, in order:
#   1. apt-get installs slurmctld slurmd slurm-client munge when any of them is missing;
#   2. creates /etc/munge/munge.key (1024 random bytes, owner munge, mode 0400) if absent;
#   3. writes /etc/slurm/slurm.conf: this host (`hostname -s`) as controller and as the only node,
#      its CPUs/RealMemory as `slurmd -C` measures them, proctrack/linuxproc and task/none (no
#      cgroups: they are not available in every container), SlurmUser=root, MpiDefault=none
#      (jobs ask for --mpi=pmi2 themselves);
#   4. starts munged, slurmctld and slurmd (each only if not already running);
#   5. waits until `sinfo` reports the node idle (resuming it if a previous run left it down).
# Exit status 0 when the node is idle; otherwise the daemon logs' tails are printed and it fails.
set -euo pipefail

PARTITION="${MLHPC_SLURM_PARTITION:-debug}"
WAIT_S="${MLHPC_SLURM_WAIT_S:-120}"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
HOST="$(hostname -s)"

say() { echo "start-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (installs packages and starts daemons)"

# 1. packages -------------------------------------------------------------------------------
need_install=0
for bin in slurmctld slurmd sinfo sbatch srun munged; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_install=1
done
if [ "$need_install" -eq 1 ]; then
    command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and apt-get is not available"
    say "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
export PATH="$PATH:/usr/sbin:/sbin"

# 2. munge key ------------------------------------------------------------------------------
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    say "creating munge key"
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key

# 3. slurm.conf -----------------------------------------------------------------------------
mkdir -p "$CONF_DIR" "$LOG_DIR" /var/spool/slurmctld /var/spool/slurmd /run/slurm
# `slurmd -C` prints the node line as slurmd itself will measure it (no mismatch -> no DRAIN).
node_line="$(slurmd -C | head -n 1)"
case "$node_line" in
    NodeName=*) ;;
    *) die "slurmd -C gave no node line: $node_line" ;;
esac
# Keep a little memory back so RealMemory never exceeds what slurmd measures later.
mem_mb="$(echo "$node_line" | sed -nE 's/.*RealMemory=([0-9]+).*/\1/p')"
node_line="$(echo "$node_line" | sed -E "s/^NodeName=[^ ]+/NodeName=$HOST/; s/RealMemory=[0-9]+/RealMemory=$((${mem_mb:-1000} * 95 / 100))/")"

conf="$(cat <<EOF
# Written by mlhpc scripts/slurm/start-cluster.sh: a one-node test cluster.
ClusterName=mlhpc
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=10
Waittime=0
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)"
changed=0
if [ ! -f "$CONF_DIR/slurm.conf" ] || [ "$(cat "$CONF_DIR/slurm.conf")" != "$conf" ]; then
    printf '%s\n' "$conf" >"$CONF_DIR/slurm.conf"
    changed=1
    say "wrote $CONF_DIR/slurm.conf ($node_line)"
fi
# Some Debian releases read the configuration from /etc/slurm-llnl.
[ -e /etc/slurm-llnl ] || ln -s "$CONF_DIR" /etc/slurm-llnl

# 4. daemons ------------------------------------------------------------------------------
# A daemon runs when the pid in its pid file is alive (no procps needed on slim images).
pidfile_of() {
    case "$1" in
        munged) echo /run/munge/munged.pid ;;
        *) echo "/run/slurm/$1.pid" ;;
    esac
}
running() {
    local f
    f="$(pidfile_of "$1")"
    [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

if ! running munged; then
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.2; done
munge -n | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"

if running slurmctld && [ "$changed" -eq 1 ]; then
    say "configuration changed: reconfiguring"
    scontrol reconfigure || true
fi
if ! running slurmctld; then
    say "starting slurmctld"
    slurmctld
fi
if ! running slurmd; then
    say "starting slurmd"
    slurmd
fi

# 5. wait for the node --------------------------------------------------------------------
deadline=$((SECONDS + WAIT_S))
state=""
while [ "$SECONDS" -lt "$deadline" ]; do
    state="$(sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n 1 || true)"
    case "$state" in
        idle|mixed|allocated|completing) say "node $HOST is $state"; exit 0 ;;
        down*|drain*|drained*)
            scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
say "node $HOST did not become idle in ${WAIT_S}s (state: ${state:-unknown})"
tail -n 20 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 || true
exit 1
