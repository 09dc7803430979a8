#!/bin/bash
# ModernBERT vs BERT of equal size (1.08M / 1.09M parameters): the demo's BERT path for each.
# Usage: demo_results/modernbert/run.sh modernbert|bert  (docs/models.md, "ModernBERT")
cd "$(dirname "$0")/../.." && export PYTHONPATH=$PWD  # the repository root
MB=""
for c in bert_pretrain_tiny bert_finetune_tiny; do
  for kv in model.position=rope model.rope_theta=160000.0 model.local_rope_theta=10000.0 \
            model.local_attention=32 model.global_attn_every_n_layers=3 model.first_attn_norm=False \
            model.norm_position=pre model.norm_bias=False model.norm_eps=1e-5 model.gated_ffn=True \
            model.use_bias=False model.type_vocab_size=0 model.d_ff=352 model.pooler=False; do
    MB="$MB --set $c:$kv"
  done
done
MB="$MB --set bert_finetune_tiny:model.prediction_head=True"
which=$1
if [ "$which" = modernbert ]; then EXTRA="$MB"; else EXTRA=""; fi
exec nice -n 5 .venv/bin/python -m demo --only bert --sizes bert=250 --seeds 3 --pretrain_scale 0.4 \
  --workdir runs/mb_demo_$which --out demo_results/modernbert/$which $EXTRA
