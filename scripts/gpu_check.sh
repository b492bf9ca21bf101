#!/usr/bin/env bash
# The GPU path, run for real on a machine with CUDA (see docs/gpu.md): the CUDA tests, the
# GPU benchmark and the two notebooks that use GPUs, logs into one folder.
#   bash scripts/gpu_check.sh OUTDIR [pytest -k expression]
# Uses the python3 on PATH (its torch must have CUDA) and this checkout on PYTHONPATH; each
# step has its own time limit, so one that hangs does not take the others with it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR [-k expression]}
KEXPR=${2:-cuda or gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() { echo "=== $(date +%T) $*" >&2; }

step environment
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'x', torch.cuda.device_count()); import torch.distributed as d; print('nccl', d.is_nccl_available(), torch.cuda.nccl.version())"; nproc; } > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt" >&2

step "CUDA tests (-k '$KEXPR')"
timeout -k 10 ${TESTS_S:-240} $PY -m pytest -p no:randomly -p no:cacheprovider -q -rA --timeout 90 \
  --junitxml "$OUTDIR/junit.xml" -k "$KEXPR" \
  tests/test_rdma_cuda.py tests/test_cuda_messages.py tests/test_gpus.py tests/test_bench_gpu.py \
  tests/test_rdma.py tests/test_tensor_collectives.py tests/test_tensor_engine.py \
  tests/test_tensor_remote.py > "$OUTDIR/tests.log" 2>&1
echo "tests exit $?" >&2; tail -3 "$OUTDIR/tests.log" >&2

step bench_gpu
timeout -k 10 ${BENCH_S:-150} $PY benchmarks/bench_gpu.py ${BENCH_ARGS:-} > "$OUTDIR/bench_gpu.txt" 2>&1
echo "bench exit $?" >&2

step notebooks
KS=$(mktemp -d)
$PY -m monarch_kernel install --prefix "$KS" --env PYTHONPATH="$PYTHONPATH" >/dev/null
export JUPYTER_PATH="$KS/share/jupyter"
NB=$(mktemp -d)
$PY - "$NB" <<'PYEOF'
"""Variants of the notebooks for one GPU: DDP on 2 procs sharing it (gloo on CUDA tensors,
NCCL refuses two ranks on one GPU), and the tensor engine with CUDA tensors by default."""
import sys, nbformat
out = sys.argv[1]
nb = nbformat.read("notebooks/ddp.ipynb", 4)
for c in nb.cells:
    c.source = (c.source.replace('BACKEND = "nccl" if GPUS else "gloo"', 'BACKEND = "gloo"')
                .replace("if GPUS:\n    WORLD_SIZE", "if False:\n    WORLD_SIZE")
                .replace("--per-host gpus={WORLD_SIZE}", "--per-host procs={WORLD_SIZE}")
                .replace('torch.device("cuda", 0) if backend == "nccl"',
                         'torch.device("cuda", 0) if torch.cuda.is_available()'))
nbformat.write(nb, f"{out}/ddp_gloo_cuda.ipynb")
nb = nbformat.read("notebooks/distributed_tensors.ipynb", 4)
cells = []
for c in nb.cells:
    if c.cell_type == "code" and "bad = w[" in c.source:
        continue  # an out-of-range index on CUDA is a device-side assert: the context is lost
    if c.cell_type == "code" and c.source.startswith("%mesh deactivate"):
        c.source = "torch.set_default_device(None)\n" + c.source
    cells.append(c)
    if c.cell_type == "code" and c.source.startswith("%mesh activate"):
        cells.append(nbformat.v4.new_code_cell('torch.set_default_device("cuda")'))
    if c.cell_type == "code" and c.source.startswith("w = torch.rand"):
        cells.append(nbformat.v4.new_code_cell(
            'print("device on the procs:", y.device, runtime.inspect(y).shape)'))
nb.cells = cells
nbformat.write(nb, f"{out}/distributed_tensors_cuda.ipynb")
PYEOF
for nb in notebooks/ddp.ipynb "$NB/ddp_gloo_cuda.ipynb" "$NB/distributed_tensors_cuda.ipynb"; do
  step "notebook $nb"
  timeout -k 10 ${NB_S:-90} $PY -m monarch_kernel.run_notebook "$nb" --timeout 80 \
    >> "$OUTDIR/notebooks.log" 2>&1
  echo "notebook $nb exit $?" | tee -a "$OUTDIR/notebooks.log" >&2
done
rm -rf "$KS" "$NB"
step done
