#!/usr/bin/env bash
# The attention kernel beside cuDNN's, as the profiler sees them, on the GPU machine, in one
# command from the project root:
#
#   bash bench/lab/profile_attention_peer.sh [BUILD_DIR]
#
# Nsight Compute (ncu, clocks not locked) on one launch of each of:
# 1. PyTorch SDPA's cuDNN kernel on dense causal 2048-token windows at d = 64, 112 windows (7 x
#    16 heads: the reference branches' useful work) and at d = 128, 56 windows (7 x 8), bf16;
# 2. the product's wgmma kernel (its lab twin, variant 36, on bf16 q/k/v read in place) and its
#    ping-pong kernel (what sf_cuda_attention runs there) on the reference branches with 256
#    global tokens, d = 64.
# For each: launch shape (grid, threads, registers, shared memory), occupancy, issue slots, pipe
# utilization, warp stall reasons, instruction counts, L2 and DRAM throughput. The point is what
# structure reaches cuDNN's rate, not the rates themselves (bench/attention_yardstick.sh).
# Logs under $OUT (default /tmp/att_profile): ncu_*.txt (full details), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
case "${1:-}" in -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2 ;; esac
B=${1:-build-gpu}
OUT=${OUT:-/tmp/att_profile}
mkdir -p "$OUT"
command -v ncu >/dev/null || { echo "ncu not found: nothing to profile"; exit 1; }
if [ -f .gpu/gpu-env.sh ] && ! pkg-config --exists openblas 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu-env.sh >/dev/null 2>&1
fi
if [ ! -x "$B/bench/bench_attention_variants" ]; then
  [ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DSEQFLOW_BUILD_TESTS=OFF -DSEQFLOW_BUILD_BENCH=ON \
    -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/configure.log" 2>&1
  cmake --build "$B" -j"$(nproc)" --target bench_attention_variants >"$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
fi
SECTIONS="--section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis
  --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active"
# shellcheck disable=SC2086
prof() { # name, kernel regex, launches to skip, command...
  local name=$1 re=$2 skip=$3
  shift 3
  ncu --clock-control none --kernel-name-base demangled -k "regex:$re" --launch-skip "$skip" -c 1 $SECTIONS "$@" >"$OUT/ncu_$name.txt" 2>&1
  echo "ncu $name: exit $?" >>"$OUT/summary.txt"
}
: >"$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >>"$OUT/summary.txt"
for cfg in "7 16 64" "7 8 128"; do
  # shellcheck disable=SC2086 # the three numbers split into words
  set -- $cfg
  prof "cudnn_${1}x${2}_d$3" "(?i)(sdpa|fmha|flash|attn|attention)" 3 python3 - "$1" "$2" "$3" <<'EOF'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
B, H, d = (int(x) for x in sys.argv[1:4])
q, k, v = (torch.rand(B, H, 2048, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(6):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
EOF
done
# the reference shape G256 comes first in the timing table: its float path first (other kernels),
# then variant 36 on bf16 q/k/v, whose second launch (the first timed) is the one profiled
ATT_TIME_ONLY=1 OPENBLAS_NUM_THREADS=1 prof product_ref_g256 "attention_wgmma_variant.*bfloat16" 1 \
  "$B/bench/bench_attention_variants" 2 36
# the product's dispatch on the same shape: the ping-pong kernel where it runs
ATT_TIME_ONLY=1 OPENBLAS_NUM_THREADS=1 prof pingpong_ref_g256 "attention_pingpong" 1 \
  "$B/bench/bench_attention_variants" 2 36
# the kernel's pieces: the metrics the summary reads, for each profile
{
  for f in "$OUT"/ncu_*.txt; do
    echo "== $(basename "$f" .txt)"
    grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Block Size|Registers Per Thread|Dynamic Shared Memory Per|Static Shared|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Issued Warp Per Scheduler|Eligible Warps|Active Warps Per Scheduler|Warp Cycles Per Issued|Executed Instructions  |Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|L2 Hit Rate|Memory Throughput" "$f" | head -40
    grep -E "stalled_|pipe_" "$f" | awk '$NF + 0 >= 0.05' | sort -k3 -g -r | head -24
  done
} >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
