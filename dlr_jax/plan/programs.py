"""The programs `python -m dlr_jax.plan` compiles (dlr_jax/plan/cli.py): each stage's real jitted step built
from abstract shapes on the target mesh — the Trainer's step with its loss, shardings, remat and donation
(`align`, `sft` with the dual branch, `rl`), the sampler's prefill + decode loop (`rollout`), and the
codebook stage's step (`codebook`). Nothing is allocated: parameters and batches are ShapeDtypeStructs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dlr_jax.config import Config
from dlr_jax.core.sharding import logical_to_spec, state_shardings
from dlr_jax.stages.common import backbone_architecture, pretrained_tokenizer
from dlr_jax.text.tokens import TOKENIZER_FILE

STAGES = ("textsft", "align", "sft", "rl", "rollout", "codebook")
BOUNDARY_TOKENS = 5  # <pad> and the four boundary tokens a tokenizer may add past the checkpoint's rows


@dataclasses.dataclass
class Program:
    """One jitted program, ready to lower: `jitted.lower(*args)`; `flops_fn(*args)` is the pure function."""

    stage: str
    jitted: Any
    pure: Callable
    args: tuple
    tokens_per_step: int
    steps_per_epoch_examples: int  # examples one step consumes (for totals)
    while_trips: Callable[[Any], int | None] | None = None
    notes: tuple[str, ...] = ()
    mesh: Mesh | None = None  # compiled under this mesh when not the training mesh (the rollout's)


def _KEY_DTYPE() -> Any:  # noqa: N802 - a constant, computed without placing an array on any device
    return jax.eval_shape(lambda: jax.random.key(0)).dtype


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _state_abstract(state: nnx.State, mesh: Mesh, rules: str) -> tuple[Any, Any]:
    """(abstract state: ShapeDtypeStructs with shardings from the logical axes, the shardings tree)."""
    prefix = state_shardings(state, mesh, rules)
    full = jax.tree.map(lambda sh, var: jax.tree.map(lambda _: sh, var), prefix, state)
    return _abstract(state, full), full


def _tokenizer_dir(cfg: Config) -> str | None:
    """Where a run from `tokenizer.path` / `init_from` reads its tokenizer, when its tokenizer.json is there."""
    d = cfg.tokenizer.path or cfg.init_from
    return d if d and (Path(d) / TOKENIZER_FILE).is_file() else None


def backbone_notes(cfg: Config) -> tuple[str, ...]:
    """What a plan read to size the backbone, when not the YAML alone."""
    if not cfg.init_from:
        return ()
    d = cfg.tokenizer.path or cfg.init_from
    vocab = (f"vocabulary: the tokenizer of {d}, as the run's" if _tokenizer_dir(cfg) else
             f"vocabulary: an upper bound (no {TOKENIZER_FILE} in {d}: the checkpoint's rows + {BOUNDARY_TOKENS} "
             "added tokens, rounded up)")
    return (f"backbone: the architecture of {cfg.init_from}/config.json (init_from; no weight read)", vocab)


def latent_lm_abstract(cfg: Config):
    """(graphdef-carrying abstract LatentLM, its LatentConfig) sized as a run would build it: the architecture
    of `stages.common.backbone_architecture` and the pretrained tokenizer's id layout when its files are there;
    otherwise the text rows bounded by the BOUNDARY_TOKENS a tokenizer may add."""
    from dlr_jax.models.latent_lm import LatentConfig, build_latent_lm

    arch = backbone_architecture(cfg)
    mult, k = cfg.tokenizer.pad_multiple, cfg.latent.num_latents
    tok = pretrained_tokenizer(cfg) if _tokenizer_dir(cfg) else None
    if tok is not None:  # as stages.common.backbone_config: the rows are max(checkpoint's, tokenizer's text ids)
        text_rows, total = max(arch.vocab_size, tok.text_vocab_size), tok.total_vocab_size
    else:
        text_rows = _round_up(arch.vocab_size + BOUNDARY_TOKENS, mult)
        total = _round_up(text_rows + k, mult)
    lat = LatentConfig(num_latents=k, latent_dim=cfg.latent.latent_dim, latent_offset=text_rows,
                       total_vocab_size=total, tie_projectors=cfg.latent.tie_projectors,
                       codebook_trainable=cfg.latent.train_codebook_in_sft)
    mcfg = dataclasses.replace(arch, vocab_size=text_rows)
    return nnx.eval_shape(lambda: build_latent_lm(mcfg, lat, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg")))), lat


def _batch_sds(mesh: Mesh, rules: str, accum: int, micro: int, fields: dict[str, tuple[tuple[int, ...], Any]]):
    spec = logical_to_spec(("batch",), (micro,), mesh, rules)
    out = {}
    for k, (shape, dtype) in fields.items():
        sh = NamedSharding(mesh, PartitionSpec(None, spec[0], *([None] * len(shape))))
        out[k] = jax.ShapeDtypeStruct((accum, micro, *shape), dtype, sharding=sh)
    return out


def train_program(cfg: Config, stage: str, mesh: Mesh, *, ocr_slots: int | None = None) -> Program:
    """The Trainer's step for textsft / align / sft / rl (`trainer.build_step_fn`), abstractly: textsft is the
    CoT-SFT baseline's step (`stages.textsft`: the backbone alone, text rows only, every parameter trained, its
    `train.textsft` settings). `ocr_slots`: sft's dual branch on packed rows, S OCR rows a token row
    (`data.ocr_rows.ocr_slots`): its OCR fields [b, S, ...] and `ocr_segment_ids` [b, S] as the packed pipeline
    feeds them; None: one OCR row a token row ([b, ...], padded)."""
    from dlr_jax.models.latent_lm import filter_for_stage
    from dlr_jax.stages.common import lm_loss
    from dlr_jax.training.optimizer import make_optimizer, opt_state_shardings
    from dlr_jax.training.trainer import build_step_fn

    rules = cfg.mesh.rules
    model, lat = latent_lm_abstract(cfg)
    tcfg = getattr(cfg.train, stage)
    vocab_mask = np.ones(lat.total_vocab_size, bool)
    notes = list(backbone_notes(cfg))
    seq = cfg.data.max_len
    if stage == "rl":
        from dlr_jax.stages.rl.loss import make_grpo_loss

        rl = cfg.rl
        loss = make_grpo_loss(temperature=rl.temperature, vocab_mask=vocab_mask, epsilon=rl.epsilon,
                              epsilon_high=rl.epsilon_high, beta=rl.beta, loss_agg_mode=rl.loss_agg_mode,
                              max_completion_length=rl.max_new_tokens)
        prompt = _round_up(rl.max_prompt_tokens or max(1, seq - rl.max_new_tokens), cfg.sampling.prompt_bucket)
        seq = prompt + rl.max_new_tokens
        fields = {"tokens": ((seq,), jnp.int32), "attention_mask": ((seq,), jnp.int32),
                  "completion_mask": ((seq,), jnp.float32), "old_logps": ((seq,), jnp.float32),
                  "advantages": ((), jnp.float32)}
        if rl.beta != 0:
            fields["ref_logps"] = ((seq,), jnp.float32)
        notes.append(f"GRPO update: {tcfg.batch_size} rollouts of {prompt} prompt + {rl.max_new_tokens} new tokens")
    else:
        import functools

        loss = functools.partial(lm_loss, vocab_mask=vocab_mask, reduction=tcfg.loss_reduction)
        fields = {k: ((seq,), jnp.int32) for k in ("tokens", "loss_mask", "segment_ids", "positions")}
    trainable = filter_for_stage(stage, lat)
    if stage == "textsft":  # the baseline trains a plain backbone: no latent rows, no projectors, no codebook
        model, trainable, vocab_mask = model.backbone, nnx.Param, vocab_mask[: lat.latent_offset]
        notes.append("CoT-SFT baseline: the backbone alone, its text rows")
    if stage == "sft" and plans_dual_branch(cfg):
        model, loss, trainable, extra = _dual_branch(cfg, model, trainable, vocab_mask)
        fields |= _ocr_slot_fields(extra, ocr_slots)
        notes.append("with the dual-branch OCR decoder")
        notes += _ocr_rows_note(cfg, ocr_slots)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    p_abs, p_sh = _state_abstract(params, mesh, rules)
    r_abs, r_sh = _state_abstract(rest, mesh, rules)
    tx, schedule = make_optimizer(tcfg)
    o_sh = opt_state_shardings(tx, p_abs, mesh)
    o_abs = _abstract(jax.eval_shape(tx.init, p_abs), o_sh)
    accum = tcfg.grad_accum
    batch = _batch_sds(mesh, rules, accum, tcfg.batch_size // accum, fields)
    rng = jax.ShapeDtypeStruct((), _KEY_DTYPE())
    step = jax.ShapeDtypeStruct((), jnp.int32)
    pure = build_step_fn(graphdef, loss, tx, schedule)
    jitted = jax.jit(pure, in_shardings=(p_sh, r_sh, o_sh, None, None, None), out_shardings=(p_sh, o_sh, None),
                     donate_argnums=(0, 2))
    return Program(stage, jitted, pure, (p_abs, r_abs, o_abs, batch, rng, step), tcfg.batch_size * seq,
                   tcfg.batch_size, notes=tuple(notes))


def _ocr_slot_fields(extra: dict[str, tuple[tuple[int, ...], Any]],
                     ocr_slots: int | None) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The dual branch's OCR fields of one token row: as given ([T], [N]) padded, or `ocr_slots` of each
    ([S, T], [S, N]) plus `ocr_segment_ids` [S] packed: the loss reads only the former (`stages.sft.flat_ocr_rows`),
    but the packed batch carries the ids into the step, so they are among its arguments."""
    if ocr_slots is None:
        return extra
    out = {k: ((ocr_slots, *shape), dtype) for k, (shape, dtype) in extra.items()}
    return out | {"ocr_segment_ids": ((ocr_slots,), jnp.int32)}


