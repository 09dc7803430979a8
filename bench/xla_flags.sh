#!/bin/bash
# XLA:CPU flag sweep: each setting in its own process; ours vs HF Flax in the same process.
cd "$(dirname "$0")/.."
fam=${1:-gpt}
for flags in "" "--xla_cpu_enable_fast_math=true" "--xla_cpu_prefer_vector_width=512" "--xla_cpu_use_xnnpack=true" "--xla_cpu_experimental_ynn_fusion_type=" "--xla_cpu_use_onednn=true" "--xla_cpu_enable_concurrency_optimized_scheduler=true"; do
  echo "=== XLA_FLAGS='$flags' $(uptime)"
  XLA_FLAGS="$flags" PYTHONPATH=. timeout 400 .venv-peers/bin/python bench/train_families.py --families $fam --no_torch --scan_compile '' --steps 4 2>&1 | grep -v "Deprec\|deprecated\|^{" | tail -5
done
echo "=== end $(uptime)"
