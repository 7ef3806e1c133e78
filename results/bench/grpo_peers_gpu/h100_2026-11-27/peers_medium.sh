set -o pipefail
. .gpu/setup.sh
nvidia-smi -L; uptime
python3 -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|jax-cuda13-plugin|flax|optax|orbax-checkpoint|chex|grain|torch|transformers|trl|google-tunix|qwix|datasets|accelerate|numpy|safetensors|pyarrow) ' > $OUT/versions.txt
python3 -m dlr_jax.bench --only grpo_peers --peers-device gpu --peers-size medium --peers-mu 4 --peers-dir /tmp/peers --repeats 3 --out $OUT/bench_gpu_medium_mu4.md 2>&1 | tee $OUT/peers_medium.log
