# python -m dlr_jax.bench --only latent_cost on the lent GPU, on a copy of a trained workdir carried in .gpuwd
# (config.yaml, tokenizer/ and the four stages' final/): bash results/bench/gpu_2026-11-27b/latent_cost.sh
# No GEMM autotuning (4 methods x prompt buckets x 2 batch sizes would autotune for minutes; a 0.4M-parameter
# model's matmuls are launch-bound either way); fp32 matmuls without TF32, as on the CPU.
set -o pipefail
. "$(dirname "$0")/setup.sh"
export XLA_FLAGS=--xla_gpu_autotune_level=0 JAX_DEFAULT_MATMUL_PRECISION=float32
for b in 1 128; do
  timeout $([ $b = 1 ] && echo 300 || echo 200) python3 -m dlr_jax.bench --only latent_cost --cost-workdir .gpuwd/long/seed0/main --cost-batches $b \
    --out "$OUT/latent_cost_b$b.md" 2>&1 | tee "$OUT/latent_cost_b$b.log"
done