def _ocr_rows_note(cfg: Config, ocr_slots: int | None) -> list[str]:
    """What the plan computes of the OCR branch per token row when packing makes it a question (else nothing)."""
    if ocr_slots is not None:
        return [f"packed rows: {ocr_slots} OCR rows a token row (one per segment slot, data.ocr_rows.ocr_slots), "
                "the unused slots' included"]
    if cfg.data.pack:  # the slot count comes from the data's lengths, which packed_totals reads
        return ["the OCR branch is planned at one OCR row a token row (the padded layout: this memory and step); a "
                "packed row computes S of them (data.ocr_rows.ocr_slots, max_len // the shortest sequence; under "
                "data.pack_batch=exact the most segments a row of the run holds), whose step FLOPs the packed totals "
                "count"]
    return []


def plans_dual_branch(cfg: Config) -> bool:
    """Whether sft trains the dual branch once the codebook stage has run: `stages.sft.dual_branch_on` for the
    codebook this config makes (DeepSeek-OCR-2 with codebook.init_from / codebook.pretrained, else from scratch),
    refusing what sft refuses."""
    from dlr_jax.stages.sft import dual_branch_on

    ocr2 = bool(cfg.codebook.init_from) or cfg.codebook.pretrained
    return dual_branch_on(cfg, "ocr2" if ocr2 else "codebook", "the codebook stage this config runs")


