set -o pipefail
. .gpu/setup.sh
uptime
B="python3 -m dlr_jax.bench --only grpo_peers --peers-device gpu --peers-size small --peers-mu 4 --peers-dir /tmp/peers --peers-only dlr_jax --repeats 2 --allow-load"
echo "== default flags, empty persistent cache"; JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache $B --out $OUT/c1.md 2>&1 | grep -E 'round|error|Error' | tee $OUT/compile.log
echo "== default flags, the cache filled by the run above"; JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache $B --out $OUT/c2.md 2>&1 | grep -E 'round|error|Error' | tee -a $OUT/compile.log
du -sh /tmp/xla_cache; ls /tmp/xla_cache | wc -l
echo "== XLA_FLAGS=--xla_gpu_autotune_level=0, no cache"; XLA_FLAGS=--xla_gpu_autotune_level=0 $B --out $OUT/c3.md 2>&1 | grep -E 'round|error|Error' | tee -a $OUT/compile.log
