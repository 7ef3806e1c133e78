"""Text tokenizer wrapper: boundary tokens, latent ids after the text vocabulary, vocab padding.

Id layout (one softmax over all of it):

    [0, text_vocab_size)                       text tokens, incl. added <pad>/<eos>/<latent>/...
    [latent_offset, latent_offset + K)         latent codes z_0..z_{K-1}; latent_offset = text_vocab_size
    [latent_offset + K, total_vocab_size)      padding rows up to a multiple of `pad_multiple`

`vocab_padding_mask()` is True on rows a model may predict: ids the text tokenizer knows, and the
K latent ids. Padding rows, and rows a pretrained model has but its tokenizer never produces
(Qwen's embedding is larger than its tokenizer), are False and get masked out of the softmax.

Latent ids decode to `<z_k>`, and `encode` maps `<z_k>` back to the latent id, so printed
sequences round-trip.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from dlr_jax.core.files import atomic_path, write_text_atomic

LATENT_START, LATENT_END = "<latent>", "</latent>"
ANSWER_START, ANSWER_END = "<answer>", "</answer>"
BOUNDARY_TOKENS = (LATENT_START, LATENT_END, ANSWER_START, ANSWER_END)
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "dlr_tokens.json"
META_FORMAT = "dlr_jax.text.tokens/1"
_LATENT_TEXT = re.compile(r"<z_(\d+)>")
_EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class Tokenizer:
    """A HF `tokenizers.Tokenizer` plus the DLR id layout (see the module docstring).

    Build with `train_bpe`, `Tokenizer.from_pretrained_dir` or `Tokenizer.load`; the constructor
    adds any boundary / pad / eos token the backend lacks as a special added token.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        pad_token: str = PAD,
        eos_token: str = EOS,
        bos_token: str | None = None,
        num_latents: int = 0,
        pad_multiple: int = 128,
        min_text_vocab_size: int = 0,
    ) -> None:
        if num_latents < 0:
            raise ValueError(f"num_latents must be >= 0, got {num_latents}")
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
        self.backend = backend
        missing = [
            t
            for t in (pad_token, eos_token, bos_token, *BOUNDARY_TOKENS)
            if t is not None and backend.token_to_id(t) is None
        ]
        if missing:
            backend.add_special_tokens(
                [tokenizers.AddedToken(t, special=True, normalized=False) for t in missing]
            )
        self.pad_token, self.eos_token, self.bos_token = pad_token, eos_token, bos_token
        self.num_latents = int(num_latents)
        self.pad_multiple = int(pad_multiple)
        self.min_text_vocab_size = int(min_text_vocab_size)
        vocab = backend.get_vocab(with_added_tokens=True)
        self._known_ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
        # Ids may have holes (hand-edited tokenizer.json): size by the largest id, not the count.
        self.text_vocab_size = max(int(self._known_ids.max()) + 1, self.min_text_vocab_size)
        self.pad_id = self._id(pad_token)
        self.eos_id = self._id(eos_token)
        self.bos_id = None if bos_token is None else self._id(bos_token)
        self.latent_start_id = self._id(LATENT_START)
        self.latent_end_id = self._id(LATENT_END)
        self.answer_start_id = self._id(ANSWER_START)
        self.answer_end_id = self._id(ANSWER_END)
        self.special_ids = frozenset(
            i
            for i in (
                self.pad_id,
                self.eos_id,
                self.bos_id,
                self.latent_start_id,
                self.latent_end_id,
                self.answer_start_id,
                self.answer_end_id,
            )
            if i is not None
        )

    # ---- id layout -------------------------------------------------------------------------
    @property
    def latent_offset(self) -> int:
        return self.text_vocab_size

    @property
    def total_vocab_size(self) -> int:
        """text + K latent rows, rounded up to a multiple of `pad_multiple`."""
        return _round_up(self.text_vocab_size + self.num_latents, self.pad_multiple)

    def latent_id(self, k: int) -> int:
        if not 0 <= k < self.num_latents:
            raise IndexError(f"latent index {k} out of range [0, {self.num_latents})")
        return self.latent_offset + int(k)

    def latent_ids(self, ks: Iterable[int]) -> list[int]:
        return [self.latent_id(k) for k in ks]

    def is_latent(self, token_id: Any) -> Any:
        """True where `token_id` is a latent id; works on ints and on numpy / jax arrays."""
        return (token_id >= self.latent_offset) & (token_id < self.latent_offset + self.num_latents)

    def latent_index(self, token_id: int) -> int:
        """The code index k of latent id `token_id`."""
        if not self.is_latent(token_id):
            raise ValueError(
                f"id {token_id} is not a latent id (latents are [{self.latent_offset}, "
                f"{self.latent_offset + self.num_latents}))"
            )
        return int(token_id) - self.latent_offset

    def vocab_padding_mask(self) -> np.ndarray:
        """Bool [total_vocab_size]: True for rows a model may predict (known text ids + latents)."""
        mask = np.zeros(self.total_vocab_size, dtype=bool)
        mask[self._known_ids] = True
        mask[self.latent_offset : self.latent_offset + self.num_latents] = True
        return mask

    def with_latents(self, num_latents: int, pad_multiple: int | None = None) -> Tokenizer:
        """A copy with another codebook size K (and optionally another pad multiple)."""
        return Tokenizer(
            tokenizers.Tokenizer.from_str(self.backend.to_str()),
            pad_token=self.pad_token,
            eos_token=self.eos_token,
            bos_token=self.bos_token,
            num_latents=num_latents,
            pad_multiple=self.pad_multiple if pad_multiple is None else pad_multiple,
            min_text_vocab_size=self.min_text_vocab_size,
        )

    # ---- text <-> ids ------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of `text`. Boundary tokens written in the text (`<answer>`) become their single ids,
        `<z_k>` becomes latent id k; no special tokens are added unless asked."""
        ids: list[int] = [self.bos_id] if add_bos and self.bos_id is not None else []
        if add_bos and self.bos_id is None:
            raise ValueError("this tokenizer has no bos token")
        pos = 0
        if self.num_latents:
            for m in _LATENT_TEXT.finditer(text):
                k = int(m.group(1))
                if k >= self.num_latents:
                    continue  # not a latent of this codebook: leave it as text
                ids += self._encode_text(text[pos : m.start()])
                ids.append(self.latent_id(k))
                pos = m.end()
        ids += self._encode_text(text[pos:])
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Ids of `text` read as plain text: markup in it (`<answer>`, `<eos>`, `<z_3>`) becomes ordinary
        text tokens, never the special or latent ids. For untrusted text fed to a model, e.g. an OCR
        decode of latent ids (the process reward): a decode that happens to spell `<answer>` must not
        end the evaluator's CoT."""
        specials = sorted({t for t in (self.backend.id_to_token(i) for i in self.special_ids) if t}, key=len,
                          reverse=True)
        if not specials or not text:
            return self._encode_text(text)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
            if piece in specials:  # split it so the added-token matcher cannot see it whole
                ids += self._encode_text(piece[:1]) + self.encode_plain(piece[1:])
            else:
                ids += self._encode_text(piece)
        return ids

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        return [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`: pad is dropped, latent ids print as `<z_k>`; with skip_special_tokens the
        boundary / bos / eos tokens are dropped too. Ids in the padding rows raise ValueError."""
        drop = self.special_ids if skip_special_tokens else {self.pad_id}
        parts: list[str] = []
        run: list[int] = []
        for i in (int(x) for x in ids):
            if i in drop:
                continue
            if self.is_latent(i):
                parts.append(self.backend.decode(run, skip_special_tokens=False) if run else "")
                run = []
                parts.append(f"<z_{i - self.latent_offset}>")
            elif 0 <= i < self.text_vocab_size:
                run.append(i)
            else:
                raise ValueError(
                    f"id {i} is outside the text ({self.text_vocab_size}) and latent "
                    f"({self.num_latents}) ranges; total_vocab_size={self.total_vocab_size}"
                )
        if run:
            parts.append(self.backend.decode(run, skip_special_tokens=False))
        return "".join(parts)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        if self.is_latent(token_id):
            return f"<z_{token_id - self.latent_offset}>"
        return self.backend.id_to_token(token_id)

    def _encode_text(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids if text else []

    def _id(self, token: str) -> int:
        i = self.backend.token_to_id(token)
        if i is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return i

    # ---- persistence -------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {
            "format": META_FORMAT,
            "pad_token": self.pad_token,
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "num_latents": self.num_latents,
            "pad_multiple": self.pad_multiple,
            "min_text_vocab_size": self.min_text_vocab_size,
            "text_vocab_size": self.text_vocab_size,
            "total_vocab_size": self.total_vocab_size,
        }

    def save(self, directory: str | os.PathLike) -> Path:
        """Writes `tokenizer.json` (HF format, readable by transformers) and `dlr_tokens.json`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        # Atomic (other processes may be loading them), the metadata first: a directory whose
        # tokenizer.json exists is complete (stages.common.get_tokenizer looks for that file).
        write_text_atomic(d / META_FILE, json.dumps(self.meta(), indent=2) + "\n")
        with atomic_path(d / TOKENIZER_FILE) as tmp:
            self.backend.save(str(tmp))
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        """Reads what `save` wrote."""
        d = Path(directory)
        for f in (TOKENIZER_FILE, META_FILE):
            if not (d / f).is_file():
                raise FileNotFoundError(f"{d / f} missing: not a directory written by Tokenizer.save")
        meta = json.loads((d / META_FILE).read_text())
        if meta.get("format") != META_FORMAT:
            raise ValueError(f"{d / META_FILE}: expected format {META_FORMAT!r}, got {meta.get('format')!r}")
        tok = cls(
            tokenizers.Tokenizer.from_file(str(d / TOKENIZER_FILE)),
            pad_token=meta["pad_token"],
            eos_token=meta["eos_token"],
            bos_token=meta["bos_token"],
            num_latents=meta["num_latents"],
            pad_multiple=meta["pad_multiple"],
            min_text_vocab_size=meta["min_text_vocab_size"],
        )
        if tok.text_vocab_size != meta["text_vocab_size"]:
            raise ValueError(f"{d}: text_vocab_size {tok.text_vocab_size} != saved {meta['text_vocab_size']}")
        return tok

    @classmethod
    def from_pretrained_dir(
        cls,
        directory: str | os.PathLike,
        *,
        num_latents: int = 0,
        pad_multiple: int = 128,
        model_vocab_size: int | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        bos_token: str | None = None,
    ) -> Tokenizer:
        """Wraps a HF checkpoint's `tokenizer.json`; special tokens come from `tokenizer_config.json`
        / `special_tokens_map.json` when not given. A missing pad token is added as `<pad>`.

        model_vocab_size: rows of the checkpoint's embedding; latent ids then start after
        max(tokenizer ids, model rows), so they never alias a pretrained row.
        """
        d = Path(directory)
        if not (d / TOKENIZER_FILE).is_file():
            raise FileNotFoundError(f"{d / TOKENIZER_FILE} missing (only fast HF tokenizers are supported)")
        backend = tokenizers.Tokenizer.from_file(str(d / TOKENIZER_FILE))
        cfg: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
            if (d / name).is_file():
                cfg.update({k: v for k, v in json.loads((d / name).read_text()).items() if v is not None})

        def content(key: str) -> str | None:
            v = cfg.get(key)
            return v.get("content") if isinstance(v, dict) else v

        eos = (
            eos_token
            or content("eos_token")
            or next((t for t in _EOS_CANDIDATES if backend.token_to_id(t) is not None), None)
        )
        if eos is None:
            raise ValueError(
                f"{d}: no eos token in tokenizer_config.json and none of {_EOS_CANDIDATES} in the "
                "vocabulary; pass eos_token="
            )
        return cls(
            backend,
            pad_token=pad_token or content("pad_token") or PAD,
            eos_token=eos,
            bos_token=bos_token or content("bos_token"),
            num_latents=num_latents,
            pad_multiple=pad_multiple,
            min_text_vocab_size=model_vocab_size or 0,
        )

    @staticmethod
    def train_bpe(texts: Iterable[str], vocab_size: int = 512, **kwargs: Any) -> Tokenizer:
        """See the module-level `train_bpe`."""
        return train_bpe(texts, vocab_size, **kwargs)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tokenizer)
            and self.meta() == other.meta()
            and json.loads(self.backend.to_str()) == json.loads(other.backend.to_str())
        )

    __hash__ = None  # type: ignore[assignment]  # mutable backend

    def __repr__(self) -> str:
        return (
            f"Tokenizer(text_vocab_size={self.text_vocab_size}, num_latents={self.num_latents}, "
            f"total_vocab_size={self.total_vocab_size})"
        )


def train_bpe(
    texts: Iterable[str],
    vocab_size: int = 512,
    *,
    num_latents: int = 0,
    pad_multiple: int = 128,
    min_frequency: int = 2,
) -> Tokenizer:
    """A byte-level BPE for tiny configs, every digit its own token.

    Digits are split into single-character pre-tokens before byte-level splitting, so no merge
    can ever join two digits (or a digit and a space): arithmetic sees one token per digit.
    vocab_size counts the 256 byte symbols and the 7 special tokens (ids 0..6: <pad> <bos>
    <eos> <latent> </latent> <answer> </answer>), so it must be at least 263.
    """
    specials = [PAD, BOS, EOS, *BOUNDARY_TOKENS]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(
            f"vocab_size={vocab_size} is below the byte alphabet plus specials "
            f"({len(alphabet) + len(specials)})"
        )
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(
        backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        num_latents=num_latents,
        pad_multiple=pad_multiple,
    )
