"""The codebook stage's networks as the later stages use them: loading them from a workdir, texts
to latent ids (`encode_ids`) and latent ids back to text (`LatentDecoder`).

Shared by stages codebook (held-out report), export (every example's ids), sft (the dual branch
starts from the codebook's decoder and writes its own) and rl (the process reward's decoder), so
none of those stage files imports another.

`LatentDecoder(model).decode(codes)` turns code sequences back into text with the OCR decoder:
codebook rows -> prefix projection -> jitted greedy decoding (`codebook_model.greedy_decode`).
Sequences of any length share batches (prefixes left-padded and masked); batch rows, prefix
lengths and length caps are rounded up to a few buckets, so RL's varying latent counts compile a
handful of programs, not one per length. It implements `dlr_jax.rewards.process.LatentDecoder` (the
RL process reward) and serves interpretability (latent trajectory -> text).

On a DeepSeek-OCR-2 codebook, `Ocr2LatentDecoder` does the same with the fine-tuned OCR-2 MoE decoder
(KV-cached greedy decoding through the LM's `Sampler`, models/ocr2_reader.py); `load_decoder` picks the one
the workdir's codebook needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config
from dlr_jax.core.sharding import host_value, host_values
from dlr_jax.data import render_pipeline as rp
from dlr_jax.models.codebook_model import CodebookModel, CodebookModelConfig, greedy_decode, jit_encode
from dlr_jax.models.dual_branch import OCRBranch
from dlr_jax.run.checkpoint import read_meta, restore_params
from dlr_jax.run.workdir import final_dir, stage_dir
from dlr_jax.text.ocr_text import VOCAB

CODEBOOK, SFT = "codebook", "sft"  # the stages whose outputs these loaders read


# ----------------------------------------------------------------------------------------------
# Texts to latent ids and back.


class LatentDecoder:
    """`decode(codes: list[list[int]]) -> list[str]`: greedy OCR reconstruction of code sequences.

    model: a `CodebookModel` (its codebook and decoder are used). batch_size: rows per decode call.
    max_len: default length cap in characters incl. <eos> (default: the model's max_text_len).
    An empty code list decodes to "".
    """

    def __init__(self, model: CodebookModel, *, batch_size: int = 64, max_len: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.batch_size = model, batch_size
        self.max_len = int(max_len or model.cfg.max_text_len)
        self._split = nnx.split(model)
        self._codebook = host_value(model.vq.codebook[...])

    @property
    def num_codes(self) -> int:
        return self._codebook.shape[0]

    def decode(self, codes: Sequence[Sequence[int]], limits: Sequence[int] | None = None) -> list[str]:
        """One string per code sequence; `limits[i]` caps sequence i's length (chars incl. <eos>)."""
        feats = []
        for i, z in enumerate(codes):
            z = np.asarray(z, np.int64).reshape(-1)
            if z.size and (z.min() < 0 or z.max() >= self.num_codes):
                bad = z[(z < 0) | (z >= self.num_codes)][:5].tolist()
                raise ValueError(f"decode: sequence {i} has codes {bad} outside [0, {self.num_codes})")
            feats.append(self._codebook[z])
        return self.decode_features(feats, limits)

    def decode_features(self, feats: Sequence[np.ndarray], limits: Sequence[int] | None = None) -> list[str]:
        """Like `decode`, from prefix features [n_i, d_c] (codebook rows or continuous H)."""
        limits = [self.max_len] * len(feats) if limits is None else [int(x) for x in limits]
        if len(limits) != len(feats):
            raise ValueError(f"decode: {len(limits)} limits for {len(feats)} sequences")
        out = [""] * len(feats)
        # Rows of any prefix length share a call: sorted by length, left-padded to a power of two
        # (>= 4); rows padded to a power of two (<= batch_size); caps rounded up to 32 chars.
        order = sorted((i for i, f in enumerate(feats) if len(f)), key=lambda i: len(feats[i]))
        d = self._codebook.shape[1]
        for s in range(0, len(order), self.batch_size):
            rows = order[s : s + self.batch_size]
            b = min(self.batch_size, _pow2(len(rows)))
            p = max(4, _pow2(max(len(feats[i]) for i in rows)))
            x = np.zeros((b, p, d), np.float32)
            n = np.ones(b, np.int32)
            lim = np.zeros(b, np.int32)
            for r, i in enumerate(rows):
                f = np.asarray(feats[i], np.float32).reshape(-1, d)
                x[r, p - len(f):], n[r], lim[r] = f, len(f), limits[i]
            cap = int(min(2 * self.max_len, -(-max(int(lim.max()), 1) // 32) * 32))
            tokens = greedy_decode(self._split, jnp.asarray(x), lim, cap, n_valid=n)
            for r, i in enumerate(rows):
                out[i] = VOCAB.decode(tokens[r])
        return out


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class Ocr2LatentDecoder:
    """`decode(codes) -> list[str]` with the OCR-2 decoder (`ocr2_branch.Ocr2CodeDecoder`): KV-cached greedy
    decoding of `<bos> [code rows] [view separator] [OCR prompt]` (`ocr2_reader.code_prompt`) by the LM's
    `Sampler` (jitted prefill + `while_loop` decode, batch sharded over `mesh`), up to <eos> or `max_len` tokens,
    then the OCR-2 tokenizer's text. Code sequences of any length share a batch (the Sampler left-pads);
    batches are padded to a power of two rows (<= batch_size) so a few shapes compile. An empty list gives "".

    decoder: an `Ocr2CodeDecoder`; tok: the checkpoint's `tokenizers.Tokenizer`; max_len: tokens generated at
    most (default the codebook's max_text_len, which includes <eos>)."""

    def __init__(self, decoder: Any, tok: Any, *, batch_size: int = 64, max_len: int | None = None,
                 mesh: Mesh | None = None, rules: Any = "fsdp", prompt_bucket: int = 32):
        from dlr_jax.generate.sampler import Sampler

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.cfg, self.tok, self.batch_size = decoder.cfg, tok, batch_size
        self.max_len = int(max_len or decoder.cfg.max_text_len)
        self.num_codes = decoder.num_codes
        self.reader = decoder.reader()
        self.sampler = Sampler(self.reader, mesh=mesh, rules=rules, prompt_bucket=prompt_bucket)

    def prompt(self, codes: Sequence[int]) -> list[int]:
        from dlr_jax.models.ocr2_reader import code_prompt

        return code_prompt(list(codes), text_vocab=self.reader.text_vocab, num_codes=self.num_codes,
                           bos_id=self.cfg.bos_id, prompt_ids=self.cfg.prompt_ids)

    def decode(self, codes: Sequence[Sequence[int]], limits: Sequence[int] | None = None) -> list[str]:
        """One string per code sequence; `limits[i]` caps sequence i's tokens (incl. <eos>)."""
        rows = []
        for i, z in enumerate(codes):
            z = np.asarray(z, np.int64).reshape(-1)
            if z.size and (z.min() < 0 or z.max() >= self.num_codes):
                bad = z[(z < 0) | (z >= self.num_codes)][:5].tolist()
                raise ValueError(f"decode: sequence {i} has codes {bad} outside [0, {self.num_codes})")
            rows.append(z.tolist())
        limits = [self.max_len] * len(rows) if limits is None else [min(int(x), self.max_len) for x in limits]
        out = [""] * len(rows)
        todo = sorted((i for i, z in enumerate(rows) if z), key=lambda i: len(rows[i]))
        eos = self.cfg.eos_id
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            prompts = [self.prompt(rows[i]) for i in chunk]
            prompts += [prompts[-1]] * (min(self.batch_size, _pow2(len(chunk))) - len(chunk))
            res = self.sampler.generate(prompts, max_new_tokens=self.max_len, stop_ids=[eos], pad_id=eos)
            for r, i in enumerate(chunk):
                ids = res.tokens[r, : min(int(res.lengths[r]), limits[i])].tolist()
                out[i] = self.tok.decode([t for t in ids if t != eos], skip_special_tokens=True)
        return out


def encode_ids(model: CodebookModel, texts: Sequence[str], cb: Any, *, num_workers: int = 0
               ) -> tuple[list[list[int]], list[np.ndarray], float | None]:
    """Deterministic (mean font) rendering -> nearest code ids per text, features per text, and the
    encoder + VQ rate in images/s (render time and each side's first, compiling batch excluded; None
    when every side had one batch). Short batches are padded to full size so each side compiles once."""
    rcfg = rp.render_config(cb)
    batches, fonts = rp.fixed_batches(texts, cb.eval_batch_size, rcfg)
    ids: list[list[int]] = [[] for _ in texts]
    feats: list[np.ndarray] = [np.zeros(0)] * len(texts)
    graphdef, state = nnx.split(model)
    busy, seen, sides = 0.0, 0, set()
    for batch in rp.make_fixed_dataset(texts, batches, fonts, rcfg, num_workers=num_workers):
        imgs, idx = batch["images"], batch["index"]
        n = len(idx)
        if n < cb.eval_batch_size:
            imgs = np.concatenate([imgs, np.repeat(imgs[:1], cb.eval_batch_size - n, 0)])
        t0 = time.perf_counter()
        h, z = host_values(*jit_encode(graphdef, state, jnp.asarray(imgs)))  # multi-process: gathered
        if imgs.shape[1] in sides:  # a side's first batch compiles: not part of the rate
            busy, seen = busy + time.perf_counter() - t0, seen + n
        sides.add(imgs.shape[1])
        h, z = h[:n], z[:n]
        for r, i in enumerate(idx):
            ids[i], feats[i] = z[r].tolist(), h[r]
    return ids, feats, (seen / busy if busy > 0 else None)


# ----------------------------------------------------------------------------------------------
# Loading from a workdir.


def decoder_dir(workdir: str | Path) -> Path:
    """Where sft writes its dual-branch OCR decoder."""
    return stage_dir(workdir, SFT) / "decoder"


def load_codebook_model(workdir: str | Path, mesh: Mesh | None = None) -> CodebookModel:
    """The finished stage's model from <workdir>/codebook/final (an `Ocr2CodebookModel` when the
    stage started from a DeepSeek-OCR-2 checkpoint)."""
    d = final_dir(workdir, CODEBOOK)
    meta = read_meta(d)["model"]
    if meta.get("kind") == "ocr2":
        from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig, Ocr2CodebookModel

        ocfg = Ocr2CodebookConfig.from_dict(meta)
        return restore_params(lambda: Ocr2CodebookModel(ocfg, rngs=nnx.Rngs(0)), d, mesh)
    mcfg = CodebookModelConfig.from_dict(meta)
    return restore_params(lambda: CodebookModel(mcfg, rngs=nnx.Rngs(0)), d, mesh)


def check_render_view(cfg: Config, workdir: str | Path) -> None:
    """Raises when <workdir>/codebook/final was trained on another `codebook.render_view` or `render_unit` than
    `cfg` names: its ids and decoder would read images and texts it never saw (a linked or reused stage is
    skipped by the runner, so nothing else would notice). Codebooks saved before the view (the unit) existed are
    `cot` (`chain`)."""
    meta = read_meta(final_dir(workdir, CODEBOOK))
    for key, before in (("render_view", "cot"), ("render_unit", "chain")):  # what codebooks without the key did
        trained, now = (meta.get("codebook") or {}).get(key, before), getattr(cfg.codebook, key)
        if trained != now:
            raise ValueError(f"{final_dir(workdir, CODEBOOK)} was trained with codebook.{key}={trained}, but this "
                             f"run's config says {now}: retrain the codebook stage or set codebook.{key}={trained}")


def load_latent_decoder(cfg: Config, workdir: str | Path, mesh: Mesh | None = None) -> LatentDecoder | None:
    """The frozen OCR decoder as a `process_reward.LatentDecoder`, or None before this stage ran."""
    if not (final_dir(workdir, CODEBOOK) / "meta.json").is_file():
        return None
    check_render_view(cfg, workdir)
    return load_decoder(workdir, mesh=mesh, batch_size=cfg.codebook.eval_batch_size, rules=cfg.mesh.rules)


OCR2_DECODER = "ocr2_decoder"  # meta kind of sft's dual-branch decoder on an OCR-2 codebook


def load_ocr_decoder(workdir: str | Path, mesh: Mesh | None = None) -> Any:
    """Stage sft's dual-branch decoder (with frozen code rows) from <workdir>/sft/decoder, or None: an
    `OCRBranch` (character decoder) or, on an OCR-2 codebook, an `ocr2_branch.Ocr2CodeDecoder`."""
    d = decoder_dir(workdir)
    if not (d / "meta.json").is_file():
        return None
    meta = read_meta(d)
    if meta.get("kind") == OCR2_DECODER:
        from dlr_jax.models.ocr2_branch import Ocr2CodeDecoder
        from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig

        ocfg, k = Ocr2CodebookConfig.from_dict(meta["model"]), int(meta["num_codes"])
        return restore_params(lambda: Ocr2CodeDecoder(ocfg, k, rngs=nnx.Rngs(0)), d, mesh)
    if meta.get("kind") != "ocr_decoder":
        raise ValueError(f"{d / 'meta.json'}: kind is {meta.get('kind')!r}, expected 'ocr_decoder' or "
                         f"{OCR2_DECODER!r}")
    dcfg = CodebookModelConfig.from_dict(meta["model"])
    k, f = int(meta["num_codes"]), int(meta["feature_dim"])
    return restore_params(lambda: OCRBranch(dcfg, f, rngs=nnx.Rngs(0), code_rows=jnp.zeros((k, f))), d, mesh)


def load_decoder(workdir: str | Path, *, mesh: Mesh | None = None, batch_size: int = 64,
                 rules: Any = "fsdp") -> LatentDecoder | Ocr2LatentDecoder:
    """The OCR decoder: stage sft's dual-branch decoder (<workdir>/sft/decoder, trained on the sft
    model's latent rows, which it carries) when sft wrote one, else the codebook stage's
    (<workdir>/codebook/final). On a DeepSeek-OCR-2 codebook, the fine-tuned OCR-2 decoder with KV-cached
    decoding (`Ocr2LatentDecoder`, reading text with the checkpoint's tokenizer)."""
    model = load_ocr_decoder(workdir, mesh)
    if model is None:
        model = load_codebook_model(workdir, mesh)
        if read_meta(final_dir(workdir, CODEBOOK))["model"].get("kind") == "ocr2":
            from dlr_jax.models.ocr2_branch import Ocr2CodeDecoder

            model = Ocr2CodeDecoder.from_codebook_model(model)
    if not isinstance(model, CodebookModel | OCRBranch):
        return Ocr2LatentDecoder(model, load_ocr2_tokenizer(workdir), batch_size=batch_size, mesh=mesh, rules=rules)
    return LatentDecoder(model, batch_size=batch_size)


OCR2_TOKENIZER = "tokenizer.json"  # the checkpoint's, copied next to an OCR-2 codebook stage's final params


def load_ocr2_tokenizer(workdir: str | Path) -> Any:
    """The DeepSeek-OCR-2 tokenizer of an OCR-2 codebook (`load_ocr2_tokenizer_file`)."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(load_ocr2_tokenizer_file(workdir)))


def load_ocr2_tokenizer_file(workdir: str | Path) -> Path:
    """<workdir>/codebook/final/tokenizer.json (an OCR-2 codebook stage copies the checkpoint's there), else
    codebook.init_from's as the workdir's config.yaml records it."""
    f = final_dir(workdir, CODEBOOK) / OCR2_TOKENIZER
    if not f.is_file():
        from dlr_jax.config import load_config

        recorded = Path(workdir) / "config.yaml"
        init_from = load_config(recorded).codebook.init_from if recorded.is_file() else ""
        f = Path(init_from) / OCR2_TOKENIZER if init_from else f
    if not f.is_file():
        raise FileNotFoundError(f"{f}: the DeepSeek-OCR-2 tokenizer is needed to read the OCR-2 decoder's tokens; "
                                "rerun the codebook stage, or put the checkpoint's tokenizer.json there")
    return f
