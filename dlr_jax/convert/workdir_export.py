"""Trained stages out to Hugging Face, and the safety checks around `--to-hf` / `--from-hf`.

`export_stage(workdir, stage, out)` (CLI: `python -m dlr_jax.convert --to-hf --from-workdir W --stage
sft|rl|align|textsft_cot|textsft_direct --out DIR`) writes a standard `transformers` checkpoint:

- a latent stage (`LatentLM`, models/latent_lm.py) becomes a plain decoder whose vocabulary is our whole id
  layout: embedding rows = [backbone rows ; E_lat = P_in(C) ; ...], LM-head rows = [backbone head ;
  W_lat = P_out(C) ; ...], materialised in fp32. h . (c W + b) is exactly the latent logit our model
  computes, so the logits over the predictable rows agree. The rows our softmax masks (the gap between
  the backbone's rows and the latent ids, the padding rows, text rows the tokenizer never produces)
  cannot be masked by a bias-free linear head: `generation_config.json` lists them in
  `suppress_tokens`, which `generate` sets to -inf. Input rows of ids our model never reads keep the
  clipping it applies (the backbone's last row), so even those embed the same.
- the tokenizer (`tokenizer.json` + `tokenizer_config.json`) is ours plus one added token per row:
  `<z_k>` at latent id k (what `dlr_jax.text.tokens.Tokenizer` prints and parses), placeholders in the gap
  and padding rows, the boundary tokens as they are; `generation_config.json` stops at `</answer>` or
  eos, as our sampler does.
- a text stage (CoT-/Direct-SFT) is its backbone as is, with the tokenizer.

`prepare_out_dir` refuses a non-empty output directory unless `force`, and then removes what an
earlier export left (shards and index that `from_pretrained` would otherwise mix with the new ones); it runs once
the source has been read. `check_out_apart` refuses an output inside, equal to or above the source, force or not.
`tensors.check_finite` makes a NaN/Inf tensor a one-line error naming the file and tensor.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlr_jax.convert.decoder import abstract_model, save_hf
from dlr_jax.convert.tensors import check_finite, path_str
from dlr_jax.core.sharding import host_value
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.run.checkpoint import read_meta
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.run.workdir import final_dir
from dlr_jax.text.tokens import BOUNDARY_TOKENS

# Files an export writes; with --force these (and any other shard) go before writing.
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "dlr_export.json", "model_config.json")
UNUSED = "<|dlr_unused_{}|>"


def check_out_apart(out: str | Path, *sources: str | Path | None) -> None:
    """Refuses an output directory that is a source, inside one or above one (a workdir, a stage, an HF or Orbax
    directory), --force or not: clearing it would remove what the conversion reads (`--out W/sft/final --force`
    once deleted the trained stage before exporting it)."""
    dest = Path(out).resolve()
    for src in sources:
        if src is None:
            continue
        s = Path(src).resolve()
        if dest == s or s in dest.parents or dest in s.parents:
            where = "is" if dest == s else "is inside" if s in dest.parents else "holds"
            raise ConversionError(f"--out {out} {where} the source {src}: choose an output directory outside it "
                                  "(nothing was written or removed)")


def check_out_dir(out: str | Path, *, force: bool) -> list[Path]:
    """What `prepare_out_dir` would find in `out` (refusing a file, or a non-empty directory without `force`);
    removes nothing, so a conversion checks before it reads its source and clears only after."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConversionError(f"{out}: exists and is not a directory")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if entries and not force:
        raise ConversionError(f"{out}: not empty ({', '.join(p.name for p in entries[:5])}"
                              f"{', ...' if len(entries) > 5 else ''}); pass --force to replace its checkpoint")
    return entries


def prepare_out_dir(out: str | Path, *, force: bool) -> Path:
    """`check_out_dir`, then removes what an earlier export left (call it after the source has been read)."""
    out = Path(out)
    for p in check_out_dir(out, force=force):
        if p.suffix == ".safetensors" or p.name in EXPORT_FILES:
            p.unlink()
        elif p.name == "params" and p.is_dir():  # an Orbax checkpoint written by --from-hf
            shutil.rmtree(p)
    out.mkdir(parents=True, exist_ok=True)
    return out


# ------------------------------------------------------------------------------------------------
# Tokenizer.


