"""Stage 2 — latent SFT: `[x ; <latent> z </latent> <answer> a </answer>]`, CE on everything after
the question x; backbone, projectors and (by config) the codebook train, starting from align.

Dual branch (`dlr_jax.models.dual_branch`): with `latent.dual_branch` on (auto: when
<workdir>/codebook/final exists and latent.source=codebook) the codebook stage's OCR decoder trains
in parallel to reconstruct the CoT y from sg(E_lat(z)); the stop-gradient isolates it from the LM.
Batches then carry `ocr_targets` / `ocr_codes` / `ocr_code_mask` (`data.pipeline`: one per row, or, on packed
rows (data.pack=true), one per segment, [b, S, ...], `data.ocr_rows`). The loss is the LM's token-mean CE plus
latent.dual_branch_weight times the decoder's char-mean CE (`dual_branch_loss`; under
train.sft.loss_reduction=sum, the paper's, both CEs are sums over each example's tokens / characters, averaged
over examples); metrics add lm_ce, ocr_ce and ocr_char_accuracy. The decoder uses the codebook stage's
input-character dropout (codebook.char_dropout) and sft's optimizer.

On a DeepSeek-OCR-2 codebook (codebook.init_from) the branch is D_ocr = the fine-tuned OCR-2 MoE decoder
(`models/ocr2_branch.py`): it reads sg(E_lat(z)) through a learned linear map to the VQ width (the LM's width
differs from what the decoder reads) and the OCR-2 projector, and reconstructs y in the checkpoint's tokens
(`ocr_targets` from `codebook.ocr2.OcrTokenEncoder`, codebook.max_text_len tokens incl. <eos>); the loss is
then the LM's token-mean CE plus latent.dual_branch_weight times the decoder's token-mean CE (metrics
ocr_ce, ocr_char_accuracy, the latter over tokens).

Outputs: <workdir>/sft/final (the latent LM, as without the branch) and, with the branch,
<workdir>/sft/decoder (params + meta.json, kind "ocr_decoder", or "ocr2_decoder" on an OCR-2 codebook): the
trained decoder with the rows it reads for every code (from the final E_lat(k)) frozen in.
`codebook.models.load_decoder` (and so RL's process reward and `interpret`) prefers it over the codebook
stage's decoder.

Latent curriculum (`latent.curriculum`, ours; off in the paper's recipe): rows write the first k of the CoT's
steps as latents and the rest as text, `[x ; <latent> z_1..z_k </latent> y_k+1..S <answer> a </answer>]`, k
growing stage by stage (stagewise) or drawn per example (random); `data.curriculum`. With the dual branch the
decoder reads back the k latent steps only (a row with k = 0 adds no OCR loss). Under codebook.render_unit=step
the decoder reads one latent step a row (its codes -> its text, as the codebook trained it), drawn per example
and epoch (`data.pipeline`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config, ConfigError
from dlr_jax.core.files import MissingStageError, write_text_atomic
from dlr_jax.data.curriculum import Curriculum
from dlr_jax.data.ocr_rows import OCR_KEYS
from dlr_jax.models.codebook_model import CodebookModelConfig, char_dropout, teacher_inputs
from dlr_jax.models.dual_branch import OCR_PARAMS, DualBranchLM, branch_from_codebook_model
from dlr_jax.models.ocr2_branch import Ocr2Branch, ocr2_branch_from_codebook_model
from dlr_jax.models.ocr2_codebook import PAD as OCR2_PAD
from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig
from dlr_jax.run.checkpoint import read_meta, save_params
from dlr_jax.run.workdir import final_dir, stage_dir
from dlr_jax.stages import common
from dlr_jax.stages.codebook.models import (
    OCR2_DECODER,
    check_render_view,
    decoder_dir,
    load_codebook_model,
    load_ocr2_tokenizer_file,
)
from dlr_jax.stages.latent_common import load_latent_stage, train_latent_stage
from dlr_jax.text.ocr_text import VOCAB
from dlr_jax.training.trainer import TrainResult

STAGE = "sft"


# ----------------------------------------------------------------------------------------------
# The loss (trainer contract: (loss_sum, weight, metric sums)).


def flat_ocr_rows(batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(ocr_targets [r, T], ocr_codes [r, N], ocr_code_mask [r, N]): the batch's OCR rows, one per row ([b, ...]) or,
    packed, one per segment slot ([b, S, ...] -> r = b * S; an unused slot's targets are all padding)."""
    return tuple(batch[k].reshape(-1, batch[k].shape[-1]) for k in OCR_KEYS)


