#!/usr/bin/env bash
# One-call GPU check (run on the device machine, from the repository root):
#   build the extension with FORCE_CUDA=1, run the gpu_ops tests (CUDA-marked, then the rest) and
#   the GPU path tests (ragged ops, readers.gpu: decode, pipelines, prefetch loader), run the
#   benchmarks (gpu_ops kernels; store -> GPU batch pipeline on .bench/sets when present), run
#   compute-sanitizer (memcheck) over the CUDA tests.
# Dependencies the machine lacks (lmdb, PyTurboJPEG, nvImageCodec, nvJPEG, libturbojpeg.so.0) are
# taken from .whl/ (scripts/gpu_wheels.sh fills it; wheels for the machine's Python are picked by
# pip; libturbojpeg.so.0 is put on LD_LIBRARY_PATH).
# Every stage logs to $OUT and the script goes on after a failure, so one broken stage does not lose
# the others. Stages: scripts/gpu_check.sh [env,build,test,train,trainrows,ddp,vsdali,bench,
# pipeline,records,sanitize,profile,walk,remote,carry] (default: all but trainrows, vsdali, walk,
# remote and carry, in order). From nothing to the DALI and training tables in four calls to one
# warm machine (each call carries at most 64 MiB; docs/gpu.md, "The GPU check from nothing"):
#   1. carry .whl .bench/sets/hd.lmdb .dali/SHA256SUMS:  gpu_check.sh env,build,test,walk
#   2. carry .dali/piece.00:                             gpu_check.sh carry
#   3. carry .dali/piece.01:                             gpu_check.sh carry
#   4. carry .dali/piece.02 .bench/sets/small.lmdb:      gpu_check.sh vsdali,trainrows
#   train      a short ResNet-18 run fed by GPULoader's default decoder, which must finish in time
#              (the engine's hang of session 3 showed only under training), and beside it the
#              crops decoded on the CPU (decoder="cpu-crops" in GPULoader, and the packer-cpu feed);
#   trainrows  the training table on the ~500 px bench set (TRAIN_MODELS, TRAIN_FEEDS; about 5 min);
#   ddp        the same training on one GPU and under torchrun on two, where the machine has two
#              or more (the ~500 px bench set when .bench/sets has it): each row its own process,
#              one GPU then two in each pass; DDP_PASSES ("1 2 3"), DDP_MODELS and DDP_FEEDS
#              (space-separated), DDP_VARIANTS ("|"-separated option sets, e.g. "|--threads 4",
#              NAME=VALUE words put in the environment, e.g. "|PACKER_ENGINE_HW_LANES=1"),
#              DDP_BIND=gpu (two-GPU rows with each rank on its GPU's CPUs too);
#   vsdali     scripts/bench_vs_dali.py (issue 29's table against DALI), where DALI imports (see
#              scripts/dali_wheels.sh for carrying it here in pieces); trainrows adds a dali row there;
#   remote     scripts/bench_remote.py (packer against MDS, LitData and WebDataset, streamed from a
#              moto S3 server on this machine), where the remote kit is installed (scripts/remote_wheels.sh:
#              .rkit/piece.* and .rkit/SHA256SUMS, one piece a call, then .whl for lmdb and PyTurboJPEG):
#                1. carry .rkit/piece.00 .rkit/SHA256SUMS:  gpu_check.sh carry
#                2. carry .rkit/piece.01 .whl:              gpu_check.sh remote
#              the S3 server on the last quarter of the CPUs, the readers on the rest (--workers: their
#              count less 2); REMOTE_N images (10000), REMOTE_REPEAT runs a row (3), REMOTE_ARGS adds or
#              overrides bench_remote.py's options (e.g. "--latency-ms 20 --tools packer,mds");
#   records    the read stage's C++ record checks against the Python loop on this host's CPUs;
#   walk       scripts/module_walk.py gpu-batch: one batch through GPULoader on the GPU, module by module;
#   profile    ncu SpeedOfLight of a few kernels.
# Total time is capped by GPU_CHECK_BUDGET_S (default 560 s); each stage gets min(its cap, what is left).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
# PYTHONFAULTHANDLER: a crash prints every thread's Python stack; the training stages' rows also
# get a deadline (bench_train_gpu.py --row-timeout): a row that stops making progress prints its
# stacks and exits before the stage's cap, and the table goes on (session 24: one such row, no stack).
export PYTHONUNBUFFERED=1 PACKER_GPU_OPS_STRICT=1 PACKER_REQUIRE_CUDA=1 PYTHONFAULTHANDLER=1
STAGES=${1:-env,build,test,train,ddp,bench,pipeline,records,sanitize,profile}
BUDGET=${GPU_CHECK_BUDGET_S:-560}
T0=$(date +%s)
SUMMARY="$OUT/summary.log"

