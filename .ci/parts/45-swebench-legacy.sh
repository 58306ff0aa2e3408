#!/usr/bin/env bash
# swebench 3.0.2 and 4.1.0, each in its own venv (they share the package name with the project's swebench 5.x),
# for env/tasks/swebench_legacy.py (`nexus-eval tasks convert`, R2E-Gym's in-loop reward) and
# tests/env/tasks/test_swebench_legacy.py. Location: $NEXUS_EVAL_SWEBENCH_VENVS/<version>, default
# ~/.cache/nexus-eval/swebench/<version>. Idempotent: nothing is started when both are already built.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c '
from env.tasks.swebench_legacy import LEGACY_VERSIONS, legacy_python
for version in LEGACY_VERSIONS:
    print("swebench", version, "in", legacy_python(version).parent.parent)
'
