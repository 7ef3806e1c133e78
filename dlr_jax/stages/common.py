"""What every stage shares: the workdir it writes, the tokenizer, its examples, the backbone, the LM loss.

The layout of the workdir is `dlr_jax.run.workdir`'s; a finished stage hands its model on through
`dlr_jax.run.handoff` (save_stage_model / load_stage_model), which evaluation and export read too.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config, ConfigError, ModelConfig, save_config
from dlr_jax.config.model import RUN_MODEL_KEYS as RUN_MODEL_KEYS  # public here too
from dlr_jax.core.files import write_text_atomic
from dlr_jax.core.sharding import create_sharded, mesh_from_config
from dlr_jax.data.records import Example
from dlr_jax.data.sources import load_examples, rl_split_for
from dlr_jax.models.hf_config import ConversionError, model_config_from_hf
from dlr_jax.run.preflight import check_lengths
from dlr_jax.run.workdir import recordable, stage_dir
from dlr_jax.text.tokens import TOKENIZER_FILE, Tokenizer, train_bpe
from dlr_jax.training.reduction import check_reduction, count_examples


def prepare_workdir(cfg: Config, workdir: str | Path, train: list[Example] | None = None) -> Path:
    """Creates the workdir and records the resolved config (the one that ran). `train`: the training examples of
    a stage that splits them into SFT and RL parts, whose sizes are checked first (a count meant for a larger
    file would otherwise stop the stage after its tokenizer was written, binding the workdir to the config)."""
    check_lengths(cfg)  # latents that leave align and sft no room refuse the run before any stage writes
    if train is not None:
        from dlr_jax.data.protocol import rl_count

        rl_count(len(train), rl_split_for(cfg, train)[0])
    w = Path(workdir)
    w.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:  # one writer; every process holds the same cfg
        save_config(recordable(cfg, w), w / "config.yaml")
    return w


def reads_init_from(cfg: Config, stage: str, mode: str = "both") -> bool:
    """Whether `stage` loads `init_from`'s weights: textsft (not the direct_from_cot control, which starts from
    CoT-SFT), align (the latent LM is built on the checkpoint), rl when the process reward's evaluator is the
    backbone; sft and the others start from earlier stages' outputs."""
    if stage == "textsft":
        return mode != "direct_from_cot"
    if stage == "rl":
        return cfg.rl.evaluator == "backbone" and cfg.rl.process_weight > 0
    return stage in ("align", "all")


def check_init_from(cfg: Config, stage: str, workdir: str | Path, mode: str = "both") -> None:
    """With `init_from`, a stage that loads the checkpoint needs its config.json (a supported family), its
    safetensors weights and, until the workdir has a tokenizer, its tokenizer.json (or `tokenizer.path`'s):
    a ConfigError names what is missing before the workdir is touched. Only files are checked; no weight is read."""
    if not cfg.init_from or not reads_init_from(cfg, stage, mode):
        return
    d = Path(cfg.init_from)
    layout = "a Hugging Face checkpoint folder: config.json, *.safetensors, tokenizer.json"
    if d.is_file() and d.suffix.lower() == ".gguf":  # python -m dlr_jax.train converts it; a stage's API does not
        raise ConfigError(f"init_from={cfg.init_from}: a GGUF file; convert it first (python -m dlr_jax.convert "
                          "--from-gguf FILE --out DIR, then init_from=DIR) or start the stage with python -m "
                          "dlr_jax.train, which converts it into <workdir>/init_from/")
    if d.is_file():  # e.g. the checkpoint's config.json itself
        raise ConfigError(f"init_from={cfg.init_from}: a file; init_from takes the folder holding it ({layout})")
    if not d.is_dir():
        raise ConfigError(f"init_from={cfg.init_from}: no such folder (expected {layout})")
    try:
        model_config_from_hf(d)
    except ConversionError as e:
        raise ConfigError(f"init_from: {e}") from None
    if not any(d.glob("*.safetensors")):
        raise ConfigError(f"init_from={cfg.init_from}: no *.safetensors weights (expected {layout})")
    tok = Path(cfg.tokenizer.path or cfg.init_from)
    if not (Path(workdir) / "tokenizer" / TOKENIZER_FILE).is_file() and not (tok / TOKENIZER_FILE).is_file():
        which = "tokenizer.path" if cfg.tokenizer.path else "init_from"
        raise ConfigError(f"{which}={tok}: no {TOKENIZER_FILE} (only fast Hugging Face tokenizers are supported; "
                          "set tokenizer.path to a folder that has one)")