# What a call carried (.whl/, .bench/sets/, .dali/, .rkit/) is copied first to $CARRY, outside the
# checkout, and every stage reads it from there: a later call to the same warm machine carries
# other things (one DALI piece a call) and finds what the earlier ones brought, without relying on
# ignored files left in its checkout. The compiled kernels and the native decoder are built into
# their caches (~/.cache/packer/gpu_ops, keyed by their sources), outside the checkout too.
CARRY=${PACKER_CARRY:-/tmp/packer_carry}
mkdir -p "$CARRY/whl" "$CARRY/dali" "$CARRY/rkit" "$CARRY/sets"
ls .whl/* >/dev/null 2>&1 && cp -a .whl/. "$CARRY/whl/"
ls .dali/* >/dev/null 2>&1 && cp -a .dali/. "$CARRY/dali/"
# (the pieces only: where this is run from a checkout that made the kit, .rkit/ holds wheels/ too)
# each on its own: a call carries one piece, with or without SHA256SUMS
for f in .rkit/piece.* .rkit/SHA256SUMS; do [ -f "$f" ] && cp -a "$f" "$CARRY/rkit/"; done
ls .bench/sets/*.lmdb >/dev/null 2>&1 && cp -a .bench/sets/. "$CARRY/sets/"
SETS=${BENCH_SETS:-$CARRY/sets}
echo "carried here so far: $(ls "$CARRY/whl" | wc -l) wheels/libs, $(ls "$CARRY/dali" | wc -l) DALI files," \
  "$(ls "$CARRY/rkit" | wc -l) remote kit files," \
  "sets: $(cd "$CARRY/sets" && ls -d *.lmdb 2>/dev/null | tr '\n' ' ')" | tee -a "$SUMMARY"

# The wheels, installed once per machine (again when the carried set changes): pip takes the wheel
# of each package that fits this Python (--find-links; several may be carried).
if ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
  stamp=$(ls -l "$CARRY"/whl/*.whl | md5sum | cut -c1-16)
  if [ "$(cat /tmp/site/.packer_wheels 2>/dev/null)" != "$stamp" ]; then
    pkgs=$(ls "$CARRY"/whl/*.whl | sed -E 's#.*/([A-Za-z0-9_]+)-[0-9].*#\1#' | sort -u | tr '\n' ' ')
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      --find-links "$CARRY/whl" $pkgs 2>&1 | tail -3 && echo "$stamp" > /tmp/site/.packer_wheels
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -d /tmp/site/nvidia/nvjpeg/lib ]; then  # nvImageCodec's libnvjpeg, from the nvidia-nvjpeg wheel
  export LD_LIBRARY_PATH=/tmp/site/nvidia/nvjpeg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ls "$CARRY"/whl/nvidia_nvimgcodec*.whl >/dev/null 2>&1 && export PACKER_REQUIRE_NVIMGCODEC=1
fi
if ls "$CARRY"/whl/libturbojpeg.so* >/dev/null 2>&1; then
  mkdir -p /tmp/site/lib && cp -a "$CARRY"/whl/libturbojpeg.so* /tmp/site/lib/
  export LD_LIBRARY_PATH=/tmp/site/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# pieces_whole WHAT DIR: true when every piece DIR/SHA256SUMS lists ("pieces N") is in DIR and the
