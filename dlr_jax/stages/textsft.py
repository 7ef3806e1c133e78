"""Text-only SFT baselines (the paper's CoT-SFT and Direct-SFT).

`cot`:    [x ; y ; <answer> a </answer>]      `direct`: [x ; <answer> a </answer>]
Loss on everything after x. The CoT model also serves as the evaluator LM of the process reward
and, for from-scratch tiny configs, as the backbone that the latent stages start from.

`direct_from_cot` (a control, not a paper baseline) trains Direct-SFT starting from the workdir's
finished CoT-SFT model instead of the backbone, with train.textsft_direct's settings, into
`textsft_direct_from_cot/`: DLR-SFT's model starts from CoT-SFT too, so this separates what that start
and the extra steps give from what the latent tokens add (`experiments main --matched-baselines`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from dlr_jax.config import Config
from dlr_jax.core.files import MissingStageError
from dlr_jax.data.sources import load_examples
from dlr_jax.run.handoff import restore_stage, save_stage_model
from dlr_jax.run.workdir import final_dir, stage_dir
from dlr_jax.stages import common
from dlr_jax.stages.latent_common import local_batch
from dlr_jax.training.trainer import Trainer, TrainResult

# mode -> the format of its training rows
MODES = {"cot": "cot", "direct": "direct", "direct_from_cot": "direct"}


def run(cfg: Config, workdir: str | Path, mode: str = "cot", *, num_steps: int | None = None) -> TrainResult:
    from dlr_jax.data.pipeline import make_stage_dataset

    if mode not in MODES:
        raise ValueError(f"textsft mode must be one of {', '.join(MODES)}, got {mode!r}")
    stage = f"textsft_{mode}"
    if mode == "direct_from_cot" and not (final_dir(workdir, "textsft_cot") / "meta.json").is_file():
        raise MissingStageError(f"{final_dir(workdir, 'textsft_cot')}: direct_from_cot starts from the CoT-SFT "
                                f"model; run `python -m dlr_jax.train --stage textsft --mode cot --workdir {workdir}` "
                                "first")
    train = load_examples(cfg, cfg.data.train_split)  # the inputs validate before anything is written
    common.prepare_workdir(cfg, workdir, train)
    tok = common.get_tokenizer(cfg, workdir, train)
    train = common.stage_examples(cfg, workdir, "sft", tok, train)
    mesh = common.make_mesh_for(cfg)
    tcfg = cfg.train.textsft if mode == "cot" else cfg.train.textsft_direct
    if mode == "direct_from_cot":
        model = restore_stage(workdir, "textsft_cot", tok, cfg, mesh)
    else:
        model = common.new_backbone(cfg, tok, mesh)
    data = make_stage_dataset(
        "textsft",
        train,
        tok,
        batch_size=local_batch(tcfg.batch_size),
        max_len=cfg.data.max_len,
        seed=cfg.run.seed,
        mode=MODES[mode],
        num_workers=cfg.data.num_workers,
        vocab_size=model.cfg.vocab_size,
        pad_to=cfg.data.pad_to,
        **common.data_kwargs(cfg, tcfg, mesh, len(train), num_steps),
    )
    tcfg, batch_examples = common.packed_batch(tcfg, data)  # data.pack_batch=examples: the rows the data chose
    # after the data: a packed epoch is fewer steps (its rows hold several examples each)
    tcfg = common.resolve_schedule(tcfg, len(train), workdir, stage, pack=data.pack if data.packed else None,
                                  batch_examples=batch_examples, pack_batch=data.pack_batch)
    common.describe_rows(stage, data)
    print(f"[{stage}] {common.count_params(model):,} params, {data.examples:,} of {len(train):,} examples "
          f"(those that fit data.max_len={cfg.data.max_len})", flush=True)
    loss = functools.partial(common.lm_loss, vocab_mask=tok.vocab_padding_mask()[: tok.text_vocab_size],
                             reduction=tcfg.loss_reduction)
    trainer = Trainer(
        model, loss, tcfg, stage_dir(workdir, stage), mesh=mesh, rules=cfg.mesh.rules, name=stage
    )
    result = trainer.fit(iter(data), num_steps)
    if not result.preempted:
        save_stage_model(
            result.model, workdir, stage, kind="backbone", model_cfg=result.model.cfg, extra={"mode": mode}
        )
    return result
