#!/usr/bin/env bash
# The GPU run, in one command: install from the project's own files, the real-kernel tests, the
# accelerator benchmark (training-step MFU, cached decoding against the HBM roofline) and a profile
# of one step. Written for a machine with one NVIDIA GPU and no network (wheels of packages its
# Python lacks given as a folder); each stage has a time limit so that a slow one cannot starve the
# rest, and everything lands in OUT as it is made.
#
#   bash bench/gpu.sh OUT [WHEEL_DIR] [STAGES]     # STAGES: comma-separated, default
#        install,tests,bench,suite (bench profiles each step it times; "profile" profiles one
#        step alone, bench/gpu_profile.py with PROFILE_ARGS; "init" times the compile of the
#        trainer's initialiser, bench/init_compile.py with INIT_ARGS, in the background beside
#        the tests: its rows compile on the host's cores and share the GPU without preallocating)
#   BENCH_ARGS="--models gpt2_medium --impls cudnn" bash bench/gpu.sh /tmp/gpu
set -uo pipefail
OUT=${1:?usage: bash bench/gpu.sh OUT [WHEEL_DIR] [STAGES]}
WHEELS=${2:-}
STAGES=${3:-install,tests,bench,suite}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
# One process uses the GPU at a time: let XLA's allocator take 90% of its memory (default 75%).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
stage() { echo "=== $1 $(date +%T)"; }

stage device
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"

if has install; then
  stage install
  find_links=${WHEELS:+--find-links $WHEELS}
  # The [cuda] extra resolves against the image's jax + CUDA plugin; packages the image lacks come
  # from the wheel folder (no index: the machine has no network).
  if ! $PY -m pip install -q --no-index --no-build-isolation $find_links -e '.[cuda]' \
       > "$OUT/install.log" 2>&1; then
    echo "install of .[cuda] failed (see install.log); installing without dependency resolution"
    tail -5 "$OUT/install.log"
    [ -n "$WHEELS" ] && $PY -m pip install -q --no-index --no-deps "$WHEELS"/*.whl >> "$OUT/install.log" 2>&1
    $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
  fi
  $PY -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda|flax|optax|orbax|grain|nvidia-cudnn)" \
    | tee "$OUT/versions.txt"
  $PY -c "import jax; print(jax.__version__, jax.devices())" | tee -a "$OUT/versions.txt"
fi

if has init; then
  stage init
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${INIT_TIMEOUT:-200} $PY bench/init_compile.py \
    ${INIT_ARGS:---presets gpt2_small_bf16,gpt2_medium_bf16 --parallel 8 --timeout 150} \
    > "$OUT/init_compile.log" 2>&1 &
  init_pid=$!
fi

if has tests; then
  stage tests
  # tests/conftest.py defaults JAX_PLATFORMS to cpu (8 simulated devices): name the GPU.
  XLA_PYTHON_CLIENT_PREALLOCATE=$(has init && echo false || echo true) JAX_PLATFORMS=cuda \
    timeout ${TESTS_TIMEOUT:-150} $PY -m pytest -q -rs -p no:cacheprovider ${TESTS_ARGS:-tests/test_attention_impls.py} 2>&1 \
    | tee "$OUT/test_attention_impls.log" | tail -15
fi

if has init; then
  wait $init_pid; echo "init rc $?"
  cat "$OUT/init_compile.log" | cut -c1-400
fi

if has bench; then
  stage bench
  timeout ${BENCH_TIMEOUT:-400} $PY bench/accelerator.py --steps 20 --profile /tmp/profile \
    ${BENCH_ARGS:-} > "$OUT/accelerator.log" 2>&1
  echo "rc $?"; grep -v '^{' "$OUT/accelerator.log" | tail -${BENCH_TAIL:-60}
  grep '^{' "$OUT/accelerator.log" > "$OUT/accelerator.json"
  tar czf "$OUT/profile.tgz" -C /tmp profile 2>/dev/null
fi

if has profile; then
  stage profile
  timeout ${PROFILE_TIMEOUT:-150} $PY bench/gpu_profile.py --out /tmp/profile ${PROFILE_ARGS:-} \
    > "$OUT/profile.log" 2>&1
  echo "rc $?"; grep -v '^{' "$OUT/profile.log" | tail -45
  tar czf "$OUT/profile.tgz" -C /tmp profile 2>/dev/null
fi

if has suite; then
  stage suite
  JAX_PLATFORMS=cuda timeout ${SUITE_TIMEOUT:-240} $PY -m pytest -q -rs -p no:cacheprovider -x -m "not slow" \
    ${SUITE_FILES:-tests/test_decode.py tests/test_train.py tests/test_parallel.py} 2>&1 \
    | tee "$OUT/suite.log" | tail -25
fi
stage done
