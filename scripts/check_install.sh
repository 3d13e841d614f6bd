#!/usr/bin/env bash
# Installs packer the ways a user would, each in a fresh virtualenv holding only torch, with no
# pip flags, and checks that gpu_ops' compiled kernels work afterwards:
#   plain     pip install REPO       -> no kernels in the wheel; the first `import gpu_ops` compiles
#                                       them (logged) into the cache, and they load and raise
#                                       RuntimeError on a bad argument
#   editable  pip install -e REPO    -> the cached build is reused (no second compile); CLI works
#   nbi       FORCE_CUDA=0 pip install --no-build-isolation REPO   (over the plain install)
#                                    -> compiled at install (CPU-only path, smoke-tested by setup.py)
#
#   cuda      the CUDA torch (torch==2.14.1 torchvision==0.29.1) in its own venv,
#             FORCE_CUDA=1 pip install --no-build-isolation -e REPO[dev,mongo]
#                                    -> the CUDA kernels compile (a CUDA compile error fails, GPU or
#                                       not; needs nvcc), then the tests marked `torchvision` and the
#                                       MDS tests (mosaicml-streaming installed as install.sh does)
#                                       run with PACKER_REQUIRE_TORCHVISION=1 PACKER_REQUIRE_MDS=1.
#                                       Not in the default stages: .ci/run runs it after the suite
#                                       (CI installs what a user without a GPU installs, the CPU
#                                       torch, and keeps the CUDA path checked here). ~5.5 GB of torch
#                                       in the venv; the CUDA compile step may take
#                                       $CHECK_INSTALL_CUDA_BUILD_TIMEOUT s (default 2400).
#
#   bash scripts/check_install.sh [STAGES]     # default: plain,editable,nbi
#
# torch: $CHECK_INSTALL_TORCH (default torch==2.13.0, the CPU wheel of the local wheel store, which
# makes every build here a CPU build). Works on a copy of the tracked tree (git archive), in
# $CHECK_INSTALL_DIR (default: a temp dir, removed at the end). Needs PyPI (or a warm pip cache) for
# packer's dependencies. Every step runs under `timeout`; exit 0 only when every stage passed.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGES="${1:-plain,editable,nbi}"
TORCH_SPEC="${CHECK_INSTALL_TORCH:-torch==2.13.0}"
CUDA_TORCH_SPEC="${CHECK_INSTALL_CUDA_TORCH:-torch==2.14.1 torchvision==0.29.1}"
WORK="${CHECK_INSTALL_DIR:-$(mktemp -d /tmp/packer_check_install.XXXXXX)}"
[[ -n "${CHECK_INSTALL_DIR:-}" ]] || trap 'rm -rf "$WORK"' EXIT
STEP_TIMEOUT="${CHECK_INSTALL_STEP_TIMEOUT:-900}"
CUDA_BUILD_TIMEOUT="${CHECK_INSTALL_CUDA_BUILD_TIMEOUT:-2400}"
export PACKER_GPU_OPS_CACHE="$WORK/cache" PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH PACKER_GPU_OPS_STRICT
T0=$(date +%s)

