"""The codebook stage's held-out report (step 4 of stages/codebook/stage.py): held-out CoTs decoded
greedily from their own ids, from ids shuffled across examples of the same N (a decoder that ignores the
codes scores the same on both) and from the continuous features, scored by CER and by the final number
read back; and the stage's closing summary line. `codebook.run` puts the report under "held_out" in
report.json; `codebook_report` makes it for any main-phase checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from dlr_jax.models.codebook_model import CodebookModel
from dlr_jax.models.vq import code_usage
from dlr_jax.stages.codebook.models import LatentDecoder, encode_ids
from dlr_jax.text.ocr_text import normalize_text


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (unit insert / delete / substitute), one vectorised DP row at a time."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    bb = np.asarray([ord(c) for c in b] if isinstance(b, str) else list(b))
    prev = np.arange(len(b) + 1)
    j = np.arange(len(b) + 1)
    for i, ca in enumerate(a, 1):
        cur = np.empty_like(prev)
        cur[0] = i
        sub = prev[:-1] + (bb != (ord(ca) if isinstance(ca, str) else ca))
        cur[1:] = np.minimum(prev[1:] + 1, sub)
        # insertions: cur[j] = min_k<=j cur[k] + (j - k)
        prev = np.minimum.accumulate(cur - j) + j
    return int(prev[-1])


def cer(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus character error rate: total edits / total reference characters."""
    total = sum(len(r) for r in refs)
    return sum(edit_distance(h, r) for h, r in zip(hyps, refs, strict=True)) / max(total, 1)


def final_number_match(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Share of decodings whose last number is the reference's (a CoT's final result, the answer):
    what an answer head could read from the codes, which CER hides (a decoding that keeps a chain's
    brackets and layout but not its digits scores a fair CER and no final numbers)."""
    from dlr_jax.text.answers import extract_answer, is_correct

    golds = [extract_answer(r) for r in refs]
    hits = [g is not None and is_correct(extract_answer(h), g, "gsm8k") for h, g in zip(hyps, golds, strict=True)]
    return float(np.mean(hits)) if hits else 0.0


def reconstruction_report(model: CodebookModel, texts: Sequence[str], cb: Any, *, seed: int = 0
                          ) -> dict[str, Any]:
    """Greedy CER with true ids, ids shuffled across examples of the same N, and the continuous H;
    reconstruction capped at 2x the reference length."""
    ids, feats, enc_rate = encode_ids(model, texts, cb)
    refs = [normalize_text(t)[: cb.max_text_len - 1] for t in texts]
    limits = [2 * len(r) + 1 for r in refs]
    rng = np.random.default_rng(seed)
    shuffled = list(ids)
    by_n: dict[int, list[int]] = {}
    for i, z in enumerate(ids):
        by_n.setdefault(len(z), []).append(i)
    for group in by_n.values():
        order = rng.permutation(group)  # one cycle through the group: no example keeps its own ids
        for i, j in zip(order, np.roll(order, -1), strict=True):
            shuffled[i] = ids[j] if len(group) > 1 else ids[i]
    dec = LatentDecoder(model, batch_size=cb.eval_batch_size)
    t0 = time.perf_counter()
    hyp_true = dec.decode(ids, limits=limits)
    dec_rate = len(texts) / (time.perf_counter() - t0)
    hyp_shuf = dec.decode(shuffled, limits=limits)
    hyp_cont = dec.decode_features(feats, limits=limits)
    _, used, ppl = code_usage(jnp.asarray(np.concatenate([np.asarray(z) for z in ids])), model.cfg.num_codes)
    return {
        "examples": len(texts),
        "cer_true": cer(hyp_true, refs),
        "cer_shuffled": cer(hyp_shuf, refs),
        "cer_continuous": cer(hyp_cont, refs),
        "final_number_true": final_number_match(hyp_true, refs),
        "final_number_shuffled": final_number_match(hyp_shuf, refs),
        "perplexity": float(ppl),
        "used_codes": int(used),
        "mean_n": float(np.mean([len(z) for z in ids])),
        "encoder_vq_images_per_s": enc_rate,
        "decode_examples_per_s_incl_compile": dec_rate,
        "samples": [{"ref": r, "true": a, "shuffled": b}
                    for r, a, b in list(zip(refs, hyp_true, hyp_shuf, strict=True))[:8]],
    }


def print_summary(r: dict[str, Any]) -> None:
    """One line; the held-out figures are the ones the report has (a from-scratch codebook's greedy OCR: CER and
    the final number; DeepSeek-OCR-2's: teacher-forced CE and token accuracy), none made up for the others."""
    h = r.get("held_out", {})
    rate = r["train_images_per_s"]

    def pair(label: str, key: str, extra: str = "") -> str:
        if f"{key}_true" not in h:
            return ""
        more = f" {extra}={h[f'{key}_{extra}']:.3f}" if extra and f"{key}_{extra}" in h else ""
        return f"; {label} true={h[f'{key}_true']:.3f} shuffled={h[f'{key}_shuffled']:.3f}{more}"

    held = (pair("held-out CER", "cer", "continuous") + pair("final number read back", "final_number")
            + pair("held-out token CE", "ce") + pair("token accuracy", "token_accuracy"))
    ppl = f"held-out={h['perplexity']:.1f} " if "perplexity" in h else ""
    print(f"[codebook] steps={r['steps']} K={r['K']} train {'n/a' if rate is None else f'{rate:.1f}'} images/s, render "
          f"{r['render_images_per_s_one_thread']:.0f} images/s/thread{held}; perplexity {ppl}"
          f"train={r['train_sample']['perplexity']:.1f}", flush=True)
