"""Stage codebook (the paper's stage 1): learn a discrete codebook by rendering CoTs and reading them back.

    image --encoder--> H --nearest code (+ N(0, sigma^2) noise)--> H_st --OCR decoder--> CoT text
    loss = CE(H_st) + alpha(step) * CE(H) + lambda_vq * (||sg(H) - C||^2 + beta ||H - sg(C)||^2)

Order of work (each part resumes):
  1. optional continuous warm-up: `codebook.warmup_steps` steps of CE(H) alone (codebook frozen),
     so a from-scratch encoder + decoder learn to read before anything is quantized
     (<workdir>/codebook/warmup/); `warmup_char_dropout` = 1 hides all teacher-forced input
     characters there, so only reading the image lowers the loss; `warmup_piece_chars` > 0 trains
     it on short pieces of the CoTs (a length curriculum) instead of whole ones, and
     `warmup_whole_steps` more continuous steps on whole CoTs follow (<workdir>/codebook/warmup_whole/),
     so the decoder learns to find every line of a full canvas before the features are quantized;
  2. k-means warm start of the codebook on encoder features of `kmeans_init_batches` rendered
     batches (skipped when resuming the main phase);
  3. the main phase: alpha decays 1 -> 0 linearly over `alpha_steps` steps (-1 = one epoch, the
     paper; from scratch that is too short: the decoder learns a language prior first); once alpha is 0 the batches
     stop carrying an `alpha` field, the step is retraced without the continuous branch and CE(H)
     costs nothing. Teacher-forced decoder inputs lose `char_dropout` of their characters.
     Unused codes can be refreshed every `dead_code_every` steps from recent features.
  4. held-out report (stages/codebook_eval.py): greedy CER with each example's own ids vs ids
     shuffled across examples of the same N (a decoder that ignores the codes scores the same on
     both), codebook usage.

Writes <workdir>/codebook/{codebook.npy [K, d_c], report.json, corpus.json (the corpus's sources and
sample sizes), final/ (params + meta.json), checkpoints/, metrics.jsonl}. Metrics per log step: loss (the
optimised one: per char, or per image under codebook.train.loss_reduction=sum, the paper's sums), ce_q
(CE(H_st) per char), ce_c, vq, commit (per element), perplexity / used_codes (of the batch), char_accuracy,
images_per_token (images/s = tokens_per_s * images_per_token).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlr_jax.config import Config, to_dict
from dlr_jax.core.files import atomic_path, write_text_atomic
from dlr_jax.core.metrics_log import ProfileWindow
from dlr_jax.core.sharding import create_sharded, host_value, put_global
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.protocol import record
from dlr_jax.data.sources import corpus, corpus_texts
from dlr_jax.models.codebook_model import (
    CodebookModel,
    CodebookModelConfig,
    char_dropout,
    encode_images,
    init_rngs,
    teacher_inputs,
)
from dlr_jax.models.vq import code_usage, kmeans_init, nearest_codes, refresh_dead_codes, vq_objective
from dlr_jax.run.checkpoint import save_params
from dlr_jax.run.workdir import final_dir, stage_dir
from dlr_jax.stages import common
from dlr_jax.stages.codebook.eval import print_summary, reconstruction_report
from dlr_jax.stages.codebook.models import OCR2_TOKENIZER, encode_ids
from dlr_jax.text.ocr_text import VOCAB
from dlr_jax.training.reduction import check_reduction, vq_weights
from dlr_jax.training.trainer import Trainer

STAGE = "codebook"
CORPUS_FILE = "corpus.json"  # <workdir>/codebook/corpus.json: the training corpus's sources, as read


# ----------------------------------------------------------------------------------------------
# Data.


def open_render_cache(cfg: Config, texts: Sequence[str]) -> Any:
    """The training corpus rendered once (`codebook.render_cache`, checked against this config and
    corpus: a mismatch raises), or None to render on the fly."""
    if not cfg.codebook.render_cache:
        return None
    from dlr_jax.data.render_corpus import RenderCache

    cache = RenderCache(cfg.codebook.render_cache, split="train")
    cache.check(texts, rp.render_config(cfg.codebook), cfg.run.seed)
    print(f"[codebook] training images read from the render cache {cfg.codebook.render_cache}", flush=True)
    return cache


class _AlphaFeed:
    """Adds `alpha` [b] to each batch while alpha(step) > 0 (the step comes from the trainer, so
    resuming restores it); forwards grain's get_state / set_state."""

    def __init__(self, it: Iterator, trainer: Trainer, alpha_steps: int):
        self.it, self.trainer, self.alpha_steps = it, trainer, alpha_steps
        self.times: list[float] = []
        self.images = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self.it))
        self.times.append(time.perf_counter())
        self.images += len(batch["images"])
        a = alpha_at(self.trainer.step, self.alpha_steps)
        if a > 0:
            batch["alpha"] = np.full(len(batch["images"]), a, np.float32)
        return batch

    def get_state(self) -> Any:
        return self.it.get_state()

    def set_state(self, state: Any) -> None:
        self.it.set_state(state)

    def images_per_s(self, skip: int = 3) -> float | None:
        """Steady-state rate: the first `skip` steps (compilations) are left out; None if too few."""
        t = self.times[skip:]
        if len(t) < 2:
            return None
        return (len(t) - 1) * self.trainer.cfg.batch_size / (t[-1] - t[0])


