#!/usr/bin/env bash
# Brings vLLM 0.22.0 (the engine bench, issue 38) to an offline GPU machine that takes at most 64 MiB a call:
#   .vllm_whl/       vllm==0.22.0 and what scripts/vllm_needs.txt lists, cp312 manylinux x86_64 wheels
#   .vllm_stage/NN/  the same wheels packed into folders of at most 58 MB; a wheel larger than that is cut into
#                    NAME.whl.partKKofNN files, with NAME.whl.sha256 taken before the cut
# Phases:
#   scripts/stage_vllm.sh [stage]              here, from the repo root after `make setup`, with pip access to
#                                              PyPI (or its mirror): download, check the needs, pack, print the calls
#   scripts/stage_vllm.sh unpack DIR [install] there, one call per folder (carry DIR): add DIR's files to
#                                              /tmp/vllm_wheels and join any wheel whose parts are all in; with
#                                              `install` (the last call) install vllm from those wheels alone
set -euo pipefail
WHL=.vllm_whl
STAGE=.vllm_stage
NEEDS=scripts/vllm_needs.txt
WHEELS=/tmp/vllm_wheels
LIMIT=58000000        # bytes a folder: 64 MiB (67108864) a call less room for the working tree
PART=57000000         # bytes a part of a cut wheel, leaving room in its folder for small files
# vllm declares them: found unneeded on 2026-12-04 (the first two), or imported only on paths the engine bench
# does not take (the kernels: scripts/vllm_needs.txt says which)
LEFT_OUT="flashinfer-cubin tilelang nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels"
# staged at a release older than vllm asks, on purpose (scripts/vllm_needs.txt says why): the check names them
# without counting them as needs to look at
BEHIND="llguidance"
# the GPU image's packages (its package list as read on 2026-11-17); the check below counts them as there
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"

