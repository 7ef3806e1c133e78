# python -m dlr_jax.bench --only sampling on the lent GPU (both sides on it): bash results/bench/gpu_2026-11-27b/sampling.sh
set -o pipefail
. "$(dirname "$0")/setup.sh"
timeout 420 python3 -m dlr_jax.bench --only sampling --repeats 5 --out "$OUT/sampling_gpu.md" 2>&1 | tee "$OUT/sampling.log"
