#!/usr/bin/env bash
# The GPU checks, as one script (about 4 minutes on one H200):
# 1. correctness on CUDA: fused vs reference attention, KV cache, bf16 vs fp32;
# 2. gpt2-124m training speed with bf16 + torch.compile, MFU against the GPU's measured
#    bf16 matmul peak (bench/train_throughput.py, 50 timed steps);
# 3. 50 steps of the real CLI on that preset through torchrun with the nccl backend.
#   OUT=/tmp/gpu bash bench/gpu_check.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
timeout 90 python3 bench/gpu_correctness.py 2>&1 | tee "$OUT/correctness.txt"
timeout 200 python3 bench/train_throughput.py --preset gpt2-124m --device cuda \
  --dtype bfloat16 --compile on --iters 50 --warmup 10 --set batch_size=16 2>&1 \
  | grep -v Warning | tail -3 | tee "$OUT/throughput.txt"
timeout 240 torchrun --standalone --nproc_per_node 1 -m minitransformer train \
  --data shakespeare --preset gpt2-124m --max_iters 50 --eval_interval 50 --eval_iters 5 \
  --log_interval 10 --sample_tokens 60 --device cuda --dtype bfloat16 --compile on \
  --warmup_iters 10 --learning_rate 3e-4 --force --quiet --out /tmp/run2 2>&1 | tail -12 \
  | tee "$OUT/cli_torchrun.txt"
cp /tmp/run2/log.csv "$OUT/log_torchrun.csv"
