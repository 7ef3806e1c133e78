# One GRPO step of ours at the medium size, mu = 4, on the lent GPU: rollouts decoded with the layer scan (auto on a
# GPU) vs unstacked layers (sampling.unstack_layers=on): bash results/bench/gpu_2026-11-27b/grpo_unstack.sh
# No GEMM autotuning, to bound the two first steps' compile inside the session's GPU time: every phase's matmuls
# run slower than autotuned ones (the update most), alike for both settings; the generate column is the comparison.
set -o pipefail
. "$(dirname "$0")/setup.sh"
export XLA_FLAGS=--xla_gpu_autotune_level=0
for u in auto on; do
  timeout 140 python3 -m dlr_jax.bench --only grpo_peers --peers-device gpu --peers-size medium --peers-mu 4 \
    --peers-only dlr_jax --peers-unstack $u --repeats 3 --out "$OUT/grpo_unstack_$u.md" 2>&1 | tee "$OUT/grpo_unstack_$u.log"
done
