#!/usr/bin/env bash
# Docker engine for the env tests: Debian's docker.io, started with no bridge / iptables / masquerading
# (containers only ever use network_mode=none), then the offline base image. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io debootstrap >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  mkdir -p /var/log
  nohup dockerd --bridge=none --iptables=false --ip-masq=false >>/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see /var/log/dockerd.log" >&2; tail -20 /var/log/dockerd.log >&2; exit 1; }
fi

# nexus-eval images build-base is a no-op when the tag exists (about 60-90 s when it does not)
if ! docker image inspect nexus-eval/base:bookworm-1 >/dev/null 2>&1; then
  nexus-eval images build-base
fi