def alpha_at(step: int, alpha_steps: int) -> float:
    """alpha = 1 - step / alpha_steps, clipped at 0 (alpha_steps = 0: always 0)."""
    return 0.0 if alpha_steps <= 0 else max(0.0, 1.0 - step / alpha_steps)


# ----------------------------------------------------------------------------------------------
# Losses (trainer contract: (loss_sum, weight = #target chars, metric sums)).


def _nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def codebook_loss(model: CodebookModel, batch: dict, rng: jax.Array, *, lambda_vq: float, beta: float,
                  dropout: float, reduction: str = "mean"):
    """CE(H_st) + alpha * CE(H) + lambda_vq * (vq + beta * commit); CE(H) only if `alpha` is present.

    batch: images [b, side, side], targets [b, T] (characters, <pad> after <eos>), alpha [b] (optional).
    reduction "mean": the CEs per target character, vq / commit per element of the [b, N, d_c] features.
    "sum" (the paper's): per image, the CEs summed over its characters and vq / commit summed over its N
    latents' squared norms ||sg(h_i) - c_{a_i}||^2; averaged over the batch's images (weight = b).
    Metrics are divided by the characters (`tokens`) either way: ce_q / ce_c per character, vq / commit
    per element, so runs under either reduction log comparable numbers."""
    check_reduction(reduction)
    k_noise, k_drop = jax.random.split(rng)
    targets = batch["targets"]
    b = targets.shape[0]
    h = model.encode(batch["images"])
    ids, h_st, vq, commit = model.vq(h, rng=k_noise)
    inputs, in_mask = teacher_inputs(targets)
    inputs = char_dropout(inputs, dropout, k_drop)
    tmask = (targets != VOCAB.PAD).astype(jnp.float32)
    ntok = jnp.sum(tmask)
    metrics = {}
    if "alpha" in batch:  # one decoder call over [H_st ; H]
        logits = model.decoder_logits(jnp.concatenate([h_st, h]), jnp.tile(inputs, (2, 1)),
                                      jnp.tile(in_mask, (2, 1)))
        nll = _nll(logits, jnp.tile(targets, (2, 1))) * jnp.tile(tmask, (2, 1))
        nll_q, nll_c = nll[:b], nll[b:]
        ce_c = jnp.sum(nll_c * batch["alpha"][:, None])
        metrics["ce_c"] = jnp.sum(nll_c)
        logits = logits[:b]
    else:
        logits = model.decoder_logits(h_st, inputs, in_mask)
        nll_q = _nll(logits, targets) * tmask
        ce_c = 0.0
    _, used, ppl = code_usage(ids, model.cfg.num_codes)
    metrics |= {
        "ce_q": jnp.sum(nll_q),
        "vq": vq * ntok,
        "commit": commit * ntok,
        "perplexity": ppl * ntok,
        "used_codes": used.astype(jnp.float32) * ntok,
        "char_accuracy": jnp.sum((jnp.argmax(logits, -1) == targets) * tmask),
        "images_per_token": jnp.float32(b),
        "tokens": ntok,
    }
    weight, vq_scale = vq_weights(h, ntok, reduction)
    return jnp.sum(nll_q) + ce_c + vq_scale * vq_objective(vq, commit, lambda_vq, beta), weight, metrics


def main_phase_loss(cfg: Config):
    """The main phase's loss, as the stage trains it and the planner compiles it: over characters, or over the
    checkpoint's tokens when codebook.init_from fine-tunes DeepSeek-OCR-2 (codebook.train.loss_reduction)."""
    cb = cfg.codebook
    if cb.init_from:
        from dlr_jax.stages.codebook.ocr2 import ocr2_codebook_loss

        return functools.partial(ocr2_codebook_loss, lambda_vq=cb.lambda_vq, beta=cb.beta,
                                 router_aux_coef=cb.router_aux_coef, reduction=cb.train.loss_reduction)
    return functools.partial(codebook_loss, lambda_vq=cb.lambda_vq, beta=cb.beta, dropout=cb.char_dropout,
                             reduction=cb.train.loss_reduction)


