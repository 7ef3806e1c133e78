"""The codebook stage's held-out report (greedy CER with true / shuffled ids / continuous features,
codebook perplexity) for a main-phase checkpoint, while the run goes on or after it stopped early:

    python -m dlr_jax.stages.codebook.report --workdir W [--step S] [--examples N]

Reads <W>/config.yaml (the run's own config) and <W>/codebook/checkpoints/<S> (default: the latest),
writes <W>/codebook/report_step<S>.json. Read-only on the checkpoints, so it can run beside training
(it shares the CPU with it, though). The numbers are those `codebook.run` puts under "held_out" in
report.json at the end of the run.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from flax import nnx

from dlr_jax.config import load_config
from dlr_jax.core.sharding import create_sharded
from dlr_jax.data.sources import corpus_texts
from dlr_jax.models.codebook_model import CodebookModel
from dlr_jax.run.workdir import stage_dir
from dlr_jax.stages import common
from dlr_jax.stages.codebook import eval as codebook_eval
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.training.trainer import Trainer


def checkpoint_report(workdir: str | Path, *, step: int | None = None, examples: int | None = None
                      ) -> dict[str, Any]:
    """{"step": S, **codebook_eval.reconstruction_report(...)} of main-phase checkpoint S (None = latest) on
    the first `examples` held-out CoTs (None = codebook.eval_examples)."""
    w = Path(workdir)
    if not (w / "config.yaml").is_file():
        raise FileNotFoundError(f"{w / 'config.yaml'}: not a workdir (run --stage codebook first)")
    cfg = load_config(w / "config.yaml")
    cb = cfg.codebook
    mesh = common.make_mesh_for(cfg)
    mcfg = codebook.model_config(cfg)
    model = create_sharded(lambda: CodebookModel(mcfg, rngs=nnx.Rngs(0)), mesh, cfg.mesh.rules)
    loss = functools.partial(codebook.codebook_loss, lambda_vq=cb.lambda_vq, beta=cb.beta, dropout=cb.char_dropout)
    trainer = Trainer(model, loss, cb.train, stage_dir(w, codebook.STAGE), mesh=mesh, rules=cfg.mesh.rules,
                      name="codebook-report")
    have = sorted(trainer.ckpt.all_steps())
    if not have or (step is not None and step not in have):
        raise FileNotFoundError(f"{trainer.dir / 'checkpoints'}: no main-phase checkpoint"
                                + ("" if step is None else f" at step {step}") + f" (steps there: {have})")
    trainer.restore(None, step=step)
    held = corpus_texts(cfg, held_out=True)
    held = held[: examples or cb.eval_examples or len(held)]
    if not held:
        raise ValueError("no held-out CoTs (codebook.eval_corpus / data.eval_split)")
    report = codebook_eval.reconstruction_report(trainer.finalize(), held, cb, seed=cfg.run.seed)
    return {"step": trainer.step, **report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="the codebook run's workdir")
    ap.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ap.add_argument("--examples", type=int, default=None, help="held-out CoTs (default: codebook.eval_examples)")
    args = ap.parse_args(argv)
    r = checkpoint_report(args.workdir, step=args.step, examples=args.examples)
    out = stage_dir(args.workdir, codebook.STAGE) / f"report_step{r['step']}.json"
    out.write_text(json.dumps(r, indent=2))
    print(f"[codebook] step {r['step']}: held-out CER true={r['cer_true']:.3f} shuffled={r['cer_shuffled']:.3f} "
          f"(ratio {r['cer_true'] / max(r['cer_shuffled'], 1e-9):.2f}) continuous={r['cer_continuous']:.3f}; "
          f"final number read back true={r['final_number_true']:.3f} shuffled={r['final_number_shuffled']:.3f}; "
          f"perplexity {r['perplexity']:.1f}, {r['used_codes']} codes used, {r['examples']} CoTs -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
