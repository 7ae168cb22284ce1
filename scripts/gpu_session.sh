#!/usr/bin/env bash
# The long call of a session lent a GPU (docs/gpu/README.md): run there, in the repository root, after the kit's
# earlier calls carried .gpukit/base and all but the last model part, with the last part carried by this call.
#
#   bash scripts/gpu_session.sh [SECONDS [STEP ...]]   # SECONDS: the call's budget (default 540), inside the
#                                                      # 600 s limit; STEPs: run only these (default: all but s4c-train)
#
# The steps, in order of value, each under its own timeout and skipped when the budget left cannot hold it.  A step
# that ends within its limit leaves a mark in /tmp/gpu_session.done, so a second call made while the machine is
# still warm (30 s) runs only the steps the first could not:
#   datastore      the embedded model converts and REST's default datastore builds;
#   tests          the suite's GPU-relevant files on CUDA, 8 processes (log: $OUT/tests.log);
#   bench-fp32     the bench, fp32, steps replayed as CUDA graphs, every mode against transformers' `generate`
#                  (with a static cache, compiled, and eager), HumanEval, 128 new tokens: $OUT/<gpu>_fp32.json;
#   bench-bf16     the same modes in bf16 (the identical share per mode): $OUT/<gpu>_bf16.json;
#   breakdown      where an AR step's time goes (graph, eager work, Python), fp32 and bf16, and fp32 through the
#                  transformers layer: $OUT/breakdown.txt (JSON lines, then the profile of one fp32 engine run);
#   curves         verification cost, 0-128 nodes, through the graphed steps: the embedded model fp32, random
#                  Llama-1B/8B shapes bf16: $OUT/curves.jsonl;
#   bf16-one-bucket  bf16 with every step in one 65-row bucket (batch-invariance by construction);
#   layers-ab      the fp32 bench's modes through the transformers layer (SPECDEMO_FUSED_DECODER=0), the fused step's
#                  comparison: $OUT/<gpu>_fp32_transformers_layer.json;
#   tasks-distill  (named only, with a kit packed with TASKS=N) the kit's task requests answered, 128 tokens each:
#                  $OUT/tasks_distill_gpu.jsonl.gz (and its log), which s4c-train in the same call reads too;
#   s4c-train      (named only) S4C's heads, two epochs over every corpus from the heads carried in
#                  .gpukit/s4c-init (or the shipped ones), the target's features in 32k-token batches; what it does
#                  not finish by its time budget it saves: $OUT/s4c_train.log and the heads with their config as
#                  $OUT/s4c_heads.tgz.NN (split: a file comes back only under 16 MiB); S4C_TAG names a variant's files.
#                  S4C_INIT=none trains from scratch, S4C_EXTRA adds flags (the last of a repeated flag wins), e.g.
#                  S4C_INIT=none S4C_EXTRA="--feature-layers 2 15 --epochs 12" for heads reading fused layers.
#   sdsat-train    (named only) SDSAT's adapter, warm-started from the shipped one, over every corpus: 32 sequences a
#                  step in one forward (`--batch`), bf16 autocast; what it does not finish by its time budget it
#                  saves: $OUT/sdsat_train.log and the adapter's four files in $OUT/sdsat_adapter.tar (for
#                  assets/sdsat/embedded/); SDSAT_TAG and SDSAT_EXTRA run a variant beside it (below).
# The suite needs the embedded model converted before its 8 workers start: the datastore step converts it.
# At most 8 files come back from $OUT: the default steps write 8, `tasks-distill s4c-train` 6.  (fp32 sampling,
# measured on 2026-11-26: identical 1.00 in every mode, is `$B --dtype float32 --methods $MODES --temperature 0.8
# --top-p 0.9` when wanted again.)
# Every step runs alone: a timing beside other work measures the contention.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-540}
WANT=("${@:2}")
END=$((SECONDS + BUDGET))
DONE=/tmp/gpu_session.done
mkdir -p "$DONE"
exec > >(tee -a "$OUT/session.log") 2>&1