def _dual_branch(cfg: Config, lm: Any, trainable: Any, vocab_mask: np.ndarray):
    import functools

    from dlr_jax.models.codebook_model import CodebookModel, CodebookModelConfig
    from dlr_jax.models.dual_branch import OCR_PARAMS, DualBranchLM, OCRBranch
    from dlr_jax.stages.sft import dual_branch_loss

    if cfg.codebook.init_from or cfg.codebook.pretrained:
        return _ocr2_dual_branch(cfg, lm, trainable, vocab_mask)
    dcfg = CodebookModelConfig.from_config(cfg)
    d = lm.backbone.cfg.hidden_size  # the checkpoint's width under init_from, not the YAML's

    def build():
        cb = CodebookModel(dcfg, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg")))
        return DualBranchLM(lm, OCRBranch(dcfg, d, rngs=nnx.Rngs(0), decoder=cb.decoder))

    model = nnx.eval_shape(build)
    loss = functools.partial(dual_branch_loss, vocab_mask=vocab_mask, weight=cfg.latent.dual_branch_weight,
                             dropout=cfg.codebook.char_dropout, reduction=cfg.train.sft.loss_reduction)
    n = dcfg.num_queries
    extra = {"ocr_targets": ((dcfg.max_text_len,), jnp.int32), "ocr_codes": ((n,), jnp.int32),
             "ocr_code_mask": ((n,), jnp.int32)}
    return model, loss, nnx.Any(trainable, OCR_PARAMS), extra


def _ocr2_dual_branch(cfg: Config, lm: Any, trainable: Any, vocab_mask: np.ndarray):
    """sft's branch on a DeepSeek-OCR-2 codebook: the checkpoint's MoE decoder (from codebook.init_from's
    config.json, no weights read) behind the learned map from the LM's width; codes for the largest canvas."""
    import functools

    from dlr_jax.models.dual_branch import OCR_PARAMS, DualBranchLM
    from dlr_jax.models.ocr2_branch import Ocr2Branch
    from dlr_jax.stages.codebook import ocr2 as o2
    from dlr_jax.stages.sft import dual_branch_loss

    o2.check_start(cfg, "planning sft's dual branch")
    cb = o2.abstract_model(cfg)
    d = lm.backbone.cfg.hidden_size

    def build():
        o = cb.ocr2
        flow = cb.cfg.quantize_at == "flow"
        return DualBranchLM(lm, Ocr2Branch(cb.cfg, text=o.text, prefix_map=jnp.zeros((d, cb.cfg.code_dim)),
                                           view_separator=o.view_separator, projector=o.projector if flow else None,
                                           projector_bias=o.projector_bias if flow else None))

    model = nnx.eval_shape(build)
    loss = functools.partial(dual_branch_loss, vocab_mask=vocab_mask, weight=cfg.latent.dual_branch_weight,
                             reduction=cfg.train.sft.loss_reduction)
    n = (cfg.codebook.max_side // 64) ** 2  # the largest canvas's codes: the memory bound
    extra = {"ocr_targets": ((cb.cfg.max_text_len,), jnp.int32), "ocr_codes": ((n,), jnp.int32),
             "ocr_code_mask": ((n,), jnp.int32)}
    return model, loss, nnx.Any(trainable, OCR_PARAMS), extra


def rollout_program(cfg: Config, mesh: Mesh) -> Program:
    """The sampler's decode loop (`sampling.decode_loop`) over a full KV cache, with the prefill's cache as
    input: one rollout batch of rl.num_prompts x rl.group_size rows."""
    from dlr_jax.generate.sampler import DecodeConfig, Sampler, decode_loop
    from dlr_jax.generate.sampling_copy import copy_dtype, sample_mesh_for

    rules = cfg.mesh.rules
    model, lat = latent_lm_abstract(cfg)
    graphdef, state = nnx.split(model)
    rl = cfg.rl
    # what `--stage rl` decodes with: the policy's sampling copy, in its dtype and decoding layout
    mesh = sample_mesh_for(rl.sample_mesh, mesh, model.backbone.cfg, lat.total_vocab_size)
    s_abs, _ = _state_abstract(state, mesh, rules)
    dtype = copy_dtype(rl.sample_dtype, model.backbone.cfg)
    if dtype is not None:
        floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
        s_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding) if floating(x)
                             else x, s_abs)
    b = rl.num_prompts * rl.group_size
    prompt = _round_up(rl.max_prompt_tokens or max(1, cfg.data.max_len - rl.max_new_tokens),
                       cfg.sampling.prompt_bucket)
    cache_len = prompt + rl.max_new_tokens
    sampler = Sampler((graphdef, s_abs), mesh=mesh, rules=rules, prompt_bucket=cfg.sampling.prompt_bucket,
                      unstack_layers=cfg.sampling.unstack)
    _, decode = sampler.compiled_fns(b, cache_len, lat.total_vocab_size)
    cache_abs = sampler.abstract_cache(b, cache_len)
    cache_sh = sampler.cache_shardings(b, cache_len)
    cache = _abstract(cache_abs, cache_sh)
    f32, i32 = jnp.float32, jnp.int32
    bv = NamedSharding(mesh, logical_to_spec(("batch", "act_vocab"), (b, lat.total_vocab_size), mesh, rules))
    rep = NamedSharding(mesh, PartitionSpec())
    dcfg = DecodeConfig(rl.max_new_tokens, False, rl.top_k, rl.top_p < 1.0, None, True, sampler.unstack_layers)
    args = (graphdef, dcfg, s_abs, cache, jax.ShapeDtypeStruct((b, lat.total_vocab_size), f32, sharding=bv),
            jax.ShapeDtypeStruct((b,), i32), jax.ShapeDtypeStruct((8,), i32, sharding=rep),
            jax.ShapeDtypeStruct((lat.total_vocab_size,), bool, sharding=rep), jax.ShapeDtypeStruct((), i32),
            jax.ShapeDtypeStruct((), f32), jax.ShapeDtypeStruct((), f32),
            jax.ShapeDtypeStruct((), _KEY_DTYPE()), None)
    trips = rl.max_new_tokens - 1
    return Program("rollout", decode, decode_loop, args, b * rl.max_new_tokens, rl.num_prompts,
                   while_trips=lambda eqn: trips, mesh=mesh,
                   notes=(*backbone_notes(cfg),
                          f"{b} rows, cache of {cache_len} ({prompt} prompt + {rl.max_new_tokens} new); "
                          f"FLOPs count {trips} decode steps",
                          f"sampling copy: {dtype or 'parameter dtype'} on mesh {dict(mesh.shape)} "
                          f"(rl.sample_mesh={rl.sample_mesh!r}, rl.sample_dtype={rl.sample_dtype!r})"))


