# sourced by every device call: the carried wheels (.whl: grain and its imports, transformers 5.24.0 to match the CPU runs)
# onto PYTHONPATH; JAX on the GPU only, allocating as it goes (PyTorch shares the card in the sampling benchmark)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi -L; uptime
python3 -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|jax-cuda13-plugin|flax|optax|orbax-checkpoint|chex|grain|torch|transformers|tokenizers|numpy|safetensors) ' > "$OUT/versions.txt"
