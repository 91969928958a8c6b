#!/usr/bin/env bash
# A continuation stage (stages 2 and 3) on the GPU machine: several runs side by side, each continuing a
# checkpoint of the stage before on a new mix, then a teacher-forced check of each (quick_eval.py).
#
#   tools/train/gpu_stage2.sh DATA_DIR INIT_DIR OUT_DIR SECONDS BATCH RUN...
#
# INIT_DIR holds dense.tar.xz / moe.tar.xz (each an hf/ folder of the previous stage's checkpoint).
# RUN is NAME:MODEL:LR (MODEL dense or moe), e.g. d1:dense:1e-3. Runs are spread over the machine's
# GPUs (run i on GPU i mod n); several runs on one GPU share it (its throughput splits between them).
# OUT_DIR receives NAME.tar.part-* per run (hf/ without the tokenizer files, summary.json, loss.csv,
# quick.json; split under the device tool's 16 MiB per file: `cat NAME.tar.part-* | tar x`) and
# runs.log (every run's log and check). QUICK=0 skips quick_eval.py (it takes ~1 min for the MoE).
set -u
data=$1 init=$2 out=$3 seconds=$4 batch=$5
shift 5
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for m in dense moe; do
  mkdir -p "$work/init-$m" && tar xJf "$init/$m.tar.xz" -C "$work/init-$m" || exit 1
done
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -gt 0 ] || ngpu=1
i=0
for spec in "$@"; do
  IFS=: read -r name model lr <<<"$spec"
  moe=""; [ "$model" = moe ] && moe=--moe
  ( export CUDA_VISIBLE_DEVICES=$((i % ngpu))
    python3 tools/train/train.py --model "$model" --data "$data" --out "$work/$name" --init "$work/init-$model/hf" \
      --time-limit "$seconds" --steps 1000000 --batch "$batch" --lr "$lr" --warmup 50 &&
    if [ "${QUICK:-1}" = 1 ]; then
      python3 tools/train/quick_eval.py --hf "$work/$name/hf" --data "$data" $moe --out "$work/$name/quick.json"
    fi
  ) > "$work/$name.log" 2>&1 &
  i=$((i + 1))
done
wait
for spec in "$@"; do
  IFS=: read -r name model lr <<<"$spec"
  { echo "===== $spec"; cat "$work/$name.log"; } >> "$out/runs.log"
  tail -n 1 "$work/$name.log"
  if [ -f "$work/$name/hf/model.safetensors" ]; then
    rm -f "$work/$name/hf/tokenizer.json" "$work/$name/hf/tokenizer_config.json"
    tar cf - -C "$work/$name" hf summary.json loss.csv $(cd "$work/$name" && ls quick.json 2>/dev/null) |
      split -b 15M - "$out/$name.tar.part-"
  fi
done
ls -la "$out"