def ocr_terms(model: DualBranchLM, batch: dict, rng: jax.Array, *, dropout: float = 0.0):
    """(Σ char NLL, #target chars, #chars predicted right) of the OCR branch on the batch's OCR rows (`flat_ocr_rows`):
    ocr_targets [r, T] from ocr_codes / ocr_code_mask [r, N] (left-padded); teacher-forced inputs
    lose `dropout` of their characters, as in the codebook stage. An OCR-2 branch: the same over the
    checkpoint's tokens (no dropout: its recipe has none). Sums over rows, so the layout (padded rows, or packed
    rows' segment slots) does not change them."""
    targets, codes, code_mask = flat_ocr_rows(batch)
    if isinstance(model.ocr, Ocr2Branch):
        feats = model.latent_features(codes)  # sg(E_lat(z))
        logits, _ = model.ocr.decoder_logits(feats, targets, code_mask > 0)
        tmask = (targets != OCR2_PAD).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0]
        correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
        return jnp.sum(nll * tmask), jnp.sum(tmask), jnp.sum(correct * tmask)
    inputs, in_mask = teacher_inputs(targets)
    inputs = char_dropout(inputs, dropout, rng)
    logits = model.ocr_logits(codes, code_mask > 0, inputs, in_mask)
    tmask = (targets != VOCAB.PAD).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return jnp.sum(nll * tmask), jnp.sum(tmask), jnp.sum(correct * tmask)


def dual_branch_loss(model: DualBranchLM, batch: dict, rng: jax.Array, *, vocab_mask: Any = None,
                     weight: float = 1.0, dropout: float = 0.0, reduction: str = "mean"):
    """The LM's CE + weight * the OCR decoder's CE in the trainer's (sum, count) form.

    reduction "sum" (the paper's): each example's LM CE summed over its tokens plus weight times its OCR CE
    summed over its characters, averaged over the examples (segments of packed rows); exact under
    gradient accumulation. "mean": LM token-mean CE + weight * OCR char-mean CE. The count stays the LM's n_lm
    and the OCR mean is scaled by it: loss_sum = S_lm + weight * n_lm * S_ocr / n_ocr, so Σ loss_sum / Σ n_lm
    = S_lm / n_lm + weight * S_ocr / n_ocr exactly for one micro-batch; with grad_accum > 1 the OCR term is the
    n_lm-weighted mean of the micro-batches' char means (the LM term stays the exact global token mean).
    Metrics, either way, are divided by the LM's tokens: the logged lm_ce / ocr_ce / ocr_char_accuracy are per
    token / per char (under mean, loss = lm_ce + weight * ocr_ce).
    """
    s_lm, w_lm, metrics = common.lm_loss(model.lm, batch, rng, vocab_mask=vocab_mask, reduction=reduction)
    n_lm = metrics["tokens"]
    s_ocr, n_ocr, correct = ocr_terms(model, batch, rng, dropout=dropout)
    scale = n_lm / jnp.maximum(n_ocr, 1.0)  # n_lm, n_ocr come from masks: constants for the gradient
    metrics = {k: v for k, v in metrics.items() if k != "ce"}  # it is lm_ce here
    metrics |= {"lm_ce": s_lm, "ocr_ce": scale * s_ocr, "ocr_char_accuracy": scale * correct}
    ocr = s_ocr if reduction == "sum" else scale * s_ocr
    return s_lm + weight * ocr, w_lm, metrics


