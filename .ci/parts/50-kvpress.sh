#!/usr/bin/env bash
# kvpress 0.5.5 (pins transformers < 5.3) in its own virtual environment, for bench/kvpress_parity.py and
# tests/bench/test_bench_kvpress.py. Idempotent: a quick metadata check when the venv is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."
python bench/kvpress_parity.py --setup-only
