#!/usr/bin/env bash
# CI step: install Debian's PostgreSQL server programs for the results-store tests
# (tests/postgres_server.py starts a throwaway cluster with them; nothing is started here).
# A no-op when /usr/lib/postgresql/*/bin/initdb is already there.
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    exec sudo "$0" "$@"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# Debian's package starts a cluster of its own; the tests never use it.
if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters --no-header | while read -r version name _; do
        pg_ctlcluster "$version" "$name" stop || true
    done
fi
