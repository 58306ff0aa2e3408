#!/usr/bin/env bash
# Debian's chromium (and chromium-driver) for the dashboard page tests (tests/dashboard): Playwright drives this
# system browser through executable_path and never downloads its own. Idempotent and quick when installed.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "installing chromium chromium-driver"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
chromium --version 2>/dev/null | head -n1
