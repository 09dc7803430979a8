#!/usr/bin/env bash
# Rebuilds this fixture with the previous release of jaxformer (see README.md). Run from the repo root:
#   bash tests/data/legacy_gpt_jax010/make_fixture.sh
set -euo pipefail
HERE=tests/data/legacy_gpt_jax010
OLD=${OLD:-/tmp/jaxformer-8116153}      # checkout of the previous release
VENV=${VENV:-/tmp/jaxformer-old-venv}   # Python 3.11 + jax 0.10.2 / orbax 0.12.4 / flax 0.12.8
[ -d "$OLD" ] || git worktree add "$OLD" 8116153
if [ ! -x "$VENV/bin/python" ]; then
  python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q jax==0.10.2 jaxlib==0.10.2 orbax-checkpoint==0.12.4 flax==0.12.8 \
    optax==0.2.8 "ml-collections>=1.0,<2" "absl-py>=2.1,<3" "numpy>=1.26,<3" "sentencepiece>=0.2,<0.3" \
    "tensorflow-datasets>=4.9.7,<5" "array-record>=0.7,<0.9" "grain>=0.2.12,<0.3" "tensorboardX>=2.6,<3" \
    "tqdm>=4.66,<5" "sacrebleu>=2.4,<3" "safetensors>=0.4,<0.9" "matplotlib>=3.8,<4" "importlib_resources>=6"
fi
TMP=$(mktemp -d)
FLAGS=$("$VENV/bin/python" -c "import sys; sys.path.insert(0, '$HERE'); from make_reference import OVERRIDES, STEPS
print(' '.join(f'--config.{k}={v}' for k, v in {**OVERRIDES, 'num_train_steps': STEPS}.items()))")
(cd "$OLD" && JAX_PLATFORMS=cpu PYTHONPATH="$OLD" "$VENV/bin/python" train.py \
   --config configs/gpt_pretrain_tiny.py --workdir "$TMP/run" $FLAGS)
rm -rf "$HERE/workdir" && mkdir -p "$HERE/workdir"
cp -r "$TMP/run/config.json" "$TMP/run/tokenizer.model" "$TMP/run/metrics.jsonl" "$TMP/run/checkpoints" \
  "$HERE/workdir/"   # tensorboard/ left out: event files named after the host, not needed
(cd "$OLD" && JAX_PLATFORMS=cpu PYTHONPATH="$OLD" "$VENV/bin/python" "$OLDPWD/$HERE/make_reference.py" \
   "$OLDPWD/$HERE/workdir" "$OLDPWD/$HERE/reference.json")
rm -rf "$TMP"
du -sb "$HERE"
