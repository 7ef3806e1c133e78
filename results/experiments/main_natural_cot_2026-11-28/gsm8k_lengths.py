"""GSM8K's worked solutions against their calculator annotations joined (GSM8K-Aug's form), in characters.

python results/experiments/main_natural_cot_2026-11-28/gsm8k_lengths.py > .../gsm8k_lengths.txt"""

import numpy as np

from dlr_jax.data.readers import load_benchmark

for split in ("train", "test"):
    raw = load_benchmark("gsm8k", split=split, cot="raw")
    eq = load_benchmark("gsm8k", split=split, cot="equations")
    r, e = np.array([len(x.cot) for x in raw]), np.array([len(x.cot) for x in eq])
    print(f"gsm8k {split}: {len(raw)} solutions; characters mean {r.mean():.1f} as written, {e.mean():.1f} as "
          f"annotations joined: {r.mean() / e.mean():.2f}x")
