#!/usr/bin/env bash
# One time-boxed GPU benchmark run (the paper's Table 4/5 setting), from the repository root:
#   1. environment: torch, CUDA, flash-attn, GPU memory, copy bandwidth, bf16 matmul rate  -> env.json
#   2. bench/stack_check.py: the stacked decode's flash path against masked sdpa (tiny model, bf16) -> stack_check.json
#      bench/batch.py: qwen3-32b shape (all 64 layers, random weights), bf16, N = 1 and 8 conversations decoded
#      together through one nexus.CacheStack, 8K ragged prompts (8 distinct, 37 tokens apart), 64 timed steps,
#      dense vs nexus (prefill_decode), plus each method's unstacked batch-1 decode            -> batch.json
#      (capped at GPU_BENCH_BATCH_BOX seconds, default 180; step 3 then gets what is left of the box)
#   3. bench/decode.py: llama-3.1-8b shape (random weights), bf16, batch 1, 8K prefill, decode to 8K with
#      reports at 1K/2K/4K/8K, dense vs snapkv (prefill_only) vs morphkv vs nexus (prefill_decode),
#      flash_attention_2 if installed else sdpa                                               -> decode.json
#   4. quality probes on a GPU-sized real model, when GPU_PROBE_MODEL names one (a local path to Qwen3-8B or
#      DeepSWE-Preview; nothing is downloaded): `nexus-eval probe run` with every method x scope at densities
#      0.1/0.2/0.3, needle / later-turn (both protocols) / nll, GPU_PROBE_SAMPLES samples (default 30) of
#      GPU_PROBE_LENGTHS tokens (default 4096,8192)                                         -> probes.json, probes.md
#      (the same tables docs/probes.md shows for smollm2-135m on a CPU; --dry-run: the tiny model, 2 samples)
#   5. the agent's case on a GPU-sized model, when GPU_AGENT_MODEL names one (a local Qwen3-8B or DeepSWE-Preview
#      path) and GPU_AGENT_DB a results file holding an expert job (the demonstrations, run where Docker is):
#      `nexus-eval replay` of that job on the model, every method x scope x protocol at 0.1/0.2/0.3, then its
#      compare tables (the action table: docs/agent_case.md)                          -> agent.db, agent.json, agent.md
#   6. measurement throughput on the GPU-sized probe model (GPU_PROBE_MODEL), or the tiny model with --dry-run:
#      bench/throughput.py --parts probe,probe_full --variants float32,bfloat16 --processes 1 (every cell of a
#      sample as rows of one stack, one process: the GPU batches the rows)                    -> throughput.json
# Everything lands in one folder: $OUT if set (the device tool's), else bench/out/gpu-<UTC date>; the whole
# log is gpu.log there. The script never runs past GPU_BENCH_BOX seconds (default 450): every step runs
# under `timeout`, and decode.py shares what is left among the methods (a method that cannot finish its
# 8K decode in its share stops early and is marked truncated in decode.json and the table).
#
#   bench/gpu.sh                       # on the GPU machine
#   bench/gpu.sh --dry-run             # CPU, tiny shape, small sizes: checks the script end to end
#   GPU_BENCH_METHODS="dense nexus" GPU_BENCH_BOX=420 bench/gpu.sh     # a subset, e.g. to split 2 sessions
#   GPU_BENCH_PARTS=batch bench/gpu.sh                                   # only the batched decode (step 2)
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY=${PYTHON:-python3}
BOX=${GPU_BENCH_BOX:-450}
METHODS=${GPU_BENCH_METHODS:-"dense snapkv@prefill_only morphkv nexus"}
PROBE_MODEL=${GPU_PROBE_MODEL:-}
AGENT_MODEL=${GPU_AGENT_MODEL:-}
PARTS=${GPU_BENCH_PARTS:-"batch decode${PROBE_MODEL:+ probes}${AGENT_MODEL:+ agent}${PROBE_MODEL:+ throughput}"}
ALL_METHODS="dense,snapkv,pyramidkv,ada_snapkv,ada_pyramidkv,h2o,morphkv,streaming_llm,nexus,ada_nexus"
BATCH_BOX=${GPU_BENCH_BATCH_BOX:-180}
DIR=${OUT:-bench/out/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$DIR"
exec > >(tee -a "$DIR/gpu.log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS
left() { echo $((BOX - (SECONDS - START))); }

echo "== bench/gpu.sh $(date -u +%FT%TZ) dry_run=$DRY box=${BOX}s out=$DIR parts=[$PARTS] methods=[$METHODS]"

# Missing pure-Python packages travel as wheels in .whl/ (see docs/benchmarks.md); none are needed today:
# decode.py imports only torch, transformers, rich and nexus/ from this checkout.
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [ "$DRY" = 1 ]; then
  DEVICE=cpu; MODEL=(--model tiny); PREFILL=512; DECODE=64; REPORT=(32 64); DTYPE=float32
  ENV_ARGS=(--device cpu --copy-mib 64 --matmul-n 512); COPY=64
  BATCH=(--model tiny --layers 0 --prompt-tokens 512 --rows 1,2 --steps 16 --distinct-prompts 0 --device cpu
         --dtype float32)
else
  DEVICE=cuda; MODEL=(--model llama-3.1-8b); PREFILL=8192; DECODE=8192; REPORT=(1024 2048 4096 8192); DTYPE=bfloat16
  ENV_ARGS=(--device cuda --copy-mib 2048 --matmul-n 8192); COPY=2048
  BATCH=(--model qwen3-32b --layers 0 --prompt-tokens 8192 --rows 1,8 --steps 64 --warmup 4 --distinct-prompts 0
         --device cuda --dtype bfloat16)
fi

echo "== 1. environment"
$PY --version
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi | tee "$DIR/nvidia-smi.txt"
timeout 20 $PY -c "import torch, transformers, rich; import nexus; nexus.CacheStack; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__, '| nexus + CacheStack ok')" \
  || { echo "FAILED: the Python environment cannot import torch/transformers/rich/nexus"; exit 2; }
timeout 120 $PY bench/common.py "${ENV_ARGS[@]}" --out "$DIR/env.json" || echo "WARNING: environment probe failed (rc $?)"

RC=0
if [[ " $PARTS " == *" batch "* ]] && [ "$DRY" = 0 ]; then
  echo "== 2a. stacked decode: flash path (flash_attn_with_kvcache, per-row lengths) vs masked sdpa"
  timeout 120 $PY bench/stack_check.py --out "$DIR/stack_check.json"
  SRC=$?
  [ "$SRC" = 0 ] || { echo "WARNING: stack_check.py exited with rc $SRC (1: flash and sdpa stacks disagree)"; RC=$SRC; }
fi
if [[ " $PARTS " == *" batch "* ]]; then
  echo "== 2. batched decode through a CacheStack ($(left)s left)"
  CAP=$BATCH_BOX; [ "$(( $(left) - 15 ))" -lt "$CAP" ] && CAP=$(( $(left) - 15 ))
  timeout --kill-after=10 "$CAP" $PY bench/batch.py "${BATCH[@]}" --methods dense,nexus --attn auto --threads 4 \
    --out "$DIR/batch.json"
  BRC=$?
  [ "$BRC" = 0 ] || { echo "WARNING: batch.py exited with rc $BRC (partial results, if any, are in $DIR/batch.json)"; RC=$BRC; }
fi

if [[ " $PARTS " == *" decode "* ]]; then
  echo "== 3. decode throughput and memory ($(left)s left)"
  BUDGET=$(( $(left) - 15 ))
  if [ "$BUDGET" -lt 60 ]; then echo "FAILED: only ${BUDGET}s left for decoding"; exit 3; fi
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$BUDGET" $PY bench/decode.py "${MODEL[@]}" --prefill "$PREFILL" --decode "$DECODE" \
    --report-at "${REPORT[@]}" --methods $METHODS --batch 1 --dtype "$DTYPE" --device "$DEVICE" --attn auto \
    --threads 4 --copy-mib "$COPY" --time-box $((BUDGET - 25)) --out "$DIR/decode.json"
  DRC=$?
  [ "$DRC" = 0 ] || { echo "WARNING: decode.py exited with rc $DRC (partial results, if any, are in $DIR/decode.json)"; RC=$DRC; }
fi
if [[ " $PARTS " == *" probes "* ]]; then
  echo "== 4. quality probes ($(left)s left)"
  if [ "$DRY" = 1 ]; then
    PROBE=(--model tiny --variants dense,snapkv,nexus --samples 2 --lengths 256 --densities 0.5 --threads 1)
  else
    PROBE=(--model "$PROBE_MODEL" --variants "$ALL_METHODS" --scopes prefill_only,prefill_decode --densities 0.1,0.2,0.3
           --samples "${GPU_PROBE_SAMPLES:-30}" --lengths "${GPU_PROBE_LENGTHS:-4096,8192}")
  fi
  BUDGET=$(( $(left) - 15 ))
  timeout --kill-after=10 "$BUDGET" $PY -m nexus_eval.cli probe run "${PROBE[@]}" --db "$DIR/probes.db" \
    --format json -o "$DIR/probes.json"
  PRC=$?
  # the results are stored as they arrive: a run cut by the time box still renders what it finished
  RUN=$($PY -c "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('select id from probe_runs \
order by created_at desc limit 1').fetchone()[0])" "$DIR/probes.db" 2>/dev/null)
  [ -n "$RUN" ] && $PY -m nexus_eval.cli probe show "$RUN" --db "$DIR/probes.db" --format markdown > "$DIR/probes.md"
  [ "$PRC" = 0 ] || { echo "WARNING: probe run exited with rc $PRC (stored results are in $DIR/probes.db)"; RC=$PRC; }
fi
if [[ " $PARTS " == *" agent "* ]]; then
  echo "== 5. the agent's case ($(left)s left)"
  # expert demonstrations (a job run where Docker is, e.g. `nexus-eval run -f examples/agent_case.yaml --tasks '*'`)
  # travel as their SQLite results file; they are replayed here on the GPU-sized model, never re-run
  if [ -z "${GPU_AGENT_DB:-}" ] || [ ! -f "${GPU_AGENT_DB:-}" ]; then
    echo "skipped: GPU_AGENT_DB does not name a results file holding an expert job"
  else
    cp "$GPU_AGENT_DB" "$DIR/agent.db"
    JOB=${GPU_AGENT_JOB:-$($PY -c "import json, sqlite3, sys; rows = sqlite3.connect(sys.argv[1]).execute('select id, \
config from jobs order by created_at desc').fetchall(); print(next(i for i, c in rows if json.loads(c).get('backend') \
== 'expert'))" "$DIR/agent.db" 2>/dev/null)}
    if [ "$DRY" = 1 ]; then
      AGENT=(--model tiny --device cpu --methods dense,snapkv,nexus --scopes prefill_only --densities 0.2)
    else
      AGENT=(--model "$GPU_AGENT_MODEL" --device cuda --methods "$ALL_METHODS" --scopes prefill_only,prefill_decode
             --protocols true_eviction,full_context --densities 0.1,0.2,0.3)
    fi
    BUDGET=$(( $(left) - 15 ))
    timeout --kill-after=10 "$BUDGET" $PY -m nexus_eval.cli replay "$JOB" "${AGENT[@]}" --db "$DIR/agent.db"
    ARC=$?
    # rows are stored as they finish: a replay cut by the time box still shows what it finished
    $PY -m nexus_eval.cli compare "$JOB" --db "$DIR/agent.db" --format json > "$DIR/agent.json"
    $PY -m nexus_eval.cli compare "$JOB" --db "$DIR/agent.db" --format markdown > "$DIR/agent.md"
    [ "$ARC" = 0 ] || { echo "WARNING: replay exited with rc $ARC (stored rows are in $DIR/agent.db)"; RC=$ARC; }
  fi
fi
if [[ " $PARTS " == *" throughput "* ]]; then
  echo "== 6. measurement throughput ($(left)s left)"
  TP_MODEL=${PROBE_MODEL:-tiny}
  [ "$DRY" = 1 ] && TP_MODEL=tiny
  BUDGET=$(( $(left) - 10 ))
  timeout --kill-after=10 "$BUDGET" $PY bench/throughput.py --model "$TP_MODEL" --parts probe,probe_full \
    --variants float32,bfloat16 --processes 1 --samples "$([ "$DRY" = 1 ] && echo 2 || echo 10)" --out "$DIR/throughput.json"
  TRC=$?
  [ "$TRC" = 0 ] || { echo "WARNING: throughput.py exited with rc $TRC"; RC=$TRC; }
fi
echo "== done in $((SECONDS - START))s; files in $DIR:"
ls -l "$DIR"
exit "$RC"
