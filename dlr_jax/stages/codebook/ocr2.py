"""Stage codebook on a pretrained DeepSeek-OCR-2 (`codebook.init_from = <deepseek_ocr2 dir>`).

The paper fine-tunes DeepSeek-OCR-2 with a VQ inserted after the causal flow (d_c = 896); this
module supplies what differs from the from-scratch stage (stages/codebook.py), which calls it:
  - the model: encoder, projector and MoE decoder imported from the checkpoint
    (`convert.ocr2.load_ocr2`), a fresh VQ of K = latent.num_latents codes at `codebook.quantize_at`
    (flow: d_c; projector: the decoder width, as the authors' released code);
  - text: the checkpoint's tokenizer (tokenizer.json) instead of characters; each batch's `targets`
    are replaced by the CoT's token ids + <eos>, padded with PAD to codebook.max_text_len tokens
    (`TokenTargets`, a wrapper over the render pipeline that keeps its resumable state);
  - the loss: CE(H_st) + alpha * CE(H) + lambda_vq * (vq + beta * commit) as the from-scratch stage,
    over tokens, plus `codebook.router_aux_coef` x the decoder's MoE load-balancing loss.
The k-means warm start, dead-code refresh, checkpoints and export are shared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config, ConfigError
from dlr_jax.core.sharding import create_sharded, host_value
from dlr_jax.models.ocr2 import Ocr2Config, ocr2_config_from_hf
from dlr_jax.models.ocr2_codebook import PAD, Ocr2CodebookConfig, Ocr2CodebookModel
from dlr_jax.models.vq import VectorQuantizer, code_usage, vq_objective
from dlr_jax.text.ocr_text import normalize_text
from dlr_jax.training.reduction import vq_weights


def load_tokenizer(init_from: str | Path):
    import tokenizers

    f = Path(init_from) / "tokenizer.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: the OCR2 checkpoint's tokenizer is needed (codebook.init_from)")
    return tokenizers.Tokenizer.from_file(str(f))


def tokenize(tok: Any, text: str) -> list[int]:
    """The CoT as the renderer lays it out, in tokens (no special tokens added)."""
    return tok.encode(normalize_text(text), add_special_tokens=False).ids


def check_start(cfg: Config, command: str) -> None:
    """A config that fine-tunes DeepSeek-OCR-2 (`codebook.pretrained`) without the checkpoint (`codebook.init_from`)
    is refused: its settings are not the from-scratch encoder's recipe. So is one rendering steps
    (`codebook.render_unit=step`) on the checkpoint."""
    if cfg.codebook.pretrained and not cfg.codebook.init_from:
        raise ConfigError(
            f"codebook.pretrained=true: this config fine-tunes a DeepSeek-OCR-2 checkpoint, so {command} needs it: "
            "--set codebook.init_from=DIR (an HF deepseek_ocr2 directory: config.json, safetensors, tokenizer.json). "
            "To train the from-scratch encoder instead, use a config without codebook.pretrained (configs/tiny.yaml, "
            "configs/paper/gsm8k.yaml)"
        )
    if cfg.codebook.init_from and cfg.codebook.render_unit != "chain":
        raise ConfigError(
            f"codebook.render_unit={cfg.codebook.render_unit} is not supported with codebook.init_from (a "
            "DeepSeek-OCR-2 checkpoint): that path is built and tested on whole CoTs; train the from-scratch encoder "
            "(no init_from) or set codebook.render_unit=chain"
        )


def codebook_config(cfg: Config, ocfg: Ocr2Config, tok: Any) -> Ocr2CodebookConfig:
    """The codebook network's config on the checkpoint's `ocfg` and tokenizer; refuses what a pretrained
    start cannot take (a latent width other than the VQ point's, the from-scratch warm-ups)."""
    cb = cfg.codebook
    prompt = tuple(tok.encode(cb.ocr2_prompt, add_special_tokens=False).ids) if cb.ocr2_prompt else ()
    mcfg = Ocr2CodebookConfig(ocfg, cfg.latent.num_latents, cb.sigma, cb.max_text_len, cb.quantize_at, prompt)
    if cfg.latent.latent_dim != mcfg.code_dim:
        raise ConfigError(
            f"latent.latent_dim={cfg.latent.latent_dim} must equal the VQ width of {cb.init_from} at "
            f"quantize_at={cb.quantize_at!r}: {mcfg.code_dim}"
        )
    if cb.warmup_steps or cb.warmup_whole_steps or cb.char_dropout:
        raise ConfigError("codebook.init_from: the continuous warm-ups and char dropout are for from-scratch "
                          "character decoders; set warmup_steps / warmup_whole_steps / char_dropout to 0")
    return mcfg


def _ocr2_dtypes(cfg: Config) -> dict[str, str]:
    """How the stage computes the checkpoint's network (the same for the run and its plan)."""
    cb = cfg.codebook
    return {"dtype": cb.param_dtype, "compute_dtype": cb.dtype, "remat": cb.remat}


def abstract_model(cfg: Config) -> Ocr2CodebookModel:
    """The stage's network as shapes only (nnx.eval_shape), from codebook.init_from's config.json and
    tokenizer.json; no weight is read, so a planner needs only those two small files of the checkpoint."""
    cb = cfg.codebook
    f = Path(cb.init_from) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: the OCR2 checkpoint's config.json is needed (codebook.init_from)")
    ocfg = ocr2_config_from_hf(json.loads(f.read_text()), **_ocr2_dtypes(cfg))
    mcfg = codebook_config(cfg, ocfg, load_tokenizer(cb.init_from))
    return nnx.eval_shape(lambda: Ocr2CodebookModel(mcfg, rngs=nnx.Rngs(0)))


def build_model(cfg: Config, mesh: Mesh) -> tuple[Ocr2CodebookModel, Any]:
    """(model, tokenizer): the pretrained OCR2 from codebook.init_from with a fresh VQ."""
    from dlr_jax.convert.ocr2 import load_ocr2

    cb = cfg.codebook
    ocfg, ocr2 = load_ocr2(cb.init_from, mesh=mesh, rules=cfg.mesh.rules, **_ocr2_dtypes(cfg))
    tok = load_tokenizer(cb.init_from)
    mcfg = codebook_config(cfg, ocfg, tok)
    model = nnx.eval_shape(lambda: Ocr2CodebookModel(mcfg, rngs=nnx.Rngs(0)))
    model.ocr2 = ocr2
    model.vq = create_sharded(lambda: VectorQuantizer(mcfg.num_codes, mcfg.code_dim, sigma=mcfg.sigma,
                                                      rngs=nnx.Rngs(params=cfg.run.seed)), mesh, cfg.mesh.rules)
    return model, tok


def token_targets(tok: Any, texts: list[str], max_len: int, eos: int) -> np.ndarray:
    """[len(texts), max_len] int32: tokens (cut to max_len - 1), <eos>, PAD."""
    out = np.full((len(texts), max_len), PAD, np.int32)
    for r, t in enumerate(texts):
        ids = tokenize(tok, t)[: max_len - 1] + [eos]
        out[r, : len(ids)] = ids
    return out


class OcrTokenEncoder:
    """`(text, length) -> (ids [length] int32, cut)`: a CoT as the OCR-2 decoder's targets (`token_targets`'s
    row: tokens cut to length - 1, <eos>, PAD) and whether it was cut. Stage sft's dual branch passes it to the
    data pipeline (`ocr_encode`); it pickles as the tokenizer file's path, so grain workers load their own."""

    def __init__(self, tokenizer_file: str | Path, eos: int):
        self.path, self.eos = str(tokenizer_file), int(eos)
        self._tok: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "eos": self.eos, "_tok": None}

    def __call__(self, text: str, length: int) -> tuple[np.ndarray, bool]:
        if self._tok is None:
            import tokenizers

            self._tok = tokenizers.Tokenizer.from_file(self.path)
        ids = tokenize(self._tok, text)
        row = np.full((length,), PAD, np.int32)
        kept = ids[: length - 1] + [self.eos]
        row[: len(kept)] = kept
        return row, len(ids) > length - 1


