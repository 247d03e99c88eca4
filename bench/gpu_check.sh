#!/usr/bin/env bash
# The GPU checks, as one script: correctness on CUDA, gpt2-124m training speed (bf16 +
# torch.compile) with MFU against the GPU's measured matmul peak, then 50 steps of the real
# CLI, in one process and through torchrun with the nccl backend.
#   OUT=/tmp/gpu bash bench/gpu_check.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
timeout 120 python3 bench/gpu_correctness.py 2>&1 | tee "$OUT/correctness.txt"
for c in on off; do
  timeout 180 python3 bench/train_throughput.py --preset gpt2-124m --device cuda \
    --dtype bfloat16 --compile $c --iters 40 --warmup 8 --set batch_size=16 2>&1 \
    | grep -v Warning | tail -3 | tee -a "$OUT/throughput.txt"
done
ARGS="train --data shakespeare --preset gpt2-124m --max_iters 50 --eval_interval 50
  --eval_iters 5 --log_interval 10 --sample_tokens 60 --device cuda --dtype bfloat16
  --compile on --warmup_iters 10 --learning_rate 3e-4 --force --quiet"
timeout 200 python3 -m minitransformer $ARGS --out /tmp/run1 2>&1 | tail -8 | tee "$OUT/cli_single.txt"
cp /tmp/run1/log.csv "$OUT/log_single.csv"
timeout 200 torchrun --nproc_per_node 1 -m minitransformer $ARGS --out /tmp/run2 2>&1 | tail -8 \
  | tee "$OUT/cli_torchrun.txt"
cp /tmp/run2/log.csv "$OUT/log_torchrun.csv"