def hf_tokenizer_files(tok: Any, out: Path, *, with_latents: bool, max_length: int) -> None:
    """tokenizer.json with one token per model row (see module doc) + tokenizer_config.json."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    size = backend.get_vocab_size(with_added_tokens=True)
    known = max(backend.get_vocab(with_added_tokens=True).values()) + 1
    if size != known:
        raise ConversionError(f"tokenizer has holes in its ids ({size} tokens, largest id {known - 1}); "
                              "cannot place the latent tokens at their ids")
    end = tok.latent_offset + tok.num_latents if with_latents else tok.text_vocab_size
    rows = [(i, UNUSED.format(i)) for i in range(size, tok.latent_offset)]
    if with_latents:
        rows += [(tok.latent_id(k), f"<z_{k}>") for k in range(tok.num_latents)]
        end = tok.total_vocab_size
        rows += [(i, UNUSED.format(i)) for i in range(tok.latent_offset + tok.num_latents, end)]
    for i, text in rows:  # one at a time: each must land on its own id
        latent = text.startswith("<z_")
        backend.add_tokens([tokenizers.AddedToken(text, special=not latent, normalized=False)])
        if backend.token_to_id(text) != i:
            raise ConversionError(f"token {text!r} landed on id {backend.token_to_id(text)}, expected {i}")
    backend.save(str(out / "tokenizer.json"))
    specials = {"pad_token": tok.pad_token, "eos_token": tok.eos_token}
    if tok.bos_token is not None:
        specials["bos_token"] = tok.bos_token
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
         "clean_up_tokenization_spaces": False, "additional_special_tokens": list(BOUNDARY_TOKENS), **specials},
        indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


# ------------------------------------------------------------------------------------------------
# Models.


def _host(x: Any) -> np.ndarray:
    return np.asarray(host_value(x), np.float32)


def latent_lm_as_transformer(lm: Any):
    """(ModelConfig, Transformer) of a LatentLM with its latent rows materialised (module doc)."""
    c, bb = lm.latent_cfg, lm.backbone
    vb, d, v = bb.cfg.vocab_size, bb.cfg.hidden_size, c.total_vocab_size
    if vb > c.latent_offset:
        raise ConversionError(f"backbone has {vb} rows but latent ids start at {c.latent_offset}")
    emb_b = _host(bb.embed[...])
    head_b = emb_b.T if bb.cfg.tie_embeddings else _host(bb.lm_head[...])
    embed = np.repeat(emb_b[-1:], v, axis=0)  # ids our model never reads clip to the last row, as in embed_tokens
    embed[:vb] = emb_b
    lat = slice(c.latent_offset, c.latent_offset + c.num_latents)
    embed[lat] = _host(lm.latent_rows("in"))
    head = np.zeros((d, v), np.float32)
    head[:, :vb] = head_b
    head[:, lat] = _host(lm.latent_rows("out")).T
    cfg = dataclasses.replace(bb.cfg, vocab_size=v, tie_embeddings=False, param_dtype="float32")
    graphdef, state = abstract_model(cfg)
    src = {path_str(p): var for p, var in nnx.to_flat_state(nnx.state(bb))}
    for path, var in nnx.to_flat_state(state):
        key = path_str(path)
        value = {"embed": embed, "lm_head": head}.get(key)
        var.set_value(jnp.asarray(value) if value is not None else
                      jnp.asarray(_host(src[key].get_value()), var.get_value().dtype))
    return cfg, nnx.merge(graphdef, state)


def export_stage(workdir: str | Path, stage: str, out: str | Path, *, force: bool = False,
                 dtype: str | None = None) -> Path:
    """Writes `<workdir>/<stage>/final` as a transformers checkpoint + tokenizer in `out`."""
    from dlr_jax.core.sharding import make_mesh

    d = final_dir(workdir, stage)
    if not (d / "meta.json").is_file():
        raise ConversionError(f"{d}: stage {stage!r} has not finished in {workdir} (no final/meta.json)")
    kind = read_meta(d)["kind"]
    if kind not in ("latent_lm", "backbone"):
        raise ConversionError(f"{d}: a {kind!r} model has no Hugging Face causal-LM form")
    check_out_apart(out, workdir)
    check_out_dir(out, force=force)
    model, tok, _ = load_stage_model(workdir, stage, mesh=make_mesh(1, 1, 1, devices=jax.local_devices()[:1]))
    out = prepare_out_dir(out, force=force)  # --force clears only once the source is read
    if kind == "latent_lm":
        suppress = [int(i) for i in np.flatnonzero(~model.vocab_mask())]
        cfg, model = latent_lm_as_transformer(model)
    else:
        cfg = model.cfg
        suppress = [int(i) for i in np.flatnonzero(~tok.vocab_padding_mask()[: cfg.vocab_size])]
    cfg = dataclasses.replace(cfg, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        check_finite(host_value(var.get_value()), "/".join(map(str, path)), d)
    save_hf(model, cfg, out, dtype=dtype or "float32")
    hf_tokenizer_files(tok, out, with_latents=kind == "latent_lm", max_length=cfg.max_position_embeddings)
    gen = {"do_sample": False, "eos_token_id": [tok.answer_end_id, tok.eos_id], "pad_token_id": tok.pad_id,
           "suppress_tokens": suppress}
    if tok.bos_id is not None:
        gen["bos_token_id"] = tok.bos_id
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    (out / "dlr_export.json").write_text(json.dumps(
        {"workdir": str(Path(workdir).resolve()), "stage": stage, "kind": kind, "latent_offset": tok.latent_offset,
         "num_latents": tok.num_latents if kind == "latent_lm" else 0, "latent_token": "<z_{k}>",
         "boundary_ids": {"latent_start": tok.latent_start_id, "latent_end": tok.latent_end_id,
                          "answer_start": tok.answer_start_id, "answer_end": tok.answer_end_id}}, indent=2))
    return out
