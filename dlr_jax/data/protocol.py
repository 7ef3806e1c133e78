"""The data protocol: which training examples each stage reads, and how many steps an epoch is.

The paper splits the training set between supervised stages and RL (GSM8K-Aug: 300k SFT / 85k RL;
MATH: 12k -> 7.5k / 4.5k) and drops chains of thought longer than 2,048 tokens. Here:

- `cot_length_filter`: examples whose CoT tokenises to more than `max_cot_tokens` are left out of
  every stage (counted, never silently);
- `split_sft_rl`: the RL part is the examples whose hash of (split_seed, example id) ranks lowest, so
  the split does not depend on the file's order, the number of processes or the run seed. Stage align
  reads the SFT part or, with data.align_part=all (the paper's "all 385K for latent-text alignment"),
  both parts;
- `steps_for_epochs`: `num_epochs` passes over n examples at a global batch size, rounded up;
- `stratified_sample`: n examples of a source in proportion to its strata (`allocate`, largest
  remainders), within each stratum the ids whose hash of (seed, id) ranks lowest (`pick`): the codebook
  corpus's "name:split@N" entries (the paper's stratified 603K of MathX-5M; dlr_jax/data/sources.py).

`record` writes what was chosen to `<workdir>/data_protocol.json` (counts and a digest of the ids per
part), so two runs can be checked to have trained on the same examples.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlr_jax.config import ConfigError
from dlr_jax.core.files import write_text_atomic
from dlr_jax.data.records import Example

PARTS = ("sft", "rl")
PROTOCOL_FILE = "data_protocol.json"


def _rank(example_id: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}:{example_id}".encode()).digest()


class SampleTooLarge(ValueError):
    """A sample asks for more examples than its source has (e.g. a count meant for a full release, read
    from a subset)."""


def allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """How many of n examples each stratum gives, in proportion to its size: floors, then the largest
    remainders (ties by stratum name), so the parts sum to n and none exceeds its stratum."""
    total = sum(sizes.values())
    if n > total:
        raise SampleTooLarge(f"a sample of {n:,} asked of {total:,} examples")
    if n <= 0:
        raise ValueError(f"a sample needs n > 0, got {n}")
    quota = {s: n * k / total for s, k in sizes.items()}
    out = {s: math.floor(q) for s, q in quota.items()}
    for s in sorted(quota, key=lambda s: (out[s] - quota[s], s))[: n - sum(out.values())]:
        out[s] += 1
    return out


def pick(ids: Sequence[str], k: int, seed: int) -> set[str]:
    """The k ids whose hash of (seed, id) ranks lowest: independent of the ids' order."""
    return set(sorted(ids, key=lambda i: _rank(i, seed))[:k])


def stratified_sample(examples: Sequence[Example], n: int, seed: int = 0, stratum=None) -> list[Example]:
    """n of `examples` (file order kept), each stratum (`stratum(example)`, default `extra["stratum"]`, else
    one stratum) in proportion to its size. Readers that cannot hold a whole source in memory (MathX-5M) take
    the same sample file by file with `allocate` and `pick`."""
    stratum = stratum or (lambda ex: str(ex.extra.get("stratum", "")))
    groups: dict[str, list[str]] = {}
    for ex in examples:
        groups.setdefault(stratum(ex), []).append(ex.id)
    if sum(map(len, groups.values())) != len({ex.id for ex in examples}):
        raise ValueError("stratified_sample needs unique example ids")
    quota = allocate({s: len(ids) for s, ids in groups.items()}, n)
    keep = set().union(*(pick(ids, quota[s], seed) for s, ids in groups.items()))
    return [ex for ex in examples if ex.id in keep]


def rl_count(n: int, rl_split: float) -> int:
    """Examples of n that go to RL: a fraction (< 1) or a count (>= 1) of them."""
    if rl_split < 0:
        raise ConfigError(f"data.rl_split must be >= 0, got {rl_split}")
    if rl_split == 0:
        return 0
    k = round(rl_split * n) if rl_split < 1 else int(rl_split)
    if rl_split >= 1 and rl_split != int(rl_split):
        raise ConfigError(f"data.rl_split={rl_split}: a count must be a whole number (a fraction must be < 1)")
    if not 0 < k < n:
        # a count meant for a full training file (the paper's 85,620 of GSM8K-Aug's 385,620) on a smaller one
        hint = (" (a count for a larger training file? GSM8K-Aug's full train set: `python -m dlr_jax.data.download "
                "gsm8k_aug_full`; or set data.rl_split to a fraction < 1)") if rl_split >= 1 and k >= n else ""
        raise ConfigError(
            f"data.rl_split={rl_split} leaves {k} of {n} training examples for RL and {n - k} for SFT; "
            f"both parts must be non-empty{hint}"
        )
    return k


def split_sft_rl(examples: Sequence[Example], rl_split: float, seed: int = 0) -> dict[str, list[Example]]:
    """{"sft": [...], "rl": [...]}, each in the file's order. rl_split = 0: both are every example."""
    k = rl_count(len(examples), rl_split)
    if k == 0:
        return {"sft": list(examples), "rl": list(examples)}
    ids = [ex.id for ex in examples]
    if len(set(ids)) != len(ids):
        raise ValueError("split_sft_rl needs unique example ids")
    rl_ids = set(sorted(ids, key=lambda i: _rank(i, seed))[:k])
    return {"sft": [ex for ex in examples if ex.id not in rl_ids], "rl": [ex for ex in examples if ex.id in rl_ids]}


def cot_length_filter(examples: Sequence[Example], count_tokens, max_cot_tokens: int) -> tuple[list[Example], int]:
    """(examples whose CoT has at most max_cot_tokens tokens, number dropped); 0 = keep all.
    `count_tokens(text) -> int`."""
    if max_cot_tokens <= 0:
        return list(examples), 0
    kept = [ex for ex in examples if count_tokens(ex.cot) <= max_cot_tokens]
    return kept, len(examples) - len(kept)


def steps_for_epochs(num_epochs: float, n: int, batch_size: int) -> int:
    """Optimizer steps for num_epochs passes over n examples at batch_size, rounded up (>= 1)."""
    if num_epochs <= 0 or n <= 0 or batch_size <= 0:
        raise ValueError(f"need num_epochs, n and batch_size > 0, got {num_epochs}, {n}, {batch_size}")
    return max(1, math.ceil(num_epochs * n / batch_size))


def ids_digest(examples: Sequence[Example]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(ex.id.encode() + b"\n")
    return h.hexdigest()[:16]


def record(workdir: str | Path, info: dict[str, Any], *, write: bool = True, name: str = PROTOCOL_FILE) -> Path:
    """Writes (or checks against) `<workdir>/<name>` (default data_protocol.json): a rerun must see the same
    split. write=False (processes other than 0): only the check, so every process refuses a changed split.
    The codebook stage records its corpus the same way (codebook/corpus.json)."""
    f = Path(workdir) / name
    if f.is_file():
        old = json.loads(f.read_text())
        if old != info:
            diff = sorted(k for k in set(old) | set(info) if old.get(k) != info.get(k))
            raise ValueError(
                f"{f}: this run's data protocol differs from the recorded one in {diff}; the stages of one "
                "workdir must train on one split (use a new workdir)"
            )
        return f
    if not write:
        return f
    f.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(f, json.dumps(info, indent=2) + "\n")
