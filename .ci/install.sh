#!/usr/bin/env bash
# Install Python deps and the system services the tests use; start them. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q -e ".[dev]"
for part in .ci/parts/*.sh; do
  [ -e "$part" ] || continue
  echo "== $part"
  bash "$part"
done
