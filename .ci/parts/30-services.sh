#!/usr/bin/env bash
# Start the real services the `services` tests use: Redis on 127.0.0.1:6379 and PostgreSQL on
# 127.0.0.1:5432 with a test role/database (nexus / nexus / nexus_test; the role may CREATEDB so tests can
# make throw-away databases). Installs the Debian packages when missing. Idempotent: quick when already up.
# Tests read NEXUS_TEST_PG_URL (default postgresql+psycopg://nexus:nexus@127.0.0.1:5432/nexus_test) and
# NEXUS_TEST_REDIS_URL (default redis://127.0.0.1:6379/0).
set -euo pipefail

PG_USER=nexus
PG_PASSWORD=nexus
PG_DB=nexus_test

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v pg_ctlcluster >/dev/null || need+=(postgresql)
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- Redis: a loopback-only, non-persistent instance (tests may restart it) ---
if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
  echo "starting redis-server on 127.0.0.1:6379"
  as_root mkdir -p /var/lib/redis-ci
  as_root redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save "" --appendonly no \
    --dir /var/lib/redis-ci --logfile /var/lib/redis-ci/redis.log
fi

# --- PostgreSQL: the packaged cluster (created by the postgresql package), or one we create ---
PG_VERSION="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$PG_VERSION main$"; then
  echo "creating cluster $PG_VERSION/main"
  as_root pg_createcluster "$PG_VERSION" main --port 5432 >/dev/null
fi
if ! pg_lsclusters -h | awk -v v="$PG_VERSION" '$1==v && $2=="main" {print $4}' | grep -q online; then
  echo "starting PostgreSQL $PG_VERSION/main on 127.0.0.1:5432"
  as_root pg_ctlcluster "$PG_VERSION" main start
fi

wait_for() {  # wait_for NAME CMD...: up to 30 s for CMD to succeed
  local name="$1"; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "ERROR: $name did not come up" >&2
  return 1
}
wait_for redis sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'
wait_for postgresql as_root su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432"

psql_admin() { as_root su postgres -c "psql -v ON_ERROR_STOP=1 -qtA -p 5432 $*"; }
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname='$PG_USER'\"")" != 1 ]; then
  psql_admin "-c \"CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD'\""
fi
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname='$PG_DB'\"")" != 1 ]; then
  psql_admin "-c \"CREATE DATABASE $PG_DB OWNER $PG_USER\""
fi
# The password login over TCP is what the tests use; check it end to end.
wait_for "postgresql login as $PG_USER" env PGPASSWORD="$PG_PASSWORD" \
  psql -h 127.0.0.1 -p 5432 -U "$PG_USER" -d "$PG_DB" -qtAc "SELECT 1"
echo "services up: redis://127.0.0.1:6379/0 postgresql://$PG_USER@127.0.0.1:5432/$PG_DB"