def warmup_loss(model: CodebookModel, batch: dict, rng: jax.Array, *, dropout: float, reduction: str = "mean"):
    """CE(H): the continuous branch alone (no quantization); per character (mean) or per image (sum)."""
    check_reduction(reduction)
    targets = batch["targets"]
    inputs, in_mask = teacher_inputs(targets)
    logits = model.decoder_logits(model.encode(batch["images"]), char_dropout(inputs, dropout, rng), in_mask)
    tmask = (targets != VOCAB.PAD).astype(jnp.float32)
    ce, ntok = jnp.sum(_nll(logits, targets) * tmask), jnp.sum(tmask)
    weight = ntok if reduction == "mean" else jnp.float32(targets.shape[0])
    return ce, weight, {"ce_c": ce, "images_per_token": jnp.float32(targets.shape[0]), "tokens": ntok}


# ----------------------------------------------------------------------------------------------
# Codebook maintenance.


def _features(model: CodebookModel, plan: rp.BatchPlan, start: int, num_batches: int) -> np.ndarray:
    """[M, d_c] encoder features of plan batches start .. start + num_batches - 1."""
    feats = []
    for i in range(start, start + num_batches):
        batch = rp.render_train_batch(i, None, plan=plan, rows=slice(None))
        feats.append(encode_images(model, batch["images"]).reshape(-1, model.cfg.code_dim))
    return np.concatenate(feats)


