#!/usr/bin/env bash
# Train the dense and the MoE tiny model side by side on one GPU (two processes: at this size each
# step is bound by kernel launches, so two runs share the GPU well), then pack what comes back.
#
#   tools/train/gpu_run.sh DATA_DIR OUT_DIR SECONDS BATCH [extra train.py arguments...]
#
# OUT_DIR receives dense.tar, moe.tar.part-* (split under 15 MiB: the device tool returns files of
# at most 16 MiB), {dense,moe}-loss.csv and {dense,moe}.log. Reassemble with `cat moe.tar.part-* | tar x`.
set -u
data=$1 out=$2 seconds=$3 batch=$4
shift 4
export PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for m in dense moe; do
  python3 tools/train/train.py --model $m --data "$data" --out "$out/$m" --time-limit "$seconds" \
    --steps 1000000 --batch "$batch" "$@" > "$out/$m.log" 2>&1 &
done
wait
for m in dense moe; do
  tail -n 3 "$out/$m.log"
  cp "$out/$m/loss.csv" "$out/$m-loss.csv" 2>/dev/null
  if [ -d "$out/$m/hf" ]; then
    tar cf "$out/$m.tar" -C "$out/$m" hf summary.json loss.csv
    if [ "$(stat -c %s "$out/$m.tar")" -gt 15728640 ]; then
      split -b 15M "$out/$m.tar" "$out/$m.tar.part-" && rm "$out/$m.tar"
    fi
  fi
  rm -rf "${out:?}/$m"
done
ls -la "$out"