left() { echo $((END - SECONDS)); }
step() {  # step NAME CAP COMMAND...: run under min(CAP, time left - 15 s reserve) unless done earlier, or skip
    local name=$1 cap=$2; shift 2
    if [ ${#WANT[@]} -gt 0 ] && [[ " ${WANT[*]} " != *" ${name%%_*} "* ]]; then return 0; fi  # a tag: _NAME
    if [ ${#WANT[@]} -eq 0 ] && [[ "$name" == *-train* ]]; then return 0; fi
    if [ -f "$DONE/$name" ]; then echo "== $name: done in an earlier call" >&2; return 0; fi
    local t; t=$(( $(left) - 15 )); [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 30 ]; then echo "== $name: skipped ($(left) s left)" >&2; return 1; fi
    echo "== $name (limit ${t} s, $(left) s left) $(date +%T)" >&2
    local t0=$SECONDS; timeout "$t" "$@"; local rc=$?
    echo "== $name: rc $rc after $((SECONDS - t0)) s" >&2
    [ "$rc" -ne 124 ] && touch "$DONE/$name"  # a failure would fail again; only a step cut short runs again
    return $rc
}

bash scripts/gpu_kit.sh unpack
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi -L; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
    transformers.__version__, torch.cuda.get_device_name())'
GPU=$(python3 -c 'import torch; n = torch.cuda.get_device_name().lower(); print("h200" if "h200" in n else "h100")')
B="python3 -m specdemo bench --device cuda --precision fp32 --prompts humaneval --limit 10 --max-new-tokens 128"
MODES=ar,pld,rest,s4c,sdsat

step datastore 120 python3 -m specdemo datastore default
step tests 170 bash -c "python3 -m pytest -n 8 -v -rfE -p no:cacheprovider --timeout 160 tests/test_cuda_graphs.py \
    tests/test_static_shapes.py tests/test_engine.py tests/test_precision.py tests/test_s4c.py tests/test_sdsat.py \
    tests/test_rest.py > $OUT/tests.log 2>&1"; [ -f "$OUT/tests.log" ] && tail -25 "$OUT/tests.log"
step bench-fp32 230 $B --dtype float32 --methods $MODES,hf-static,hf --json "$OUT/${GPU}_fp32.json"
step bench-bf16 110 $B --dtype bfloat16 --methods $MODES --json "$OUT/${GPU}_bf16.json"
step breakdown 120 bash -c "{ python3 scripts/gpu_step_breakdown.py --dtype float32 --trace /tmp/trace_fp32.txt &&
    python3 scripts/gpu_step_breakdown.py --dtype bfloat16 &&
    SPECDEMO_FUSED_DECODER=0 python3 scripts/gpu_step_breakdown.py --dtype float32 && cat /tmp/trace_fp32.txt; } \
    > $OUT/breakdown.txt"
step curves 110 bash -c 'for m in "--model embedded --dtype float32" "--random llama-1b --dtype bfloat16" \
    "--random llama-8b --dtype bfloat16"; do
    python3 scripts/verify_cost_curve.py $m --device cuda --sizes 0,1,2,4,8,16,32,64,128; done > "$OUT/curves.jsonl"'
step bf16-one-bucket 90 env SPECDEMO_STATIC_BUCKETS=64 $B --dtype bfloat16 --methods $MODES \
    --json "$OUT/${GPU}_bf16_one_bucket.json"
step layers-ab 110 env SPECDEMO_FUSED_DECODER=0 $B --dtype float32 --methods $MODES \
    --json "$OUT/${GPU}_fp32_transformers_layer.json"
# the kit's task requests (TASKS=N at pack), answered in fp32 like every corpus; resumable from its journal
TASKS_OUT=/tmp/tasks_distill_gpu.jsonl.gz
TASKS_MIN=$(python3 -c "print(round(max($(left) - 60, 60) / 60, 2))")
[ -f /tmp/gpukit/base/tasks.jsonl.gz ] && step tasks-distill "$(( $(left) - 30 ))" bash -c "python3 -m specdemo \
    distill --prompts /tmp/gpukit/base/tasks.jsonl.gz --out $TASKS_OUT --max-new-tokens 128 --max-prompt-tokens 768 \
    --batch-size 192 --batch-tokens 0 --device cuda --minutes $TASKS_MIN > $OUT/tasks_distill.log 2>&1"
[ -f $TASKS_OUT ] && cp $TASKS_OUT "$OUT/"
INIT=/tmp/gpukit/s4c-init; [ -f $INIT/model.safetensors ] || INIT=assets/s4c/smollm2-135m-instruct
INIT_ARG="--init ${S4C_INIT:-$INIT}"; [ "${S4C_INIT:-}" = none ] && INIT_ARG=""
# every corpus the datastore and the decontamination test read (corpus.distilled_corpora: the shipped ones, then every
# finished shard) and the task answers of this call; --first takes 1,600 records of sharegpt_distill (the second) and
# all of every other corpus
CORPORA="$(python3 -c 'from specdemo.offline.corpus import distilled_corpora as d; print(*d())') $(ls $TASKS_OUT 2>/dev/null)"
FIRST="0 1600"; for _ in $(echo $CORPORA | cut -d' ' -f3-); do FIRST="$FIRST 0"; done
S4C_TAG=${S4C_TAG:-}  # names a variant's step and files, as SDSAT_TAG does below
# the time budget (features included) ends 55 s before the step's limit: the held-out evaluation and the save follow it
S4C_CAP=$(( $(left) - 30 )); S4C_MIN=$(python3 -c "print(round(max($S4C_CAP - 55, 60) / 60, 2))")
step s4c-train$S4C_TAG "$S4C_CAP" bash -c "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 python3 -m specdemo train s4c \
    --model embedded --device cuda $INIT_ARG --data $(echo $CORPORA) --first $FIRST \
    --out /tmp/s4c_gpu$S4C_TAG --epochs 2 --minutes $S4C_MIN --batch-size 32 --lr 3e-4 --warmup 20 --autocast bf16 \
    --feature-batch-tokens 32768 --log-every 20 --eval-every 100000 --ckpt-every 50 ${S4C_EXTRA:-} \
    > $OUT/s4c_train$S4C_TAG.log 2>&1"
# the heads and their config as one compressed tar in pieces: a file comes back only under 16 MiB
# (here: `cat s4c_heads.tgz.?? | tar -xz -C DIR`)
[ -f /tmp/s4c_gpu$S4C_TAG/model.safetensors ] && tar -C /tmp/s4c_gpu$S4C_TAG -cz config.json model.safetensors \
    | split -b 15M -d -a 2 - "$OUT/s4c_heads$S4C_TAG.tgz."
# SDSAT's run 4 took 1.2 s a step of 8 sequences, one forward pair each; here a step's 32 go through in one pair.
# SDSAT_EXTRA adds flags (the last of a repeated flag wins) and SDSAT_TAG names the run's files, so that two variants
# can train side by side: `SDSAT_TAG=_wide SDSAT_EXTRA="--targets ..." bash scripts/gpu_session.sh N sdsat-train &`
SDSAT_TAG=${SDSAT_TAG:-}
SDSAT_CAP=$(( $(left) - 30 )); SDSAT_MIN=$(python3 -c "print(round(max($SDSAT_CAP - 60, 60) / 60, 2))")
step sdsat-train$SDSAT_TAG "$SDSAT_CAP" bash -c "python3 -m specdemo train sdsat --model embedded --device cuda \
    --init assets/sdsat/embedded --data $(echo $CORPORA) --out /tmp/sdsat_gpu$SDSAT_TAG --targets gate_proj,up_proj \
    --L 3 --rank 16 --alpha 16 --lr 5e-4 --warmup 10 --steps 100000 --minutes $SDSAT_MIN --seqs-per-step 32 --batch 32 \
    --autocast bf16 --rate 0.3 --max-probes 320 --heldout-max 64 --eval-every 100000 --ckpt-every 50 --seed 5 \
    ${SDSAT_EXTRA:-} > $OUT/sdsat_train$SDSAT_TAG.log 2>&1"
# one file for the adapter's four: at most 8 files come back
[ -f /tmp/sdsat_gpu$SDSAT_TAG/adapter_model.safetensors ] && tar -C /tmp/sdsat_gpu$SDSAT_TAG \
    -cf "$OUT/sdsat_adapter$SDSAT_TAG.tar" adapter_model.safetensors adapter_config.json sdsat_embedding.safetensors \
    sdsat_config.json
ls -la "$OUT"
