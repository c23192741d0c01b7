#!/usr/bin/env bash
# CI step: bring up the one-node Slurm cluster the tests marked `slurm` use.
# Runs as root on a Debian/Ubuntu runner (apt-get); a no-op when the cluster is already up.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$(id -u)" -ne 0 ]; then
    exec sudo --preserve-env=MLHPC_SLURM_PARTITION,MLHPC_SLURM_WAIT_S "$here/scripts/slurm/start-cluster.sh"
fi
exec "$here/scripts/slurm/start-cluster.sh"
