#!/usr/bin/env bash
# CI step: install Debian's PostgreSQL server programs for the results-store tests
# (tests/postgres_server.py starts a throwaway cluster with them; nothing is started here).
# A no-op when /usr/lib/postgresql/*/bin/initdb is already there.
# Best effort: where the package cannot be installed (no root and no sudo, no apt-get, no network,
# a broken mirror) this says why and exits 0; the PostgreSQL tests are then skipped, saying so,
# and CI goes on with SQLite.
set -uo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null; then
    exit 0
fi
skip() {
    echo "CI: PostgreSQL not installed ($1): tests/test_store_postgres.py will be skipped" >&2
    exit 0
}
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || skip "not root and no sudo"
    sudo -n true 2>/dev/null || skip "not root and sudo asks for a password"
    exec sudo -n bash "$0" "$@"
fi
command -v apt-get >/dev/null 2>&1 || skip "no apt-get on this system"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || skip "apt-get update failed"
apt-get install -y -qq --no-install-recommends postgresql >/dev/null || skip "apt-get install postgresql failed"
# Debian's package starts a cluster of its own; the tests never use it.
if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters --no-header | while read -r version name _; do
        pg_ctlcluster "$version" "$name" stop || true
    done
fi
exit 0
