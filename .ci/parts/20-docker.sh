#!/usr/bin/env bash
# Docker for the sandbox, task and grading tests, through the same code as the README's `nexus-eval setup` (env/sandbox/docker_daemon.py):
# Debian's docker.io + debootstrap when missing, dockerd started with no bridge / iptables / masquerading
# (containers only ever use network_mode=none), then the offline base image. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/../.."

# `nexus-eval setup` with the interpreter install.sh installed into; task images are built by the tests
python -m nexus_eval.cli setup --no-task-images --no-model  # the model: 35-models.sh