def kmeans_codebook(model: CodebookModel, plan: rp.BatchPlan, num_batches: int, *, seed: int,
                    iters: int = 10) -> tuple[np.ndarray, dict[str, Any]]:
    """k-means codebook [K, d_c] from the features of `num_batches` batches (more are read while
    there are fewer features than codes; if still short, codes are features plus small noise)."""
    k = model.cfg.num_codes
    feats = _features(model, plan, len(plan) // 2, num_batches)
    extra = 0
    while len(feats) < k and extra < 4 * num_batches:
        feats = np.concatenate([feats, _features(model, plan, len(plan) // 2 + num_batches + extra, 1)])
        extra += 1
    rng = jax.random.key(seed)
    if len(feats) < k:
        pick = np.random.default_rng(seed).integers(0, len(feats), k)
        noise = 0.01 * feats.std(0) * np.random.default_rng(seed + 1).standard_normal((k, feats.shape[1]))
        return (feats[pick] + noise).astype(np.float32), {"features": len(feats), "kmeans": False}
    codebook, history = kmeans_init(feats, k, rng=rng, iters=iters)
    return np.asarray(codebook), {"features": len(feats), "kmeans": True, "inertia": history.tolist()}


def _set_codebook(trainer: Trainer, value: np.ndarray) -> None:
    var = trainer.params["vq"]["codebook"]
    old = var.get_value()
    var.set_value(put_global(np.asarray(value, old.dtype), old.sharding))  # multi-process safe


def refresh_codes(trainer: Trainer, plan: rp.BatchPlan, num_batches: int, seed: int, pick: str = "random") -> int:
    """Replaces codes no probe feature picks with probe features (+ noise); returns how many. The codebook
    and the features are host copies (the same on every process), so the new rows are too."""
    model = nnx.merge(trainer.graphdef, trainer.params, trainer.rest)
    start = (trainer.step * num_batches) % len(plan)
    feats = jnp.asarray(_features(model, plan, start, num_batches))
    codebook = jnp.asarray(host_value(trainer.params["vq"]["codebook"].get_value()))
    counts, _, _ = code_usage(nearest_codes(feats, codebook), model.cfg.num_codes)
    key = jax.random.fold_in(jax.random.key(seed), trainer.step)
    new, dead = refresh_dead_codes(codebook, counts.astype(jnp.float32), feats, key, 0.5, pick=pick)
    _set_codebook(trainer, np.asarray(new))
    return int(jnp.sum(dead))


# ----------------------------------------------------------------------------------------------
# The stage.


def model_config(cfg: Config) -> CodebookModelConfig:
    return CodebookModelConfig.from_config(cfg)


def _render_rate(plan: rp.BatchPlan, n: int = 256) -> float:
    from dlr_jax.text.render import render_cot_ex

    idx = np.arange(min(n, plan.stats.examples))
    t0 = time.perf_counter()
    for i in idx:
        render_cot_ex(plan.texts[i], font_size=int(plan.fonts[i]), config=plan.config)
    return len(idx) / (time.perf_counter() - t0)


def run(cfg: Config, workdir: str | Path, *, num_steps: int | None = None) -> dict[str, Any]:
    """Trains (or resumes) the codebook stage; returns the report (also in codebook/report.json).
    `num_steps` (default codebook.train.num_steps) counts main-phase steps; the continuous warm-up's
    codebook.warmup_steps come on top."""
    cb, seed = cfg.codebook, cfg.run.seed
    from dlr_jax.stages.codebook.ocr2 import check_start

    check_start(cfg, "the codebook stage")
    (texts, corpus_info), held_out = corpus(cfg), corpus_texts(cfg, held_out=True)  # inputs validate first
    common.prepare_workdir(cfg, workdir)
    out = stage_dir(workdir, STAGE)
    # what the corpus was (per source: counts, sample seed, ids digest); a resume must read the same one
    record(out, corpus_info, write=jax.process_index() == 0, name=CORPUS_FILE)
    mesh = common.make_mesh_for(cfg)
    tok = None
    if cb.init_from:  # pretrained DeepSeek-OCR-2 (stages/codebook_ocr2.py)
        from dlr_jax.stages.codebook import ocr2 as o2
        model, tok = o2.build_model(cfg, mesh)
        mcfg = model.cfg
    else:
        mcfg = model_config(cfg)
    if cb.eval_examples:
        held_out = held_out[: cb.eval_examples]
    plan = rp.BatchPlan(texts, batch_size=cb.train.batch_size, seed=seed, config=rp.render_config(cb),
                        max_text_len=cb.max_text_len, cache=open_render_cache(cfg, texts))
    print(f"[codebook] {len(texts)} training CoTs, {len(held_out)} held out; plan {plan.stats.as_dict()}",
          flush=True)
    # num_epochs -> steps over the plan's full batches (what one epoch of `plan` feeds)
    main_train = common.resolve_schedule(cb.train, len(plan) * cb.train.batch_size, workdir, STAGE)
    total = num_steps or main_train.num_steps
    alpha_steps = len(plan) if cb.alpha_steps < 0 else cb.alpha_steps

    def data(offset: int, use: rp.BatchPlan = plan):
        return iter(rp.make_render_dataset(use.with_seed(seed + offset) if offset else use,
                                           shard_index=jax.process_index(), shard_count=jax.process_count(),
                                           num_workers=cfg.data.num_workers))

    wdrop = cb.char_dropout if cb.warmup_char_dropout is None else cb.warmup_char_dropout

    def warm_up(model: CodebookModel, steps: int, sub: str, stream) -> nnx.Module | dict[str, Any]:
        """`steps` continuous-branch steps in <out>/<sub> (resumable); the model, or the preemption record."""
        warm = Trainer(model, functools.partial(warmup_loss, dropout=wdrop, reduction=cb.train.loss_reduction),
                       dataclasses.replace(cb.train, num_steps=steps, profile_steps=""), out / sub,  # window: main
                       trainable=nnx.All(nnx.Param, nnx.Not(nnx.PathContains("vq"))), mesh=mesh,
                       rules=cfg.mesh.rules, name=f"codebook-{sub.replace('_', '-')}")
        warmed = warm.fit(stream, steps)
        if warmed.preempted:  # SIGTERM in a warm-up: stop here, the next run resumes it
            return {"preempted": True, "phase": sub, "step": warmed.step}
        return warmed.model

    if tok is None:
        model = create_sharded(lambda: CodebookModel(mcfg, rngs=init_rngs(seed)), mesh, cfg.mesh.rules)
        if cb.encoder_from:  # codebook.encoder=qwen3_vl from a Qwen3-VL checkpoint's vision weights
            from dlr_jax.convert.qwen3_vl_vision import import_tower

            import_tower(model.encoder.tower, cb.encoder_from, mesh=mesh, rules=cfg.mesh.rules)
    if cb.warmup_steps > 0:
        warm_plan = plan
        if cb.warmup_piece_chars > 0:
            pieces = [p for t in texts for p in rp.cot_pieces(t, cb.warmup_piece_chars)]
            warm_plan = rp.BatchPlan(pieces, batch_size=cb.train.batch_size, seed=seed + 1,
                                     config=rp.render_config(cb), max_text_len=cb.max_text_len)
            print(f"[codebook] warm-up on {len(pieces)} pieces of <= {cb.warmup_piece_chars} chars; plan "
                  f"{warm_plan.stats.as_dict()}", flush=True)
        model = warm_up(model, cb.warmup_steps, "warmup", data(1, warm_plan))
        if isinstance(model, dict):
            return model
    if cb.warmup_whole_steps > 0:  # the curriculum's second half: whole CoTs, still continuous
        model = warm_up(model, cb.warmup_whole_steps, "warmup_whole", data(2))
        if isinstance(model, dict):
            return model
    loss = main_phase_loss(cfg)
    feed_it = data(0)
    if tok is not None:
        feed_it = o2.TokenTargets(feed_it, plan.texts, tok, cb.max_text_len, mcfg.eos_id)
    trainer = Trainer(model, loss, main_train, out, mesh=mesh, rules=cfg.mesh.rules, name=STAGE)
    init_info: dict[str, Any] = {}
    if trainer.ckpt.latest_step() is None and cb.kmeans_init_batches > 0:
        t0 = time.perf_counter()
        codebook, init_info = kmeans_codebook(model, plan, cb.kmeans_init_batches, seed=seed, iters=cb.kmeans_iters)
        _set_codebook(trainer, codebook)
        print(f"[codebook] k-means init from {init_info['features']} features in {time.perf_counter() - t0:.1f}s",
              flush=True)
    feed = _AlphaFeed(feed_it, trainer, alpha_steps)
    refreshed = []
    if cb.dead_code_every <= 0:
        result = trainer.fit(feed, total)
    else:  # fit in chunks; codes are refreshed between chunks (after a resume, too: same step, same rng)
        trainer.restore(feed)
        result = None
        # one profiler window over the whole main phase (a window may span a refresh), not one per chunk
        window = ProfileWindow(main_train.profile_steps, out / "profile", STAGE, trainer.step, total)
        try:
            while trainer.step < total and not (result and result.preempted):
                if trainer.step and trainer.step % cb.dead_code_every == 0:
                    dead = refresh_codes(trainer, plan, cb.dead_code_batches, seed, cb.dead_code_pick)
                    refreshed.append((trainer.step, dead))
                result = trainer.fit(feed, min(total, (trainer.step // cb.dead_code_every + 1) * cb.dead_code_every),
                                     resume=False, bar_total=total, window=window)
            result = result or trainer.fit(feed, total, resume=False, window=window)
        finally:
            window.close()
    if result.preempted:
        return {"preempted": True, "phase": "main", "step": result.step}

    model = result.model
    codebook = host_value(model.vq.codebook[...])
    if jax.process_index() == 0:  # every process holds the same codebook; one writes it
        with atomic_path(out / "codebook.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, codebook)
    report: dict[str, Any] = {
        "K": mcfg.num_codes, "d_c": mcfg.code_dim, "steps": result.step, "alpha_steps": alpha_steps,
        "warmup_steps": cb.warmup_steps, "warmup_whole_steps": cb.warmup_whole_steps,
        "char_dropout": cb.char_dropout, "sigma": cb.sigma,
        "train_images_per_s": feed.images_per_s(), "render_images_per_s_one_thread": _render_rate(plan),
        "plan": plan.stats.as_dict(), "init": init_info, "dead_code_refreshes": refreshed,
        "last_metrics": result.history[-1] if result.history else {},
    }
    if held_out and tok is not None:
        report["held_out"] = o2.held_out_report(model, held_out, cb, tok, seed=seed)
    elif held_out:
        report["held_out"] = reconstruction_report(model, held_out, cb, seed=seed)
    sample = texts[: max(4 * cb.eval_examples, 1)]
    ids, _, enc_rate = encode_ids(model, sample, cb)
    _, used, ppl = code_usage(jnp.asarray(np.concatenate([np.asarray(z) for z in ids])), mcfg.num_codes)
    report["train_sample"] = {"examples": len(sample), "perplexity": float(ppl), "used_codes": int(used),
                              "encoder_vq_images_per_s": enc_rate}
    if jax.process_index() == 0:  # every process holds the same report; one writes it
        write_text_atomic(out / "report.json", json.dumps(report, indent=2))
    if tok is not None and jax.process_index() == 0:  # later stages read OCR-2 tokens back without init_from
        final_dir(workdir, STAGE).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(cb.init_from) / OCR2_TOKENIZER, final_dir(workdir, STAGE) / OCR2_TOKENIZER)
    save_params(model, final_dir(workdir, STAGE),
                {"stage": STAGE, "kind": "codebook", "model": mcfg.to_dict(), "codebook": to_dict(cb),
                 "steps": result.step})
    print_summary(report)
    return report
