"""The OCR decoder's text side: a character vocabulary, the text as the renderer lays it out, and
decoder targets.

The codebook's OCR decoder reads and writes *characters* (`CharVocab`): printable ASCII plus "\\n",
with <pad>/<bos>/<eos>/<unk>/<drop> specials. Characters rather than the workdir's BPE because the
codebook stage then needs no tokenizer (it can run before any other stage, on any corpus), the
reconstruction error is naturally a character error rate, and input-character dropout -- which
makes a from-scratch decoder lean on the codes, so more of the codebook is used -- acts on characters.
Targets are the CoT as the renderer lays it out (`normalize_text`), so the decoder is never asked
for whitespace the image does not show.

A module of its own, below both `data` (the pipelines build targets) and `models` (the decoder's
vocabulary size and special ids), so neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class CharVocab:
    """ids: 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk> (any character outside the table), 4 <drop> (a
    dropped teacher-forced input character), then "\\n" and ASCII 32..126."""

    PAD, BOS, EOS, UNK, DROP = 0, 1, 2, 3, 4
    NUM_SPECIAL = 5
    CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

    def __init__(self) -> None:
        self._id = {c: i + self.NUM_SPECIAL for i, c in enumerate(self.CHARS)}
        self.size = self.NUM_SPECIAL + len(self.CHARS)

    def padded_size(self, multiple: int = 64) -> int:
        return -(-self.size // multiple) * multiple

    def encode(self, text: str) -> list[int]:
        """Characters -> ids (no <bos>/<eos>)."""
        return [self._id.get(c, self.UNK) for c in text]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids up to the first <eos>; other specials are skipped, <unk> reads as U+FFFD."""
        out = []
        for i in np.asarray(ids, np.int64).tolist():
            if i == self.EOS:
                break
            if i == self.UNK:
                out.append("\ufffd")
            elif self.NUM_SPECIAL <= i < self.size:
                out.append(self.CHARS[i - self.NUM_SPECIAL])
        return "".join(out)


VOCAB = CharVocab()


def normalize_text(text: str) -> str:
    """The text the renderer draws: control characters become spaces, runs of spaces collapse,
    lines are stripped, trailing blank lines go (`dlr_jax.text.render` lays text out this way)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(" " if ord(c) < 32 and c != "\n" else c for c in text)
    return "\n".join(" ".join(line.split()) for line in text.split("\n")).rstrip()


def encode_target(text: str, max_len: int) -> tuple[np.ndarray, bool]:
    """Decoder targets [max_len] int32: chars of `normalize_text(text)`, <eos>, <pad>...; and whether
    the text had to be cut (max_len - 1 characters are kept)."""
    ids = VOCAB.encode(normalize_text(text))
    cut = len(ids) > max_len - 1
    ids = ids[: max_len - 1] + [VOCAB.EOS]
    out = np.full(max_len, VOCAB.PAD, np.int32)
    out[: len(ids)] = ids
    return out, cut
