"""Question and CoT lengths of the 10-16-step variant's test split, in the workdir's tokenizer and in characters.

python results/experiments/main_vlong_cot_2026-11-28/lengths.py /work/runs/vlong/seed0/main > .../lengths.txt"""

import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from dlr_jax.config import load_config
from dlr_jax.data.sources import load_examples

wd = Path(sys.argv[1])
cfg = load_config(wd / "config.yaml")
tok = Tokenizer.from_file(str(wd / "tokenizer" / "tokenizer.json"))
examples = load_examples(cfg, cfg.data.eval_split)
q = np.array([len(tok.encode(e.question).ids) for e in examples])
c = np.array([len(tok.encode(e.cot).ids) for e in examples])
cc = np.array([len(e.cot) for e in examples])
print(f"{len(examples)} test examples: question tokens mean {q.mean():.1f} max {q.max()}; "
      f"CoT tokens mean {c.mean():.1f} max {c.max()}; CoT characters mean {cc.mean():.1f} max {cc.max()}")