# ----------------------------------------------------------------------------------------------
# The branch: resolved from the config, wraps the LM for training, saves the decoder.


@dataclasses.dataclass(frozen=True)
class DualBranch:
    """Stage sft's OCR branch (the `branch` hook of `latent_common.train_latent_stage`)."""

    workdir: Path
    decoder_cfg: Any  # CodebookModelConfig (character decoder) | Ocr2CodebookConfig (OCR-2)
    weight: float
    dropout: float
    view: str = "cot"  # codebook.render_view: what the decoder was trained to read back
    reduction: str = "mean"  # train.sft.loss_reduction
    unit: str = "chain"  # codebook.render_unit: step reads back one latent step a row (data.pipeline)

    @property
    def ocr2(self) -> bool:
        return isinstance(self.decoder_cfg, Ocr2CodebookConfig)

    def data_kwargs(self) -> dict[str, Any]:
        out = {"ocr_text_len": self.decoder_cfg.max_text_len, "ocr_view": self.view}
        if self.unit != "chain":
            out["ocr_unit"] = self.unit
        if self.ocr2:  # targets in the checkpoint's tokens, as the codebook stage trained the decoder
            from dlr_jax.stages.codebook.ocr2 import OcrTokenEncoder

            out["ocr_encode"] = OcrTokenEncoder(load_ocr2_tokenizer_file(self.workdir), self.decoder_cfg.eos_id)
        return out

    def wrap(self, lm, trainable: Any, mesh: Mesh, rules: Any):
        """(DualBranchLM, its loss, LM filter + the OCR branch's params)."""
        build = ocr2_branch_from_codebook_model if self.ocr2 else branch_from_codebook_model
        ocr = build(load_codebook_model(self.workdir, mesh), lm, mesh=mesh, rules=rules)
        loss = functools.partial(dual_branch_loss, vocab_mask=lm.vocab_mask(), weight=self.weight,
                                 dropout=self.dropout, reduction=self.reduction)
        return DualBranchLM(lm, ocr), loss, nnx.Any(trainable, OCR_PARAMS)

    def finish(self, model: DualBranchLM, step: int):
        """Saves the decoder to <workdir>/sft/decoder; returns the latent LM (saved as sft/final)."""
        dec = model.decoder_for_decoding()
        if self.ocr2:
            meta = {"stage": STAGE, "kind": OCR2_DECODER, "model": self.decoder_cfg.to_dict(),
                    "feature_dim": model.ocr.feature_dim, "num_codes": dec.num_codes, "steps": step}
        else:
            meta = {"stage": STAGE, "kind": "ocr_decoder", "model": self.decoder_cfg.to_dict(),
                    "feature_dim": dec.feature_dim, "num_codes": int(dec.vq.codebook.shape[0]), "steps": step}
        save_params(dec, decoder_dir(self.workdir), meta)
        return model.lm


def dual_branch_on(cfg: Config, codebook_kind: str | None, where: str, workdir: str | Path | None = None) -> bool:
    """Whether sft trains the dual branch, given the codebook stage's model (`codebook_kind`: "ocr2" for a
    DeepSeek-OCR-2 one, whose MoE decoder is then D_ocr, any other kind for the from-scratch model with its
    character decoder, None when the stage has not run). `auto` is on for codebook latents of either; `on`
    where it cannot run raises ConfigError (MissingStageError without a codebook stage), naming `where` (the
    codebook's folder, or what stands for it). The stage and the planner (plan_programs) both decide here."""
    mode, source = cfg.latent.dual_branch, cfg.latent.source
    if mode == "off" or (mode == "auto" and (codebook_kind is None or source != "codebook")):
        return False
    if codebook_kind is None:
        raise MissingStageError(
            f"{where}: latent.dual_branch=on needs the codebook stage's OCR decoder; run `python -m dlr_jax.train "
            f"--stage codebook{'' if workdir is None else f' --workdir {workdir}'}` first, or set "
            "latent.dual_branch=auto"
        )
    if source != "codebook":
        raise ConfigError(f"latent.dual_branch=on needs latent.source=codebook (got {source!r}): random ids carry "
                          "no CoT for the OCR decoder to read back")
    return True  # data.pack=true too: its OCR rows come one per segment (data.ocr_rows)