class TokenTargets:
    """Wraps a render-pipeline iterator: `targets` become token ids of the batch's CoTs (by `index`)."""

    def __init__(self, it: Iterator, texts: list[str], tok: Any, max_len: int, eos: int):
        self.it, self.texts, self.tok, self.max_len, self.eos = it, texts, tok, max_len, eos

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self.it))
        batch["targets"] = token_targets(self.tok, [self.texts[i] for i in batch["index"]], self.max_len, self.eos)
        return batch

    def get_state(self) -> Any:
        return self.it.get_state()

    def set_state(self, state: Any) -> None:
        self.it.set_state(state)


def _nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0]


def ocr2_codebook_loss(model: Ocr2CodebookModel, batch: dict, rng: jax.Array, *, lambda_vq: float, beta: float,
                       router_aux_coef: float = 0.0, reduction: str = "mean"):
    """CE(H_st) + alpha * CE(H) + lambda_vq * (vq + beta * commit) [+ router balance] over the checkpoint's
    tokens: per token (mean), or per image (sum: `stage.codebook_loss`'s reduction, the paper's; the router
    balance, not the paper's, keeps its weight router_aux_coef in the optimised loss under both)."""
    targets = batch["targets"]
    b = targets.shape[0]
    h = model.encode(batch["images"])
    ids, h_st, vq, commit = model.vq(h, rng=rng)
    tmask = (targets != PAD).astype(jnp.float32)
    ntok = jnp.sum(tmask)
    metrics = {}
    if "alpha" in batch:  # one decoder call over [H_st ; H]
        logits, aux = model.decoder_logits(jnp.concatenate([h_st, h]), jnp.tile(targets, (2, 1)))
        nll = _nll(logits, jnp.tile(targets, (2, 1))) * jnp.tile(tmask, (2, 1))
        nll_q, nll_c = nll[:b], nll[b:]
        ce_c = jnp.sum(nll_c * batch["alpha"][:, None])
        metrics["ce_c"] = jnp.sum(nll_c)
        logits = logits[:b]
    else:
        logits, aux = model.decoder_logits(h_st, targets)
        nll_q = _nll(logits, targets) * tmask
        ce_c = 0.0
    _, used, ppl = code_usage(ids, model.cfg.num_codes)
    metrics |= {
        "ce_q": jnp.sum(nll_q), "vq": vq * ntok, "commit": commit * ntok, "router_balance": aux * ntok,
        "perplexity": ppl * ntok, "used_codes": used.astype(jnp.float32) * ntok,
        "token_accuracy": jnp.sum((jnp.argmax(logits, -1) == targets) * tmask),
        "images_per_token": jnp.float32(b), "tokens": ntok,
    }
    weight, vq_scale = vq_weights(h, ntok, reduction)
    loss = jnp.sum(nll_q) + ce_c + vq_scale * vq_objective(vq, commit, lambda_vq, beta) + weight * router_aux_coef * aux
    return loss, weight, metrics