# joined pieces match its hash (first line); else says which (WHAT names the kit) and is false.
pieces_whole() {
  local what=$1 dir=$2 want have
  want=$(awk '$1 == "pieces" {print $2}' "$dir/SHA256SUMS")
  have=$(ls "$dir"/piece.* 2>/dev/null | wc -l)
  if [ "$have" != "$want" ]; then
    echo "$what: $have of $want pieces here (carry the rest, one a call); not installed" | tee -a "$SUMMARY"
    return 1
  fi
  if [ "$(cat "$dir"/piece.* | sha256sum | cut -d' ' -f1)" != "$(awk 'NR == 1 {print $1}' "$dir/SHA256SUMS")" ]; then
    echo "$what: the joined pieces failed their hash; not installed" | tee -a "$SUMMARY"
    return 1
  fi
}

# NVIDIA DALI (scripts/dali_wheels.sh: an installed folder as tar.xz, in pieces carried one a call),
# once every piece is here: joined, its hash checked, unpacked as /tmp/dali_site.
if [ -f "$CARRY/dali/SHA256SUMS" ] && [ ! -d /tmp/dali_site/nvidia/dali ] && pieces_whole DALI "$CARRY/dali"; then
  s=$(date +%s)
  if mkdir -p /tmp/dali_site.part && cat "$CARRY"/dali/piece.* | xz -dc -T0 | tar -C /tmp/dali_site.part -xf - \
     && mv /tmp/dali_site.part /tmp/dali_site; then
    echo "DALI: unpacked into /tmp/dali_site in $(( $(date +%s) - s ))s" | tee -a "$SUMMARY"
  else
    rm -rf /tmp/dali_site.part
    echo "DALI: unpacking the joined pieces failed; not installed" | tee -a "$SUMMARY"
  fi
fi
if [ -d /tmp/dali_site/nvidia/dali ]; then
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/dali_site
  # DALI's decoders dlopen libnvimgcodec.so.0 by name: the wheel's folder on the library path (a
  # DALI pipeline otherwise fails at its first decode, though nvidia.dali imports).
  nvimg=$(find /tmp/site /tmp/dali_site -name 'libnvimgcodec.so.0*' 2>/dev/null | head -1)
  [ -n "$nvimg" ] && export LD_LIBRARY_PATH=$(dirname "$nvimg")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The remote benchmark's kit (scripts/remote_wheels.sh: 33 wheels as one tar in pieces, carried one
