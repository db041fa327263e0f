#!/usr/bin/env bash
# The GPU check, in one script, in under 8 minutes on a GPU machine:
#   1. every CUDA test (tests/steps/test_device.py, tests/media/test_device_decode.py: pin_memory,
#      to_device's side-stream copies, decode(device="cuda"), crops decoded on the GPU);
#   2. benchmarks/gpu_overlap.py: host-to-device copies hidden behind compute;
#   3. benchmarks/gpu_decode.py: GPU JPEG decode images/s and its pixels against Pillow's.
# It writes a markdown report (default gpu_check_report.md; the first argument names
# another file). On a machine without CUDA it runs the CPU-only parts (the same tests,
# whose CUDA cases skip, and the decode path on nvImageCodec's CPU decoder) and says
# why the rest is skipped. Usage, from a clone:
#   pip install -e '.[test,gpu]'   # with a CUDA build of torch on the GPU machine
#   bash benchmarks/gpu_check.sh [report.md]
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT=${1:-gpu_check_report.md}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)

CUDA=$(python -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
{
    echo "# GPU check"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); git $(git rev-parse --short HEAD 2>/dev/null)"
    echo "- GPUs: $(nvidia-smi -L 2>/dev/null | tr '\n' ';' || true)"
    python -c "import torch; print(f'- torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}')"
    python -c "
try:
    import nvidia.nvimgcodec as n
    print(f'- nvImageCodec {n.__version__}')
except Exception as e:
    print(f'- nvImageCodec: not importable ({type(e).__name__}): pip install -e .[gpu]')
" 2>/dev/null
} > "$REPORT"
if [ "$CUDA" != 1 ]; then
    if command -v nvidia-smi > /dev/null; then
        why="a GPU is here but torch.cuda.is_available() is False: install a CUDA build of torch"
    else
        why="no CUDA on this machine (torch.cuda.is_available() is False)"
    fi
    echo "- GPU parts skipped: $why; the CPU-only parts ran" >> "$REPORT"
fi

section() { printf '\n## %s\n\n' "$1" >> "$REPORT"; }

section "CUDA tests"
timeout 240 python -m pytest -q -rs -p no:cacheprovider tests/steps/test_device.py \
    tests/media/test_device_decode.py > "$WORK/tests.txt" 2>&1
status=$?
{
    echo "exit status $status (124: over the 240 s limit)"
    echo
    echo '```'
    grep -E "^(SKIPPED|FAILED|ERROR)|passed|failed|error" "$WORK/tests.txt" | tail -40
    echo '```'
} >> "$REPORT"

section "Copy/compute overlap (benchmarks/gpu_overlap.py)"
if [ "$CUDA" = 1 ]; then
    timeout 150 python benchmarks/gpu_overlap.py --batches 16 --mb 64 --repeats 3 \
        > "$WORK/overlap.txt" 2>&1
    echo "exit status $?" >> "$REPORT"
else
    python benchmarks/gpu_overlap.py > "$WORK/overlap.txt" 2>&1
fi
{ echo '```'; tail -30 "$WORK/overlap.txt"; echo '```'; } >> "$REPORT"

section "GPU JPEG decode (benchmarks/gpu_decode.py)"
if [ "$CUDA" = 1 ]; then
    timeout 180 python benchmarks/gpu_decode.py --images 2048 --batch 256 --repeats 3 \
        --markdown "$WORK/decode.md" > "$WORK/decode.txt" 2>&1
    status=$?
else
    python benchmarks/gpu_decode.py --markdown "$WORK/decode.md" > "$WORK/decode.txt" 2>&1
    printf '\nCPU smoke run of the same path (not a GPU figure):\n\n' >> "$WORK/decode.md"
    timeout 120 python benchmarks/gpu_decode.py --device cpu --images 128 --batch 64 \
        --repeats 1 >> "$WORK/decode.md" 2> "$WORK/decode.err"
    status=$?
fi
{
    echo "exit status $status"
    echo
    cat "$WORK/decode.md" 2>/dev/null
    [ "$status" = 0 ] || { echo '```'; tail -20 "$WORK/decode.txt" "$WORK/decode.err" 2>/dev/null; echo '```'; }
} >> "$REPORT"

printf '\nTook %s s.\n' "$(( $(date +%s) - START ))" >> "$REPORT"
cat "$REPORT"