def _tf_sums(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, targets: jax.Array) -> jax.Array:
    """[nll sum, correct tokens, tokens] of teacher-forced decoding from code ids."""
    model = nnx.merge(graphdef, state)
    logits, _ = model.decoder_logits(model.codes_to_features(ids), targets)
    mask = (targets != PAD).astype(jnp.float32)
    correct = jnp.sum((jnp.argmax(logits, -1) == targets) * mask)
    return jnp.stack([jnp.sum(_nll(logits, targets) * mask), correct, jnp.sum(mask)])


_tf_sums_jit = jax.jit(_tf_sums, static_argnums=0)


def held_out_report(model: Ocr2CodebookModel, texts: list[str], cb: Any, tok: Any, *, seed: int = 0
                    ) -> dict[str, Any]:
    """Held-out teacher-forced token CE / accuracy from each example's own code ids vs ids shuffled
    across examples of the same N (a decoder that ignores the codes scores the same on both), and
    code usage. (Greedy OCR of these ids: `models.Ocr2LatentDecoder`, which RL's process reward and `interpret`
    use; the report stays teacher-forced.)"""
    from dlr_jax.stages.codebook.models import encode_ids

    ids, _, rate = encode_ids(model, texts, cb)
    targets = token_targets(tok, texts, cb.max_text_len, model.cfg.eos_id)
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(model)
    sums = {"true": np.zeros(3), "shuffled": np.zeros(3)}
    by_n: dict[int, list[int]] = {}
    for i, z in enumerate(ids):
        by_n.setdefault(len(z), []).append(i)
    bs = cb.eval_batch_size
    for group in by_n.values():
        perm = np.roll(rng.permutation(group), 1) if len(group) > 1 else np.asarray(group)
        order = {"true": list(group), "shuffled": [int(j) for j in perm]}
        for start in range(0, len(group), bs):
            rows = group[start:start + bs]
            tgt = np.full((bs, targets.shape[1]), PAD, np.int32)
            tgt[: len(rows)] = targets[rows]
            for kind, src in order.items():
                z = np.zeros((bs, len(ids[group[0]])), np.int32)
                z[: len(rows)] = [ids[j] for j in src[start:start + bs]]
                sums[kind] += host_value(_tf_sums_jit(graphdef, state, jnp.asarray(z), jnp.asarray(tgt)))
    flat = np.concatenate([np.asarray(z) for z in ids])
    _, used, ppl = code_usage(jnp.asarray(flat), model.cfg.num_codes)
    out: dict[str, Any] = {"examples": len(texts), "perplexity": float(ppl), "used_codes": int(used),
                           "mean_n": float(np.mean([len(z) for z in ids])), "encoder_vq_images_per_s": rate}
    for kind, (nll, correct, n) in sums.items():
        out[f"ce_{kind}"] = float(nll / max(n, 1))
        out[f"token_accuracy_{kind}"] = float(correct / max(n, 1))
    return out
