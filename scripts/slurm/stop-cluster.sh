#!/usr/bin/env bash
# Stop the one-node test cluster started by start-cluster.sh (slurmd, slurmctld, munged), each by
# the pid in its pid file; packages and configuration stay, so start-cluster.sh brings it back.
set -uo pipefail
[ "$(id -u)" -eq 0 ] || { echo "stop-cluster: must run as root" >&2; exit 1; }
for pidfile in /run/slurm/slurmd.pid /run/slurm/slurmctld.pid /run/munge/munged.pid; do
    [ -s "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" && echo "stop-cluster: stopped $(basename "$pidfile" .pid) ($pid)" >&2
    fi
done
