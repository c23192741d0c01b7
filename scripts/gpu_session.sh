#!/usr/bin/env bash
# One GPU session in one command: install what the device image lacks, then benchmarks/gpu.py.
#
# Run on the device machine from the repository root, with the wheels folder .whl/ carried
# beside the tree (benchmarks/gpu.py's docstring says how to download it here, for Python 3.12):
#
#     bash scripts/gpu_session.sh [gpu.py options]      # report: $OUT/gpu.json, log: $OUT/gpu.log
#
# The wheels and mlhpc itself (built from this tree, without network or build isolation, into
# the same folder, so its workload entry points are registered) go to $SITE (default /tmp/site),
# put first on PYTHONPATH for this script and every process it starts; the image's own
# packages (torch, numpy, h5py, ...) are left as they are. No network is used.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="${SITE:-/tmp/site}"
DEST="${OUT:-.}"
PYTHON="${PYTHON:-python3}"
if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_session: no .whl/*.whl here: download them first (benchmarks/gpu.py's docstring)" >&2
    exit 2
fi
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --no-cache-dir --upgrade --target "$SITE" .
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" -c "import mlhpc_workloads, pydantic, lmdb, gemmi, mlperf_logging, torch; \
print('gpu_session: torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
"$PYTHON" benchmarks/gpu.py --json "$DEST/gpu.json" "$@" 2>&1 | tee "$DEST/gpu.log"