def make_mesh_for(cfg: Config) -> Mesh:
    return mesh_from_config(cfg.mesh)


# ------------------------------------------------------------------------------------------------
# Data and tokenizer.


def pretrained_tokenizer(cfg: Config) -> Tokenizer:
    """The tokenizer of `tokenizer.path` (else `init_from`): a HF tokenizer dir, latent ids after every
    row of the backbone."""
    K, mult = cfg.latent.num_latents, cfg.tokenizer.pad_multiple
    tok_path = cfg.tokenizer.path or cfg.init_from
    rows = model_config_from_hf(cfg.init_from).vocab_size if cfg.init_from else cfg.model.vocab_size
    tok = Tokenizer.from_pretrained_dir(tok_path, num_latents=K, pad_multiple=mult, model_vocab_size=rows)
    if tok.text_vocab_size % mult:
        # Added tokens (pad, boundaries) go past a checkpoint whose tokenizer fills every row
        # (Llama-3: 128,256): pad the text rows too, so the grown embedding divides the mesh.
        tok = Tokenizer.from_pretrained_dir(
            tok_path, num_latents=K, pad_multiple=mult, model_vocab_size=-(-tok.text_vocab_size // mult) * mult
        )
    return tok


def get_tokenizer(cfg: Config, workdir: str | Path, train_examples: list[Example] | None = None) -> Tokenizer:
    """Loads `<workdir>/tokenizer`, or builds it once: from `tokenizer.path` (a HF tokenizer dir,
    latent ids after every row of the backbone) or a BPE trained on the training corpus."""
    tdir = Path(workdir) / "tokenizer"
    if (tdir / "tokenizer.json").is_file():
        return Tokenizer.load(tdir)
    K, mult = cfg.latent.num_latents, cfg.tokenizer.pad_multiple
    if cfg.tokenizer.path or cfg.init_from:
        tok = pretrained_tokenizer(cfg)
    else:
        if train_examples is None:
            train_examples = load_examples(cfg, cfg.data.train_split)
        texts = [t for ex in train_examples for t in (ex.question, ex.cot, ex.answer)]
        base = train_bpe(texts, cfg.tokenizer.vocab_size, num_latents=K, pad_multiple=mult)
        # The backbone owns exactly the (padded) text rows; latent rows start after them, so a
        # text-only model and the latent LM share one id space.
        text_rows = -(-base.text_vocab_size // mult) * mult
        tok = Tokenizer(base.backend, num_latents=K, pad_multiple=mult, min_text_vocab_size=text_rows)
    if jax.process_index() == 0:  # every process built the same tokenizer (deterministic); one writes it
        tok.save(tdir)
    return tok


_SAID: set[tuple[str, str]] = set()  # (workdir, what) of the notes stage_examples gives once a process


def stage_examples(
    cfg: Config, workdir: str | Path, part: str, tok: Tokenizer, train: list[Example] | None = None
) -> list[Example]:
    """The training examples of `part` ("sft" for textsft / sft, "rl" for rl, "all" = both parts; align reads
    data.align_part) under the data protocol (dlr_jax/data/protocol.py): CoTs longer than data.max_cot_tokens
    left out (counted), then the deterministic SFT/RL split by data.rl_split (a count for the full release, on
    the subset read in its place: the same fraction, `data.sources.rl_split_for`). Recorded in
    <workdir>/data_protocol.json."""
    from dlr_jax.data import protocol

    if part not in (*protocol.PARTS, "all"):
        raise ValueError(f"part must be one of {(*protocol.PARTS, 'all')}, got {part!r}")
    d = cfg.data
    train = load_examples(cfg, d.train_split) if train is None else train
    kept, dropped = protocol.cot_length_filter(train, lambda t: len(tok.encode_plain(t)), d.max_cot_tokens)
    if dropped:
        print(f"[data] {dropped} of {len(train)} examples have a CoT over data.max_cot_tokens={d.max_cot_tokens} "
              "tokens: left out", flush=True)
    rl_split, scaled = rl_split_for(cfg, train)
    parts = protocol.split_sft_rl(kept, rl_split, d.split_seed)
    if scaled and (said := (str(workdir), "rl_split_scaled")) not in _SAID:  # once, not once a textsft mode
        _SAID.add(said)
        print(f"warning: data.rl_split={scaled['configured']:,} is a count of {d.dataset}:{d.train_split}'s "
              f"{scaled['of_full']:,} examples, but {scaled['read']} was read in its place: RL holds out the same "
              f"fraction ({scaled['fraction']:.2%}), {len(parts['rl']):,} of {len(kept):,} examples "
              "(recorded in data_protocol.json as rl_split_scaled)", file=sys.stderr, flush=True)
    info = {
        "dataset": d.dataset, "train_split": d.train_split, "examples": len(train),
        "max_cot_tokens": d.max_cot_tokens, "dropped_long_cot": dropped,
        "rl_split": d.rl_split, "split_seed": d.split_seed,
        **{f"{p}_examples": len(parts[p]) for p in protocol.PARTS},
        **{f"{p}_ids_sha256": protocol.ids_digest(parts[p]) for p in protocol.PARTS},
        # only when it is not the default, so workdirs recorded before the key existed still match
        **({"align_part": d.align_part} if d.align_part != "sft" else {}),
        **({"rl_split_scaled": scaled} if scaled else {}),  # the full data never has one
    }
    protocol.record(workdir, info, write=jax.process_index() == 0)  # a changed split stops every process
    return kept if part == "all" else parts[part]


def row_multiple(tcfg: Any, mesh: Mesh, rules: str, processes: int | None = None) -> int:
    """What a process's rows a step must be a multiple of when the data chooses them (`data.pack_batch=examples`):
    grad_accum micro-batches of equal size, and a global micro-batch that divides over the mesh's data-parallel
    devices (the axes `batch` maps to; one that does not is replicated on every device, not split). processes:
    default jax.process_count() (a planner passes its target's)."""
    import math

    from dlr_jax.core.sharding import logical_to_spec

    axes = logical_to_spec(("batch",), None, mesh, rules)[0]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    dp, nproc = math.prod(mesh.shape[a] for a in axes), processes or jax.process_count()
    return tcfg.grad_accum * math.lcm(nproc, dp) // nproc


def horizon_steps(tcfg: Any, n: int) -> int:
    """The global batches a stage reads, counted as padded (`resolve_schedule` without packing): what
    `data.pack_batch=exact` sizes its rows on (`data.exact_rows`)."""
    from dlr_jax.data.protocol import steps_for_epochs

    return steps_for_epochs(tcfg.num_epochs, n, tcfg.batch_size) if tcfg.num_epochs > 0 else tcfg.num_steps


def data_kwargs(cfg: Any, tcfg: Any, mesh: Mesh, n: int, stop: int | None = None) -> dict[str, Any]:
    """`make_stage_dataset`'s packing arguments from the config: data.pack, data.pack_batch, and what the data
    chooses rows by (`row_multiple`; under pack_batch=exact also grad_accum and the batches the run reads: its
    schedule, or `stop` (`--steps`) when that is further)."""
    return {"pack": cfg.data.pack, "pack_batch": cfg.data.pack_batch if cfg.data.pack else "rows",
            "row_multiple": row_multiple(tcfg, mesh, cfg.mesh.rules), "grad_accum": tcfg.grad_accum,
            "horizon_steps": max(horizon_steps(tcfg, n), stop or 0)}


def packed_batch(tcfg: Any, data: Any) -> tuple[Any, int | None]:
    """(`tcfg` with batch_size = the rows a step of `data` takes, the examples a step was sized to hold): under
    `data.pack_batch=examples` the data chose the rows (`data.packing.rows_for_examples`: about batch_size examples
    a step), under `exact` the rows every step's batch_size examples fit (`data.exact_rows`), and the Trainer's
    batch is in those rows; otherwise (tcfg, None)."""
    if not data.packed or data.pack_batch not in ("examples", "exact"):
        return tcfg, None
    return dataclasses.replace(tcfg, batch_size=data.global_batch), data.batch_examples


def resolve_schedule(tcfg: Any, n: int, workdir: str | Path, stage: str, *, per_step: int | None = None,
                     pack: Any = None, batch_examples: int | None = None, pack_batch: str = "examples") -> Any:
    """`tcfg` with num_steps set from num_epochs (when > 0): ceil(num_epochs * n / per_step), per_step
    defaulting to the batch size. `pack`: packed data's `data.packing.PackStats`; a step's rows then hold
    pack.examples_per_row examples each, so an epoch is that many times fewer steps (fewer rows a step, under
    `data.pack_batch=examples`: tcfg.batch_size is then the rows `packed_batch` set, and `batch_examples` the
    examples a step was sized to hold, recorded; under `exact` a step is batch_examples examples, as many steps as
    padded). Written to <workdir>/<stage>/schedule.json so a run says what it
    did."""
    from dlr_jax.data.protocol import steps_for_epochs

    if tcfg.num_epochs <= 0:
        return tcfg
    per_step = per_step or tcfg.batch_size
    if pack is not None and pack_batch == "exact":  # a step is the padded step's examples: so are the steps
        steps = steps_for_epochs(tcfg.num_epochs, n, batch_examples)
        what = f"{batch_examples} examples in {per_step} packed rows"
    elif pack is not None:
        steps = pack.steps(tcfg.num_epochs, per_step, packed=True, examples=n)
        what = f"{per_step} packed rows of {pack.examples_per_row:.2f} examples on average"
    else:
        steps = steps_for_epochs(tcfg.num_epochs, n, per_step)
        what = f"{per_step}"
    print(f"[{stage}] {tcfg.num_epochs:g} epochs of {n:,} examples at {what} per step = {steps:,} steps",
          flush=True)
    if jax.process_index() == 0:
        import json

        d = stage_dir(workdir, stage)
        d.mkdir(parents=True, exist_ok=True)
        info = {"num_epochs": tcfg.num_epochs, "examples": n, "per_step": per_step, "num_steps": steps}
        if pack is not None:
            info["packed"] = pack.to_dict()
        if batch_examples is not None:
            info |= {"pack_batch": pack_batch, "batch_examples": batch_examples}
        write_text_atomic(d / "schedule.json", json.dumps(info, indent=2) + "\n")
    return dataclasses.replace(tcfg, num_steps=steps)


def describe_rows(stage: str, data: Any) -> None:
    """Prints how full a stage's rows are (`data.stage_data.StageData.pack`): packed, also what padding would fill."""
    p = data.pack
    if p is None:
        return
    if data.packed and data.pack_batch == "exact":
        print(f"[{stage}] packed: the {data.batch_examples} examples of a padded step in {data.global_batch} rows of "
              f"{p.max_len}, {100 * p.packed_efficiency:.0f}% of tokens real (padded rows: "
              f"{100 * p.padded_efficiency:.0f}%)", flush=True)
    elif data.packed and data.pack_batch == "examples":
        print(f"[{stage}] packed: {data.global_batch} rows of {p.max_len} a step hold "
              f"{data.examples_per_step:.1f} examples on average (padded: {data.batch_examples} rows), "
              f"{100 * p.packed_efficiency:.0f}% of tokens real (padded rows: {100 * p.padded_efficiency:.0f}%)",
              flush=True)
    elif data.packed:
        print(f"[{stage}] packed rows of {p.max_len}: {p.examples_per_row:.2f} examples a row, "
              f"{100 * p.packed_efficiency:.0f}% of tokens real (padded rows: {100 * p.padded_efficiency:.0f}%)",
              flush=True)
    else:
        print(f"[{stage}] padded rows of {p.max_len}: {100 * p.padded_efficiency:.0f}% of tokens real", flush=True)


# ------------------------------------------------------------------------------------------------
# Models.


def backbone_architecture(cfg: Config) -> ModelConfig:
    """The backbone's architecture: the HF checkpoint's config.json (only that file is read) + the YAML's
    RUN_MODEL_KEYS when starting from `init_from`, else the YAML model section (vocabulary as written there)."""
    return model_config_from_hf(cfg.init_from, **cfg.model.run_keys()) if cfg.init_from else cfg.model


def backbone_config(cfg: Config, tok: Tokenizer) -> ModelConfig:
    """The text backbone's config, its vocabulary sized to the tokenizer's text rows (`backbone_architecture`;
    from a checkpoint, its rows grow when the tokenizer's added tokens need more)."""
    if cfg.init_from:
        hf = backbone_architecture(cfg)
        return dataclasses.replace(hf, vocab_size=max(hf.vocab_size, tok.text_vocab_size))
    return dataclasses.replace(
        cfg.model, vocab_size=tok.text_vocab_size, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id
    )


def check_vocab_divides_mesh(cfg: Config, mesh: Mesh) -> None:
    """Vocabulary rows shard over the tensor axis: a pad multiple it does not divide would leave
    the largest tables replicated (or fail to place)."""
    tensor = mesh.shape.get("tensor", 1)
    if cfg.tokenizer.pad_multiple % tensor:
        raise ValueError(
            f"tokenizer.pad_multiple={cfg.tokenizer.pad_multiple} must be a multiple of the mesh's tensor axis "
            f"({tensor}): vocabulary rows are sharded over it"
        )


def new_backbone(cfg: Config, tok: Tokenizer, mesh: Mesh):
    """The one backbone builder of every stage: random (from the YAML model section) or imported from
    `init_from`, born sharded on `mesh`, with its embedding (and lm_head) sized to the tokenizer's text
    rows. A pretrained tokenizer may already fill every embedding row (Llama-3: 128,256), so the added
    pad / boundary tokens need new rows; without them `jnp.take` returns NaN for their ids."""
    from dlr_jax.models.transformer import Transformer

    check_vocab_divides_mesh(cfg, mesh)
    if cfg.init_from:
        from dlr_jax.convert import load_hf
        from dlr_jax.models.latent_lm import grow_vocab

        keys = cfg.model.run_keys()  # load_hf's dtype= is the parameters' (ModelConfig.param_dtype)
        _, model = load_hf(cfg.init_from, mesh=mesh, rules=cfg.mesh.rules, dtype=keys.pop("param_dtype"),
                           compute_dtype=keys.pop("dtype"), **keys)
        if model.cfg.vocab_size < tok.text_vocab_size:
            grow_vocab(model, tok.text_vocab_size, cfg.mesh.rules)
        return model
    mcfg = backbone_config(cfg, tok)
    return create_sharded(lambda: Transformer(mcfg, rngs=nnx.Rngs(params=cfg.run.seed)), mesh, cfg.mesh.rules)


# ------------------------------------------------------------------------------------------------
# The loss every LM stage uses.


def lm_loss(model: nnx.Module, batch: dict[str, jax.Array], rng: jax.Array, vocab_mask: Any = None,
            chunk: int | None = None, reduction: str = "mean"):
    """Next-token cross-entropy on `loss_mask` targets: returns (Σ NLL, weight, metric sums).

    batch: tokens/loss_mask/segment_ids/positions, all [b, t]; loss_mask[t] = 1 marks token t as a
    target predicted from tokens < t within the same segment. chunk: positions per logits chunk
    (`models.vocab_chunks.token_stats`; None = from its memory budget). reduction
    (`TrainConfig.loss_reduction`): the weight the trainer divides by is the number of targets (mean: CE per
    token) or of examples with a target (sum: each example's CE summed over its tokens, averaged over the
    examples; an example is a segment of a packed row). Metrics: ce and token_accuracy per token, whichever.
    """
    from dlr_jax.models.vocab_chunks import next_token_stats

    del rng
    check_reduction(reduction)
    tokens, seg = batch["tokens"], batch["segment_ids"]
    # Over sequence chunks (models/vocab_chunks.py): no [b, t, vocab] fp32 logits at scale.
    stats = next_token_stats(model, tokens, {"positions": batch["positions"], "segment_ids": seg},
                             vocab_mask=vocab_mask, fill=-1e9, chunk=chunk)
    mask = (batch["loss_mask"][:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    ntok = jnp.sum(mask.astype(jnp.float32))
    weight = ntok if reduction == "mean" else count_examples(mask, seg[:, 1:])
    mask = mask.astype(jnp.float32)
    nll, correct = -stats.logp, stats.correct
    total = jnp.sum(nll * mask)
    return total, weight, {"ce": total, "token_accuracy": jnp.sum(correct * mask), "tokens": ntok}


def count_params(model: nnx.Module) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