say() { echo "check_install [$(( $(date +%s) - T0 ))s]: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
run() { timeout --kill-after=10 "$STEP_TIMEOUT" "$@"; }

# A copy of the tracked files: installs must not write into the working tree (egg-info, build/).
SRC="$WORK/src"
rm -rf "$SRC" && mkdir -p "$SRC"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$SRC"
rm -f "$SRC"/gpu_ops/_C*.so

new_venv() {  # new_venv NAME -> path of its python; torch only
    local v="$WORK/venv-$1"
    rm -rf "$v"
    python3 -m venv "$v"
    run "$v/bin/python" -m pip install -q --no-compile "$TORCH_SPEC" >&2 || fail "pip install $TORCH_SPEC"
    echo "$v/bin/python"
}

# The kernels must load, be the compiled ones, and turn an argument error into RuntimeError.
CHECK_OPS='
import sys, torch, gpu_ops
assert gpu_ops.EXTENSION_LOADED, gpu_ops.EXTENSION_ERROR
x = torch.randint(0, 256, (2, 8, 9, 3), dtype=torch.uint8)
y = gpu_ops.crop_mirror_normalize(x, 1.0, 2.0, flip=True)
assert y.shape == (2, 3, 8, 9), y.shape
try:
    torch.ops.gpu_ops._self_test_check(5)
except RuntimeError as e:
    assert "expected 0, got 5" in str(e)
else:
    sys.exit("no RuntimeError")
print("OPS_OK", torch.ops.gpu_ops._build_info(), gpu_ops.__file__)
'

for stage in ${STAGES//,/ }; do
    case $stage in
        plain)
            PY=$(new_venv plain)
            say "plain: pip install $SRC"
            run "$PY" -m pip install -q "$SRC" >&2 || fail "pip install (plain)"
            site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
            ! ls "$site"/gpu_ops/_C*.so >/dev/null 2>&1 || fail "plain: expected no compiled kernels in the wheel"
            ls "$site"/gpu_ops/csrc/cpu/*.cpp >/dev/null || fail "plain: kernel sources missing from the install"
            say "plain: first import compiles on demand"
            out="$(cd "$WORK" && run "$PY" -c "$CHECK_OPS" 2>&1)" || fail "plain: $out"
            echo "$out" | grep -q "compiling the kernels" || fail "plain: no message about the on-demand build: $out"
            echo "$out" | grep -q "OPS_OK cpu $site" || fail "plain: $out"
            (cd "$WORK" && run "$WORK/venv-plain/bin/packer" formats >/dev/null) || fail "plain: packer CLI"
            say "plain: ok" ;;
        editable)
            PY=$(new_venv editable)
            say "editable: pip install -e $SRC"
            run "$PY" -m pip install -q -e "$SRC" >&2 || fail "pip install -e"
            out="$(cd "$WORK" && run "$PY" -c "$CHECK_OPS" 2>&1)" || fail "editable: $out"
            echo "$out" | grep -q "OPS_OK cpu $SRC/gpu_ops" || fail "editable: $out"
            # The explicit build command: the cache is up to date, so it only prints the library.
            lib="$(cd "$WORK" && run "$PY" -m gpu_ops.build --quiet)" || fail "python -m gpu_ops.build"
            [[ "$lib" == "$PACKER_GPU_OPS_CACHE"/*/gpu_ops_C.so ]] || fail "python -m gpu_ops.build printed '$lib'"
            if ls "$WORK"/cache/*/manifest.json >/dev/null 2>&1 && echo "$out" | grep -q "compiling the kernels"; then
                fail "editable: compiled again although the cache held a build for these sources"
            fi
            (cd "$WORK" && run "$WORK/venv-editable/bin/packer" formats >/dev/null) || fail "editable: packer CLI"
            say "editable: ok" ;;
        nbi)
            # Over the plain stage's install when there is one (saves a torch install).
            PY="$WORK/venv-plain/bin/python"
            [[ -x "$PY" ]] || PY=$(new_venv plain)
            run "$PY" -m pip install -q setuptools wheel ninja >&2
            say "nbi: FORCE_CUDA=0 pip install --no-build-isolation $SRC (compiles at install)"
            log="$WORK/nbi.log"
            FORCE_CUDA=0 run "$PY" -m pip install -v --no-build-isolation "$SRC" > "$log" 2>&1 \
                || { tail -30 "$log" >&2; fail "pip install --no-build-isolation"; }
            grep -q "smoke test passed" "$log" || fail "nbi: setup.py did not smoke-test the build"
            site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
            ls "$site"/gpu_ops/_C*.so >/dev/null || fail "nbi: no gpu_ops/_C*.so installed"
            out="$(cd "$WORK" && PACKER_GPU_OPS_BUILD=0 run "$PY" -c "$CHECK_OPS" 2>&1)" || fail "nbi: $out"
            echo "$out" | grep -q "OPS_OK cpu $site" || fail "nbi: $out"
            say "nbi: ok" ;;
        cuda)
            v="$WORK/venv-cuda"
            rm -rf "$v" && python3 -m venv "$v"
            PY="$v/bin/python"
            say "cuda: pip install $CUDA_TORCH_SPEC"
            # shellcheck disable=SC2086
            run "$PY" -m pip install -q --no-compile $CUDA_TORCH_SPEC setuptools wheel ninja >&2 \
                || fail "pip install $CUDA_TORCH_SPEC"
            say "cuda: FORCE_CUDA=1 pip install --no-build-isolation -e $SRC[dev,mongo] (compiles the CUDA kernels)"
            log="$WORK/cuda.log"
            rm -rf "$SRC/build" "$SRC"/gpu_ops/_C*.so   # the earlier stages' CPU build objects
            t_build=$(date +%s)
            FORCE_CUDA=1 timeout --kill-after=10 "$CUDA_BUILD_TIMEOUT" \
                "$PY" -m pip install -v --no-compile --no-build-isolation -e "$SRC[dev,mongo]" > "$log" 2>&1 \
                || { tail -30 "$log" >&2; fail "FORCE_CUDA=1 pip install --no-build-isolation -e (after $(( $(date +%s) - t_build )) s)"; }
            grep -q "building CPU and CUDA kernels" "$log" || fail "cuda: setup.py did not build the CUDA kernels"
            grep -q "smoke test passed" "$log" || fail "cuda: setup.py did not smoke-test the build"
            say "cuda: CUDA kernels built in $(( $(date +%s) - t_build )) s; mosaicml-streaming (--no-deps, as scripts/install.sh)"
            run "$PY" -m pip install -q --no-compile zstd Brotli python-snappy catalogue 'transformers>=4.40' >&2 \
                && run "$PY" -m pip install -q --no-compile --no-deps 'mosaicml-streaming==0.13.0' >&2 \
                || fail "pip install mosaicml-streaming"
            out="$(cd "$SRC" && PACKER_GPU_OPS_BUILD=0 run "$PY" -c "$CHECK_OPS" 2>&1)" || fail "cuda: $out"
            echo "$out" | grep -q "OPS_OK cpu+cuda" || fail "cuda: expected a CUDA build: $out"
            say "cuda: the tests that need torchvision, and the MDS tests"
            (cd "$SRC" && PACKER_REQUIRE_TORCHVISION=1 PACKER_REQUIRE_MDS=1 PACKER_GPU_OPS_BUILD=0 \
                run "$PY" -m pytest -q -p no:cacheprovider --basetemp "$WORK/pytest" -m torchvision tests >&2) \
                || fail "cuda: the tests marked torchvision"
            (cd "$SRC" && PACKER_REQUIRE_TORCHVISION=1 PACKER_REQUIRE_MDS=1 PACKER_GPU_OPS_BUILD=0 \
                run "$PY" -m pytest -q -p no:cacheprovider --basetemp "$WORK/pytest" \
                tests/packer/interchange/test_interchange_mds.py tests/packer/interchange/test_interchange_roundtrip.py \
                -k mds >&2) || fail "cuda: the MDS tests"
            rm -rf "$v"   # ~6 GB
            say "cuda: ok" ;;
        *) fail "unknown stage $stage" ;;
    esac
done
say "all stages passed ($STAGES)"