def build_program(cfg: Config, stage: str, mesh: Mesh, *, ocr_slots: int | None = None) -> Program:
    """The stage's program on `mesh`; `ocr_slots`: sft's dual branch on packed rows (`train_program`), ignored by
    the other stages and by sft without the branch."""
    if stage in ("textsft", "align", "sft", "rl"):
        return train_program(cfg, stage, mesh, ocr_slots=ocr_slots)
    if stage == "rollout":
        return rollout_program(cfg, mesh)
    if stage == "codebook":
        return codebook_program(cfg, mesh)
    raise ValueError(f"unknown stage {stage!r}; plan one of {STAGES}")


def codebook_program(cfg: Config, mesh: Mesh) -> Program:
    from dlr_jax.models.codebook_model import CodebookModel, CodebookModelConfig
    from dlr_jax.stages.codebook.ocr2 import check_start
    from dlr_jax.stages.codebook.stage import main_phase_loss
    from dlr_jax.training.optimizer import make_optimizer, opt_state_shardings
    from dlr_jax.training.trainer import build_step_fn

    check_start(cfg, "planning the codebook stage")
    rules, cb = cfg.mesh.rules, cfg.codebook
    side = cb.max_side  # the largest canvas: the memory bound of the stage
    if cb.init_from:  # the pretrained DeepSeek-OCR-2 the stage fine-tunes (stages/codebook_ocr2.py)
        from dlr_jax.stages.codebook import ocr2 as o2
        model = o2.abstract_model(cfg)
        n = model.cfg.ocr2.encoder.vision.num_tokens(side, side)
        what = (f"DeepSeek-OCR-2 of {cb.init_from} (its config.json; no weight read), VQ at {cb.quantize_at} "
                f"(d_c = {model.cfg.code_dim}), targets of {cb.max_text_len} tokens")
    else:
        mcfg = CodebookModelConfig.from_config(cfg)
        model = nnx.eval_shape(lambda: CodebookModel(mcfg, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg"))))
        n = (side // 64) ** 2
        what = "from-scratch encoder and character decoder (codebook.init_from unset)"
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    p_abs, p_sh = _state_abstract(params, mesh, rules)
    r_abs, r_sh = _state_abstract(rest, mesh, rules)
    tx, schedule = make_optimizer(cb.train)
    o_sh = opt_state_shardings(tx, p_abs, mesh)
    o_abs = _abstract(jax.eval_shape(tx.init, p_abs), o_sh)
    accum = cb.train.grad_accum
    batch = _batch_sds(mesh, rules, accum, cb.train.batch_size // accum,
                       {"images": ((side, side), jnp.uint8), "targets": ((cb.max_text_len,), jnp.int32),
                        "alpha": ((), jnp.float32)})
    pure = build_step_fn(graphdef, main_phase_loss(cfg), tx, schedule)
    jitted = jax.jit(pure, in_shardings=(p_sh, r_sh, o_sh, None, None, None), out_shardings=(p_sh, o_sh, None),
                     donate_argnums=(0, 2))
    rng = jax.ShapeDtypeStruct((), _KEY_DTYPE())
    return Program("codebook", jitted, pure, (p_abs, r_abs, o_abs, batch, rng, jax.ShapeDtypeStruct((), jnp.int32)),
                   cb.train.batch_size * (n + cb.max_text_len), cb.train.batch_size,
                   notes=(what, f"{side}-px canvases (N = {n}), the stage's largest", "alpha > 0: CE(H) included"))
