#!/usr/bin/env bash
# The GPU checks, as one script. STEPS picks some (default: all, about 12 minutes on one H200):
#   correctness  fused vs reference attention, KV cache, bf16 vs fp32 (bench/gpu_correctness.py)
#   decoding     context shift, batched and ragged sampling, beam search (bench/gpu_decoding.py)
#   throughput   gpt2-124m with bf16 + torch.compile: ms/step and MFU against the GPU's measured
#                bf16 matmul peak (bench/train_throughput.py, 50 timed steps)
#   torchrun     50 steps of the real CLI on that preset through torchrun (DDP, nccl)
#   shard        FSDP (--shard) through torchrun with nccl, 60 steps, then --resume to 100
#   modern       gpt2-124m against gpt2-124m-modern, with AdamW and with Muon, at one token
#                budget: tokens/s, MFU, val loss (bench/gpu_modern.py, about 5 minutes)
#   mlm          masked-LM steps with every position or the chosen ones through the head, bf16,
#                eager and compiled (bench/mlm_head.py); then 100 steps of the real CLI,
#                bert-base compiled
#   OUT=/tmp/gpu bash bench/gpu_check.sh
#   OUT=/tmp/gpu STEPS="decoding shard" bash bench/gpu_check.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
STEPS=${STEPS:-correctness decoding throughput torchrun shard modern mlm}
want() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
if want correctness; then
  timeout 90 python3 bench/gpu_correctness.py 2>&1 | tee "$OUT/correctness.txt"
fi
if want decoding; then
  timeout 120 python3 bench/gpu_decoding.py 2>&1 | tee "$OUT/decoding.txt"
fi
if want throughput; then
  timeout 200 python3 bench/train_throughput.py --preset gpt2-124m --device cuda \
    --dtype bfloat16 --compile on --iters 50 --warmup 10 --set batch_size=16 2>&1 \
    | grep -v Warning | tail -3 | tee "$OUT/throughput.txt"
fi
if want torchrun; then
  timeout 240 torchrun --standalone --nproc_per_node 1 -m minitransformer train \
    --data shakespeare --preset gpt2-124m --max_iters 50 --eval_interval 50 --eval_iters 5 \
    --log_interval 10 --sample_tokens 60 --device cuda --dtype bfloat16 --compile on \
    --warmup_iters 10 --learning_rate 3e-4 --force --quiet --out /tmp/run2 2>&1 | tail -12 \
    | tee "$OUT/cli_torchrun.txt"
  cp /tmp/run2/log.csv "$OUT/log_torchrun.csv"
fi
if want shard; then
  shard() {
    timeout 150 torchrun --standalone --nproc_per_node 1 -m minitransformer train --shard \
      --data shakespeare --preset cpu-small-modern --optimizer adamw --eval_interval 30 \
      --eval_iters 10 --log_interval 10 --time_budget none --device cuda --dtype bfloat16 \
      --quiet --out /tmp/run_shard "$@" 2>&1 | tail -6
  }
  { shard --max_iters 60 --force; shard --max_iters 100 --resume; } | tee "$OUT/shard.txt"
  cp /tmp/run_shard/log.csv "$OUT/log_shard.csv"
fi
if want modern; then
  timeout 480 python3 bench/gpu_modern.py --tokens 5000000 --out /tmp/gpu_modern 2>&1 \
    | grep -v Warning | tail -8 | tee "$OUT/modern.txt"
  cp /tmp/gpu_modern/results.json "$OUT/modern.json"
fi
if want mlm; then
  for c in "" --compile; do
    timeout 200 python3 bench/mlm_head.py --device cuda --dtype bfloat16 --batch 32 \
      --block-size 512 --steps 10 --rounds 3 $c 2>&1 | grep -v Warning | tail -5
  done | tee "$OUT/mlm_head.txt"
  timeout 240 python3 -m minitransformer train --model encoder --data shakespeare \
    --preset bert-base --max_iters 100 --eval_interval 50 --eval_iters 5 --log_interval 10 \
    --time_budget none --device cuda --dtype bfloat16 --compile on --force --sample_tokens 0 \
    --out /tmp/run_mlm 2>&1 | grep -v Warning | tail -8 | tee "$OUT/mlm_cli.txt"
fi
