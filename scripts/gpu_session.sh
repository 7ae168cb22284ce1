#!/usr/bin/env bash
# The one long call of a session lent a GPU (docs/gpu/README.md): run there, in the repository root, after the kit's
# earlier calls carried .gpukit/base and all but the last model part, with the last part carried by this call.
#
#   bash scripts/gpu_session.sh [SECONDS]     # SECONDS: the call's budget (default 540), inside the 600 s limit
#
# In order of value, each step under its own timeout and skipped when the budget left cannot hold it:
#   1. the kit completes; the embedded model converts and REST's default datastore builds;
#   2. verification cost curves (1-128 nodes), the embedded model fp32 and random Llama-1B/8B shapes bf16, alone
#      (before the distillation: paused, it still holds ~55 GB of GPU memory);
#   3. the distillation of the unfinished ShareGPT shards starts in its own process session (untimed work: it runs
#      beside the tests and is paused, SIGSTOP, while anything is timed);
#   4. the suite's GPU-relevant files on CUDA (log: $OUT/tests.log);
#   5. the bench, fp32, steps replayed as CUDA graphs, every mode against transformers' `generate` (eager and with
#      a static cache, compiled), HumanEval, 128 new tokens: $OUT/<gpu>_fp32.json;
#   6. the same modes in bf16 (the identical share per mode): $OUT/<gpu>_bf16.json, then with every step in one
#      65-row bucket (batch-invariance by construction): $OUT/<gpu>_bf16_one_bucket.json;
#   7. the distillation resumes until the budget ends; the shards and journals come back in $OUT/shards.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-540}
END=$((SECONDS + BUDGET))
LOG=$OUT/session.log
exec > >(tee -a "$LOG") 2>&1

left() { echo $((END - SECONDS)); }
step() {  # step NAME CAP COMMAND...: run under min(CAP, time left - 25 s reserve), or skip
    local name=$1 cap=$2; shift 2
    local t; t=$(( $(left) - 25 )); [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 20 ]; then echo "== $name: skipped ($(left) s left)" >&2; return 1; fi
    echo "== $name (limit ${t} s, $(left) s left) $(date +%T)" >&2
    local t0=$SECONDS; timeout "$t" "$@"; local rc=$?
    echo "== $name: rc $rc after $((SECONDS - t0)) s" >&2
    return $rc
}

touch /tmp/session.start
bash scripts/gpu_kit.sh unpack
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi -L; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, torch.cuda.get_device_name())'
GPU=$(python3 -c 'import torch; n = torch.cuda.get_device_name().lower(); print("h200" if "h200" in n else "h100")')

step datastore 120 python3 -m specdemo datastore default

step curves 100 bash -c 'for m in "--model embedded --dtype float32" "--random llama-1b --dtype bfloat16" \
    "--random llama-8b --dtype bfloat16"; do
    python3 scripts/verify_cost_curve.py $m --device cuda --sizes 0,1,2,4,8,16,32,64,128; done' > "$OUT/curves.jsonl"

setsid nohup python3 -m specdemo distill --prompts /tmp/gpukit/base/prompts.jsonl.gz --heldout 0 \
    --out assets/corpus/sharegpt/ --batch-size 192 --batch-tokens 0 --device cuda > /tmp/distill.log 2>&1 &
sleep 2
DISTILL=$(pgrep -f "specdemo distill" | head -1)
echo "distill: pid ${DISTILL:-none}"
pause() { [ -n "${DISTILL:-}" ] && kill -STOP "$DISTILL" 2>/dev/null; }
resume() { [ -n "${DISTILL:-}" ] && kill -CONT "$DISTILL" 2>/dev/null; }

step tests 130 python3 -m pytest -v -p no:cacheprovider tests/test_cuda_graphs.py tests/test_static_shapes.py \
    tests/test_engine.py tests/test_precision.py tests/test_s4c.py tests/test_sdsat.py tests/test_rest.py \
    2>&1 | tee "$OUT/tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -60

pause
B="python3 -m specdemo bench --device cuda --precision fp32 --prompts humaneval --limit 10 --max-new-tokens 128"
export SPECDEMO_CUDA_GRAPHS=1
step bench-fp32 280 $B --dtype float32 --methods ar,pld,rest,s4c,sdsat,hf,hf-static --json "$OUT/${GPU}_fp32.json"
step bench-bf16 100 $B --dtype bfloat16 --methods ar,pld,rest,s4c,sdsat --json "$OUT/${GPU}_bf16.json"
step bench-bf16-one-bucket 90 env SPECDEMO_STATIC_BUCKETS=64 $B --dtype bfloat16 --methods ar,pld,rest,s4c,sdsat \
    --json "$OUT/${GPU}_bf16_one_bucket.json"
resume

wait_left=$(( $(left) - 20 ))
if [ "$wait_left" -gt 0 ] && [ -n "${DISTILL:-}" ]; then echo "== distill runs $wait_left s more"; sleep "$wait_left"; fi
[ -n "${DISTILL:-}" ] && kill "$DISTILL" 2>/dev/null; sleep 2
tail -5 /tmp/distill.log
find assets/corpus/sharegpt -newer /tmp/session.start -type f | xargs -r tar -cf "$OUT/shards.tar"
ls -la "$OUT"