def resolve_dual_branch(cfg: Config, workdir: str | Path) -> DualBranch | None:
    """latent.dual_branch (see `dual_branch_on`) for `workdir`: the branch to train, or None."""
    cb_dir = final_dir(workdir, "codebook")
    have = (cb_dir / "meta.json").is_file()
    kind = (read_meta(cb_dir)["model"].get("kind") or "codebook") if have else None
    where = str(cb_dir if have else cb_dir / "meta.json")
    if not dual_branch_on(cfg, kind, where, workdir):
        return None
    check_render_view(cfg, workdir)
    model = read_meta(cb_dir)["model"]
    dcfg = Ocr2CodebookConfig.from_dict(model) if kind == "ocr2" else CodebookModelConfig.from_dict(model)
    return DualBranch(Path(workdir), dcfg, float(cfg.latent.dual_branch_weight), float(cfg.codebook.char_dropout),
                      cfg.codebook.render_view, cfg.train.sft.loss_reduction, cfg.codebook.render_unit)


# ----------------------------------------------------------------------------------------------
# The stage.


def _from_align(cfg, workdir, tok, mesh):
    return load_latent_stage(cfg, workdir, "align", tok, mesh)


def _check_branch_flip(workdir: str | Path, on: bool) -> None:
    """The dual branch changes the checkpointed tree: resuming with it flipped cannot work. The
    choice is recorded next to the checkpoints (sft/dual_branch.json) and checked on resume."""
    d = stage_dir(workdir, STAGE)
    marker, ckpts = d / "dual_branch.json", d / "checkpoints"
    resuming = ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())
    if resuming and marker.is_file():
        was = bool(json.loads(marker.read_text())["on"])
        if was != on:
            raise ValueError(
                f"{ckpts} was written with the sft dual branch {'on' if was else 'off'}, this run has it "
                f"{'on' if on else 'off'} (latent.dual_branch={'on' if was else 'off'} resumes it); to start "
                f"over with the branch {'on' if on else 'off'}, move {d} away"
            )
    if jax.process_index() == 0:  # one writer, atomically: the other processes read it on resume
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(marker, json.dumps({"on": on}) + "\n")


def run(cfg: Config, workdir: str | Path, *, num_steps: int | None = None) -> TrainResult:
    branch = resolve_dual_branch(cfg, workdir)
    _check_branch_flip(workdir, branch is not None)
    stale = decoder_dir(workdir)
    if branch is None and stale.exists() and jax.process_index() == 0:  # one process moves it
        # An earlier run's decoder must not outlive it: the process reward would read it.
        moved = stale.with_name(f"decoder.stale-{time.strftime('%Y%m%d-%H%M%S')}")
        stale.rename(moved)
        print(f"[sft] dual branch off: moved the earlier run's OCR decoder {stale} to {moved}; the process "
              "reward will use the codebook stage's decoder", flush=True)
    if branch is not None:
        print(f"[sft] dual branch on: OCR decoder from {final_dir(workdir, 'codebook')}, "
              f"weight {branch.weight}; writes {decoder_dir(workdir)}", flush=True)
    curriculum = Curriculum.from_config(cfg.latent, cfg.run.seed)
    if curriculum is not None:
        what = (f"k + 1 every {curriculum.stage_fraction:g} of the steps, the last of {curriculum.num_stages} stages "
                "all latent" if curriculum.mode == "stagewise" else "k drawn per example and epoch")
        print(f"[sft] latent curriculum {curriculum.mode}: the first k steps latent, the rest text ({what}; "
              f"k >= min({curriculum.k_min}, S))", flush=True)
    return train_latent_stage(cfg, workdir, STAGE, _from_align, num_steps=num_steps, branch=branch,
                              curriculum=curriculum)