stage() {
    local py=${PY:-.venv/bin/python}
    [ -f "$NEEDS" ] || { echo "run from the repo root: no $NEEDS here" >&2; exit 2; }

    # wheels: each requirement of the needs file (comments and blank lines dropped), without its own needs,
    # for the image's CPython 3.12 on x86_64 (pip matches a manylinux_2_N tag only if N is named)
    grep -v -E '^[[:space:]]*(#|$)' "$NEEDS" | sed 's/[[:space:]]*#.*//' > /tmp/vllm_needs.txt
    rm -rf "$WHL" && mkdir -p "$WHL"
    while read -r req; do
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$WHL" "$req"
    done < /tmp/vllm_needs.txt

    # check: every need the wheels declare (for Python 3.12 on Linux x86_64, with the extras asked of them) is
    # staged at a version it accepts, or in the image, or left out on purpose; prints what is not
    "$py" - "$WHL" "$IMAGE_HAS" "$LEFT_OUT" "$BEHIND" <<'EOF'
import email, sys, zipfile
from pathlib import Path
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

whl_dir, image, left_out, behind = sys.argv[1], set(sys.argv[2].split()), set(sys.argv[3].split()), sys.argv[4].split()
staged = {}
for wheel in sorted(Path(whl_dir).glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(wheel.name)
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.message_from_bytes(z.read(meta)).get_all("Requires-Dist") or []
    staged[name] = (version, [Requirement(r) for r in requires])
env = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
       "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
extras = {name: {""} for name in staged}
active, grew = [], True
while grew:  # the extras asked of a package can ask extras of another: go on until none is added
    grew, active = False, []
    for name, (_, reqs) in staged.items():
        for r in reqs:
            if r.marker is None or any(r.marker.evaluate(dict(env, extra=e)) for e in extras[name]):
                active.append((name, r))
                dep = canonicalize_name(r.name)
                if dep in extras and not r.extras <= extras[dep]:
                    extras[dep] |= r.extras
                    grew = True
problems = set()
for name, r in active:
    dep = canonicalize_name(r.name)
    if dep in staged and not r.specifier.contains(staged[dep][0], prereleases=True):
        mismatch = f"{name} asks {r.name}{r.specifier}, staged {staged[dep][0]}"
        if dep in behind:
            print(f"behind on purpose: {mismatch}")
        else:
            problems.add(mismatch)
    elif dep not in staged and dep not in image and dep not in left_out:
        problems.add(f"{name} asks {r.name}{r.specifier or ''}: neither staged nor in the image")
for p in sorted(problems):
    print("NEEDS CHECK:", p)
print(f"{len(staged)} wheels; {len(problems)} needs to look at (add missing ones to scripts/vllm_needs.txt)")
EOF

    # items: the wheels (hard links), and each wheel over the limit cut into parts with its sha256
    rm -rf "$STAGE" && mkdir -p "$STAGE/items"
    for w in "$WHL"/*.whl; do
        base=$(basename "$w")
        if [ "$(stat -c %s "$w")" -le "$LIMIT" ]; then
            ln "$w" "$STAGE/items/$base" 2>/dev/null || cp "$w" "$STAGE/items/$base"
            continue
        fi
        split -b "$PART" -d -a 2 "$w" "$STAGE/items/$base.part"
        parts=("$STAGE/items/$base".part*)
        for p in "${parts[@]}"; do mv "$p" "${p}of$(printf '%02d' "${#parts[@]}")"; done
        (cd "$WHL" && sha256sum "$base") > "$STAGE/items/$base.sha256"
    done

    # folders 01, 02, ...: the largest item first, each into the first folder with room for it
    local -a used=()
    local n size path
    while read -r size path; do
        n=0
        while [ "$n" -lt "${#used[@]}" ] && [ $((used[n] + size)) -gt "$LIMIT" ]; do n=$((n + 1)); done
        [ "$n" -lt "${#used[@]}" ] || used+=(0)
        used[n]=$((used[n] + size))
        mkdir -p "$(printf '%s/%02d' "$STAGE" $((n + 1)))"
        mv "$path" "$(printf '%s/%02d/' "$STAGE" $((n + 1)))"
    done < <(find "$STAGE/items" -type f -printf '%s %p\n' | sort -rn)
    rmdir "$STAGE/items"

    # the calls to make there, in order, on one machine kept warm between them (/tmp/vllm_wheels is on it)
    local -a dirs=("$STAGE"/[0-9][0-9])
    echo "calls (each carries one folder, at most $LIMIT bytes, with the working tree):"
    for d in "${dirs[@]}"; do
        last=""; [ "$d" = "${dirs[-1]}" ] && last=" install"
        printf '  carry ["%s"]  command "bash scripts/stage_vllm.sh unpack %s%s"  # %s bytes\n' \
            "$d" "$d" "$last" "$(du -sb "$d" | cut -f1)"
    done
}

unpack() {
    local dir=${1:?usage: scripts/stage_vllm.sh unpack DIR [install]}
    local py=${PY:-python3}
    mkdir -p "$WHEELS"
    cp "$dir"/* "$WHEELS"/

    # join a cut wheel once all its parts and its sha256 are here, and check it against that sha256
    local part whl total have
    local -A seen=()
    for part in "$WHEELS"/*.part[0-9][0-9]of[0-9][0-9]; do
        [ -e "$part" ] || continue
        whl=${part%.part*}
        [ -z "${seen[$whl]:-}" ] || continue
        seen[$whl]=1
        total=$((10#${part##*of}))
        have=$(find "$WHEELS" -maxdepth 1 -name "$(basename "$whl").part*" | wc -l)
        if [ "$have" -lt "$total" ] || [ ! -f "$whl.sha256" ]; then
            echo "$(basename "$whl"): $have of $total parts$([ -f "$whl.sha256" ] || echo ', no sha256') so far"
            continue
        fi
        cat "$whl".part*of* > "$whl"
        (cd "$WHEELS" && sha256sum -c "$(basename "$whl").sha256")
        rm "$whl".part*of* "$whl.sha256"
    done
    echo "$(find "$WHEELS" -maxdepth 1 -name '*.whl' | wc -l) wheels whole in $WHEELS"

    if [ "${2:-}" = install ]; then
        # vllm from these wheels and what the image has; should the resolver stop at a need left out on
        # purpose (flashinfer-cubin, tilelang, the kernels) or staged behind (llguidance), install each staged
        # wheel without its needs
        # instead and let pip check name what is still unmet
        if ! "$py" -m pip install --no-index --find-links "$WHEELS" vllm==0.22.0; then
            echo "the resolver stopped: installing the staged wheels with --no-deps" >&2
            "$py" -m pip install -q --no-index --no-deps "$WHEELS"/*.whl
            "$py" -m pip check || true
        fi
        "$py" -c 'import vllm; print("vllm", vllm.__version__)'
    fi
}

case "${1:-stage}" in
    stage) stage ;;
    unpack) shift; unpack "$@" ;;
    *) echo "usage: scripts/stage_vllm.sh [stage] | unpack DIR [install]" >&2; exit 2 ;;
esac
