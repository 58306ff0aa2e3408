#!/usr/bin/env bash
# A second interpreter environment with transformers 5.17 (the GPU machine's release) over the same torch,
# so tests/nexus/test_compat.py can prove the cache works on both releases. Idempotent.
set -euo pipefail
VENV=${NEXUS_TF517_VENV:-/opt/nexus-tf517}
if ! "$VENV/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '5.17.0')" 2>/dev/null; then
  python -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q 'transformers==5.17.0'
fi
"$VENV/bin/python" -c "import transformers; print('transformers', transformers.__version__, 'in', '$VENV')"