# a call), once every piece is here: joined, its hash checked, unpacked and installed with pip
# --target into $RKIT_SITE (/tmp/rkit_site), once per machine (again when a kit of another hash
# comes). Only the remote stage puts it on PYTHONPATH (its fsspec is newer than the image's).
RKIT_SITE=${RKIT_SITE:-/tmp/rkit_site}
if [ -f "$CARRY/rkit/SHA256SUMS" ]; then
  sum=$(awk 'NR == 1 {print $1}' "$CARRY/rkit/SHA256SUMS")
  if [ "$(cat "$RKIT_SITE/.packer_rkit" 2>/dev/null)" = "$sum" ]; then
    :  # installed by an earlier call
  elif pieces_whole "remote kit" "$CARRY/rkit"; then
    s=$(date +%s)
    rm -rf "$RKIT_SITE.part" "$RKIT_SITE.wheels"
    if ! { mkdir -p "$RKIT_SITE.wheels" && cat "$CARRY"/rkit/piece.* | tar -C "$RKIT_SITE.wheels" -xf - \
           && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$RKIT_SITE.part" \
              "$RKIT_SITE".wheels/wheels/*.whl 2>&1 | tail -3; }; then
      rm -rf "$RKIT_SITE.part"
      echo "remote kit: unpacking or installing the wheels failed; not installed" | tee -a "$SUMMARY"
    else
      n=$(ls "$RKIT_SITE".wheels/wheels/*.whl | wc -l)
      echo "$sum" > "$RKIT_SITE.part/.packer_rkit" && rm -rf "$RKIT_SITE" && mv "$RKIT_SITE.part" "$RKIT_SITE"
      echo "remote kit: $n wheels installed into $RKIT_SITE in $(( $(date +%s) - s ))s" | tee -a "$SUMMARY"
    fi
    rm -rf "$RKIT_SITE.wheels"
  fi
fi
# DALI's rows run where it imports and finds nvImageCodec (--no-dali otherwise: the benchmarks say
# it is not installed).
NO_DALI=--no-dali
python3 -c "import ctypes, nvidia.dali; ctypes.CDLL('libnvimgcodec.so.0')" >/dev/null 2>&1 && NO_DALI=
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# run_stage NAME CAP_S LOG COMMAND...: runs under timeout, tees to $OUT/LOG, records rc and time.
run_stage() {
  local name=$1 cap=$2 log=$3; shift 3
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  local limit=$(( cap < left ? cap : left ))
  if (( limit < 10 )); then echo "=== $name skipped: budget spent" | tee -a "$SUMMARY"; return; fi
  echo "=== $name (limit ${limit}s): $*" | tee -a "$OUT/$log"
  local s=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc in $(( $(date +%s) - s ))s" | tee -a "$SUMMARY" "$OUT/$log"
}

PYTEST=(python3 -m pytest --noconftest -p no:cacheprovider -q -rfEs tests/gpu_ops/test_gpu_ops.py)
# The GPU path tests use the generated-data fixtures of tests/conftest.py.
PYTEST_PATH=(python3 -m pytest -p no:cacheprovider -q -rfEs
             tests/gpu_ops/test_gpu_ops_ragged.py tests/readers/test_gpu_pipeline.py tests/readers/test_gpu_engine.py
             tests/readers/test_gpu_nvimgcodec.py tests/readers/test_gpu_fastpath.py tests/readers/test_gpu_cpucrops.py tests/readers/test_gpu_feeds.py
             tests/gpu_ops/test_cpu_kernel_threads.py tests/readers/test_batch_loader.py tests/readers/test_shared_batches.py
             tests/gpu_ops/test_records_op.py tests/readers/test_gpu_queues.py tests/readers/test_gpu_decoder_contract.py
             tests/gpu_ops/test_gpu_ops_native_wrappers.py tests/gpu_ops/test_gpu_ops_engine_sources.py
             tests/readers/test_gpu_loader_no_cuda.py)

# A TORCH_CHECK failing inside a kernel must reach Python as RuntimeError. (Seen on the device
# machine: built with its default /opt/gcc toolchain, the first one segfaulted instead.)
throw_check() {
  python3 - <<'PY'
import torch, gpu_ops
for dev in ("cpu", "cuda"):
    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8, device=dev)
    try:
        torch.ops.gpu_ops.warp_affine(x, torch.zeros(2, 3, 2, dtype=torch.float64, device=dev), 4, 4, 1, 0.0)
        print(f"throw_check {dev}: no error raised (unexpected)")
    except RuntimeError as e:
        print(f"throw_check {dev}: RuntimeError raised OK: {str(e)[:90]}")
PY
}

# The kernels and the native decoder compile at once, each into its cache (outside the checkout,
# reused by a later call to the same machine while the sources are unchanged): gpu_ops.build is
# what setup.py runs (smoke test included: an argument error must raise; where it crashes, seen
# with the device machine's /opt/gcc toolchain, it rebuilds with the next known-good compiler).
# Both import gpu_ops without building or requiring it (PACKER_GPU_OPS_BUILD=0, STRICT=0). Both use
# GPU_CHECK_CXX, by default /usr/bin/g++ where it exists: the device image sets CXX to its /opt/gcc
# toolchain, whose builds crash at their first TORCH_CHECK (std::codecvt in c10::str); each build
# would find that out by itself and rebuild with the next compiler (~40 s each), and the engine's
# build, which follows gpu_ops' choice, cannot know it while both run. (The fallback itself is
# tested in tests/gpu_ops/test_gpu_ops_build.py.)
build() {
  rm -rf build gpu_ops/_C*.so   # the cached build is the one imported
  local cxx=${GPU_CHECK_CXX:-$( [ -x /usr/bin/g++ ] && echo /usr/bin/g++ || echo "${CXX:-c++}")}
  export CXX=$cxx CC=${cxx%g++}gcc PACKER_GPU_OPS_BUILD=0 PACKER_GPU_OPS_STRICT=0
  [ -x "$CC" ] || unset CC
  echo "--- build with CXX=$CXX ($($CXX --version | head -1))"
  FORCE_CUDA=1 MAX_JOBS=${MAX_JOBS:-12} python3 -m gpu_ops.build --quiet > /tmp/build_ops.log 2>&1 & local ops=$!
  MAX_JOBS=${MAX_JOBS:-12} python3 -m gpu_ops.engine --quiet > /tmp/build_engine.log 2>&1 & local eng=$!
  wait $ops; local rc_ops=$?
  wait $eng; local rc_eng=$?
  echo "--- gpu_ops.build rc=$rc_ops"; cat /tmp/build_ops.log
  echo "--- gpu_ops.engine rc=$rc_eng"; cat /tmp/build_engine.log
  return $(( rc_ops ? rc_ops : rc_eng ))
}
# Two pytest runs side by side (16 CPUs, one GPU with room for both), each in its own basetemp.
pair() {
  local a=$1 b=$2
  bash -c "$a --basetemp=/tmp/pt_a" > /tmp/pair_a.log 2>&1 & local pa=$!
  bash -c "$b --basetemp=/tmp/pt_b" > /tmp/pair_b.log 2>&1 & local pb=$!
  wait $pa; local ra=$?
  wait $pb; local rb=$?
  echo "--- $a: rc=$ra"; cat /tmp/pair_a.log
  echo "--- $b: rc=$rb"; cat /tmp/pair_b.log
  return $(( ra ? ra : rb ))
}
export -f throw_check build pair  # run_stage runs them under timeout through bash -c

for stage in ${STAGES//,/ }; do
  case $stage in
    env)
      { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv;
        python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())";
        python3 -c "import cv2; print('cv2', cv2.__version__, 'ipp', cv2.ipp.useIPP(), cv2.ipp.getIppVersion())";
        nvcc --version | tail -1; python3 -m pytest --version; compute-sanitizer --version | head -2; nproc; } 2>&1 | tee -a "$SUMMARY" ;;
    build)
      { echo "CC=${CC:-} CXX=${CXX:-}"; which -a gcc g++ c++ cc 2>&1; ls /opt/gcc/bin 2>&1 | head; } | tee -a "$OUT/build.log"
      # The kernels and the native decoder (nvJPEG from the CUDA toolkit or the nvidia-nvjpeg wheel).
      run_stage build 300 build.log bash -c build
      grep -h "^gpu_ops: " "$OUT/build.log" | tee -a "$SUMMARY"
      run_stage throw_check 60 build.log bash -c throw_check ;;
    walk)
      # One batch through GPULoader on the GPU (the native engine), module by module (issue 49).
      run_stage walk 120 walk.log python3 scripts/module_walk.py gpu-batch
      grep -h "^gpu-batch: " "$OUT/walk.log" | tee -a "$SUMMARY" ;;
    profile)
      run_stage profile 120 bench.log ncu --section SpeedOfLight --kernel-name regex:"cmn_kernel|rcmn_kernel|warp_affine_kernel|resize_kernel" \
        --launch-count 6 python3 scripts/bench_gpu_ops.py --quick --only cmn,rcmn --out /tmp/ncu_bench ;;
    test)
      # Two runs side by side at a time (the CUDA-marked kernel tests with the rest; the GPU path
      # tests with the docs' GPU examples); -n 4: a crashing test (see throw_check) takes down one
      # xdist worker, not the run.
      run_stage test_ops 180 test.log bash -c "pair '${PYTEST[*]} -m cuda' '${PYTEST[*]} -m \"not cuda\" -n 4'"
      # The docs' GPU examples (<!-- example: needs=gpu -->) and the blocks before them.
      run_stage test_path 300 test.log bash -c "pair '${PYTEST_PATH[*]}' 'python3 -m pytest -p no:cacheprovider -q -rfEs tests/project/test_docs_examples.py -k \"README or gpu.md\"'" ;;
    train)
      # 600 synthetic photo-like JPEGs, ResNet-18 with decoder="auto" (the engine where it loads):
      # a run that stops making progress is killed at the cap and shows as rc=124 (--in-process:
      # one process for the cap to kill).
      run_stage train 180 train.log python3 scripts/bench_train_gpu.py --make 600 --store /tmp/gpu_check_train.lmdb \
        --models resnet18 --feeds synthetic,packer,packer@cpu-crops,packer-cpu --steps 40 --warmup 5 --no-dali --in-process \
        --row-timeout 120 --out "$OUT/train" ;;
    trainrows)
      # The training table (issue 29) on the ~500 px bench set: each (model, feed) row its own
      # process; TRAIN_MODELS / TRAIN_FEEDS pick the rows.
      TRAIN_FEEDS_DEFAULT=synthetic,packer,packer@engine,packer@cpu-crops
      [ -z "$NO_DALI" ] && TRAIN_FEEDS_DEFAULT+=,dali
      if [ -f $SETS/small.lmdb/data.mdb ]; then
        # TRAIN_REPEAT runs of the whole table (a spread: min / median / max per row).
        for r in $(seq 1 "${TRAIN_REPEAT:-1}"); do
          run_stage trainrows 420 train.log python3 scripts/bench_train_gpu.py --store $SETS/small.lmdb \
            --threads "${BENCH_THREADS:-12}" --steps 100 --warmup 60 --models "${TRAIN_MODELS:-resnet50,resnet18}" \
            --feeds "${TRAIN_FEEDS:-$TRAIN_FEEDS_DEFAULT}" $NO_DALI --row-timeout 240 --out "$OUT/trainrows$r"
        done
      else
        echo "=== trainrows skipped: no $SETS/small.lmdb (scripts/make_bench_sets.py makes it)" | tee -a "$SUMMARY"
      fi ;;
    ddp)
      # Images/s per GPU on two GPUs against one (issue 50 asks within 5%), each rank its loader.
      # On the ~500 px bench set where it is here ($SETS/small.lmdb), else 600 synthetic JPEGs.
      # Each (model, feed) row its own process on one GPU and its own torchrun on two, the two
      # made one after the other in each pass (DDP_PASSES, e.g. "1 2 3": the pass labels; a later
      # call can add a pass), DDP_BIND=gpu adds a two-GPU row with each rank's threads on its GPU's
      # CPUs for the packer feeds. The rows' own files stay in $DDP_ROWS, outside $OUT (the device
      # sends back only a few files); $OUT/ddp has ddp.md (every pass on this machine so far,
      # min / median / max a row) and bench_train_gpu.json (all their rows).
      DDP_ROWS=${DDP_ROWS:-/tmp/packer_ddp_rows}
      if (( $(nvidia-smi -L | wc -l) >= 2 )); then
        export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
        { nvidia-smi topo -m; lscpu | grep -iE "^(model name|socket|numa|core|thread)"; } 2>&1 | tee -a "$OUT/ddp_topo.log"
        if [ -f $SETS/small.lmdb/data.mdb ]; then
          DDP_DATA=(--store $SETS/small.lmdb --threads "${DDP_THREADS:-12}" --steps 100 --warmup 60)
        else
          DDP_DATA=(--make 600 --store /tmp/gpu_check_train.lmdb --steps 40 --warmup 5)
        fi
        # DDP_VARIANTS: "|"-separated sets of bench_train_gpu.py options, each run on one GPU and
        # on two (e.g. "|--threads 4|--bucket-view|PACKER_ENGINE_HW_LANES=1": as shipped, fewer
        # loader threads, DDP's gradients as views into its buckets, one hardware lane; a NAME=VALUE
        # word goes into the row's environment); the table pairs each with its own one-GPU row.
        IFS='|' read -ra VARIANTS <<< "${DDP_VARIANTS:-}"
        (( ${#VARIANTS[@]} )) || VARIANTS=("")
        for pass in ${DDP_PASSES:-1}; do
          for m in ${DDP_MODELS:-resnet50 resnet18}; do
            for f in ${DDP_FEEDS:-synthetic packer packer@cpu-crops}; do
              for v in "${!VARIANTS[@]}"; do
                tag=${m}_${f//[@:]/_}_v$v
                OPTS=() VARS=()
                for w in ${VARIANTS[$v]}; do   # a variant: options, split on spaces, and NAME=VALUE words
                  if [[ $w =~ ^[A-Z][A-Z0-9_]*= ]]; then VARS+=("$w"); else OPTS+=("$w"); fi
                done
                ROW=("${DDP_DATA[@]}" --models "$m" --feeds "$f" --no-dali --in-process --label "pass$pass" --row-timeout 140
                     "${OPTS[@]}")
                run_stage "ddp_one_gpu_${tag}_p$pass" 150 train.log env "${VARS[@]}" CUDA_VISIBLE_DEVICES=0 python3 \
                  scripts/bench_train_gpu.py "${ROW[@]}" --out "$DDP_ROWS/p$pass/one/$tag"
                run_stage "ddp_two_gpus_${tag}_p$pass" 150 train.log env "${VARS[@]}" torchrun --nproc-per-node 2 \
                  scripts/bench_train_gpu.py "${ROW[@]}" --out "$DDP_ROWS/p$pass/two/$tag"
                if [ "${DDP_BIND:-none}" = gpu ] && [[ $f == packer* ]]; then
                  run_stage "ddp_two_gpus_bound_${tag}_p$pass" 150 train.log env "${VARS[@]}" torchrun \
                    --nproc-per-node 2 scripts/bench_train_gpu.py "${ROW[@]}" --bind gpu \
                    --out "$DDP_ROWS/p$pass/two_bound/$tag"
                fi
              done
            done
          done
          mkdir -p "$OUT/ddp"
          python3 scripts/bench_train_gpu.py --summarize "$DDP_ROWS" --rows-to "$OUT/ddp/bench_train_gpu.json" \
            > "$OUT/ddp/ddp.md" 2>&1
          cat "$OUT/ddp/ddp.md" | tee -a "$SUMMARY"
        done
      else
        echo "=== ddp skipped: one GPU here" | tee -a "$SUMMARY"
      fi ;;
    vsdali)
      # Issue 29's table: packer's training pipeline and decode against DALI's, both sets, 4-16
      # threads, VS_DALI_REPEAT runs a row (default 1), the engine's decode balanced and at hardware
      # shares 0 and 1 (the threads alone, the hardware engine alone: the decode's ceiling is their
      # sum). DALI from the carried pieces (scripts/dali_wheels.sh); hd.lmdb and small.lmdb from
      # scripts/make_bench_sets.py. VS_DALI_ARGS replaces the rows / threads / repeat.
      if [ -n "$NO_DALI" ]; then
        echo "=== vsdali skipped: DALI does not import or find libnvimgcodec.so.0 here (scripts/dali_wheels.sh, carried in pieces)" | tee -a "$SUMMARY"
      else
        run_stage vsdali 540 bench.log python3 scripts/bench_vs_dali.py --sets "$SETS" --out "$OUT/vsdali" \
          ${VS_DALI_ARGS:---threads 4,8,12,16 --rows dali_train,dali_decode,packer_train_native,native_decode --native-shares=-1,0,1 --repeat ${VS_DALI_REPEAT:-1}}
      fi ;;
    bench)
      run_stage bench 300 bench.log python3 scripts/bench_gpu_ops.py --out "$OUT" ;;
    pipeline)
      if [ -d "$SETS/small.lmdb" ]; then
        run_stage pipeline 300 bench.log python3 scripts/bench_pipeline.py --sets "$SETS" --out "$OUT" \
          --threads "${BENCH_THREADS:-12}" ${BENCH_PIPELINE_ARGS:-}
      else
        echo "=== pipeline skipped: no .bench/sets (scripts/make_bench_sets.py makes them)" | tee -a "$SUMMARY"
      fi ;;
    remote)
      # Streaming from S3 (moto on loopback): packer against MDS, LitData and WebDataset, each from
      # the bucket through a DataLoader; the server on the last quarter of this machine's CPUs, the
      # readers on the rest (taskset lists of the CPUs this process may use, not 0..nproc-1).
      if [ -f "$RKIT_SITE/.packer_rkit" ]; then
        read -r READER_CPUS SERVER_CPUS NREADERS < <(python3 -c \
          'import os, sys; sys.path.insert(0, "scripts"); from bench_common import split_cpus
print(*split_cpus(os.sched_getaffinity(0)))')
        REMOTE_CPUS=()
        (( NREADERS >= 1 )) && REMOTE_CPUS=(--server-cpus "$SERVER_CPUS" --reader-cpus "$READER_CPUS")
        REMOTE_WORKERS=$(( NREADERS - 2 < 2 ? 2 : NREADERS - 2 ))
        # A run the cap killed leaves its server up and its writers' folders full (MDS and LitData
        # refuse to write into them): both gone first.
        bash scripts/s3_server.sh --dir /tmp/bench_remote_work/s3server stop 2>/dev/null
        rm -rf /tmp/bench_remote_work
        run_stage remote 540 remote.log env PYTHONPATH="$RKIT_SITE:$PYTHONPATH" PATH="$RKIT_SITE/bin:$PATH" \
          python3 scripts/bench_remote.py "${REMOTE_CPUS[@]}" --workers "$REMOTE_WORKERS" \
          --n "${REMOTE_N:-10000}" --repeats "${REMOTE_REPEAT:-3}" --out "$OUT/remote.md" --work /tmp/bench_remote_work \
          ${REMOTE_ARGS:-}
        bash scripts/s3_server.sh --dir /tmp/bench_remote_work/s3server stop 2>/dev/null
      else
        echo "=== remote skipped: the remote kit is not installed here (scripts/remote_wheels.sh, carried in pieces)" | tee -a "$SUMMARY"
      fi ;;
    records)
      if [ -d "$SETS/small.lmdb" ]; then
        run_stage records 120 bench.log python3 scripts/bench_records.py --sets "$SETS" --threads 1,4 \
          --seconds 3 --out "$OUT/bench_records.md"
      else
        echo "=== records skipped: no .bench/sets (scripts/make_bench_sets.py makes them)" | tee -a "$SUMMARY"
      fi ;;
    sanitize)
      run_stage sanitize 300 sanitize.log compute-sanitizer --tool memcheck --error-exitcode 7 \
        "${PYTEST[@]}" -m cuda -x
      run_stage sanitize_ragged 200 sanitize.log compute-sanitizer --tool memcheck --error-exitcode 7 \
        python3 -m pytest -p no:cacheprovider -q -rfEs tests/gpu_ops/test_gpu_ops_ragged.py -m cuda -x ;;
    carry) ;;  # only what every call does first: what it carried copied to $CARRY (DALI joined once whole)
    *) echo "unknown stage $stage" | tee -a "$SUMMARY" ;;
  esac
done
echo "=== done in $(( $(date +%s) - T0 ))s" | tee -a "$SUMMARY"
grep -h "^=== " "$SUMMARY"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
[ -f "$OUT/bench_pipeline.md" ] && cat "$OUT/bench_pipeline.md"
[ -f "$OUT/bench_records.md" ] && cat "$OUT/bench_records.md"
[ -f "$OUT/remote.md" ] && cat "$OUT/remote.md"
exit 0
