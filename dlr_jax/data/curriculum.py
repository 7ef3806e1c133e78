"""The latent curriculum of stage sft (`latent.curriculum`): rows whose first k reasoning steps are latent codes
and whose other steps stay text, k scheduled over training.

    [x ; <latent> z(step 1) .. z(step k) </latent> y(step k+1) .. y(step S) <answer> a </answer> <eos>]

(`formats.mixed_sequence`). k = 0 is the text CoT behind an empty span `<latent> </latent>` (the model always
opens and closes a span, so the format reward and the evaluation parser read every row alike); k = S is the
paper's `formats.sft_sequence`. An example's S steps are its latent span's groups of codes
(`LatentTable.step_counts`: (n,) when the codebook rendered the whole chain, `codebook.render_unit=chain`, so
S = 1 and k = 0 is the text CoT, k = 1 the paper's row) matched one to one with the CoT's text steps
(`text.steps.split_steps`, as the codebook's export cut it). The text of a step is cut from the CoT as written.

Schedules (`CURRICULA`), each a pure function of (p, example id, seed), where p is the example's position in the
global stream of `data.pipeline` (all epochs, every process's rows): a resumed iterator meets every example at
the position the uninterrupted run did, so it gives it the same k.

- `stagewise` (Coconut's stages): training step t = floor(p / examples_per_step) (exact without packing, where a
  global batch is a step; packed, the epoch's mean examples per row stand in); stage s = t // L with
  L = round(stage_fraction * num_steps) steps a stage, and k = min(max(s, k_min), S); the last stage
  (s = ceil(1 / stage_fraction) - 1) is the paper's row, k = S for every example, as Coconut's last stage drops
  the remaining language steps, so the stage ends on the layout RL and evaluation read.
- `random` (Token Assorted's mix): k uniform in [min(k_min, S), S] from a hash of (seed, example id, epoch), a
  new draw every epoch.

Length filtering keeps an example only when its longest variant (every k the schedule can give it) fits, so no
example is dropped mid-training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dlr_jax.config.stages import CURRICULA

__all__ = ["CURRICULA", "Curriculum", "latent_codes", "ocr_step", "split_cot", "step_counts"]


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """A schedule of k, the latent steps of each sft row (see the module docstring).

    mode: `stagewise` or `random`. stage_fraction: stagewise, the share of the sft schedule's steps one stage
    lasts. k_min: k is never below min(k_min, S). num_steps / examples_per_step: stagewise, the schedule's
    optimizer steps and the examples a global step reads (`with_schedule`, once the stage knows them)."""

    mode: str
    stage_fraction: float = 0.25
    k_min: int = 0
    seed: int = 0
    num_steps: int = 0
    examples_per_step: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in CURRICULA or self.mode == "off":
            raise ValueError(f"a curriculum is one of {'|'.join(CURRICULA[1:])}, got {self.mode!r}")
        if not 0 < self.stage_fraction <= 1:
            raise ValueError(f"stage_fraction must be in (0, 1], got {self.stage_fraction}")
        if self.k_min < 0:
            raise ValueError(f"k_min must be >= 0, got {self.k_min}")

    @classmethod
    def from_config(cls, latent: Any, seed: int) -> Curriculum | None:
        """The curriculum `latent.curriculum` asks for (a `config.stages.LatentConfig`), None when off."""
        if latent.curriculum == "off":
            return None
        return cls(latent.curriculum, float(latent.curriculum_stages), int(latent.curriculum_k_min), int(seed))

    @property
    def num_stages(self) -> int:
        # the epsilon keeps 1 / 0.2 = 5.000000000000001 at 5 stages
        return max(1, math.ceil(1.0 / self.stage_fraction - 1e-9))

    @property
    def scheduled(self) -> bool:
        """Whether k can be computed: stagewise needs the schedule's length (`with_schedule`)."""
        return self.mode != "stagewise" or (self.num_steps > 0 and self.examples_per_step > 0)

    def with_schedule(self, num_steps: int, examples_per_step: float) -> Curriculum:
        if num_steps < 1 or examples_per_step <= 0:
            raise ValueError(f"need num_steps >= 1 and examples_per_step > 0, got {num_steps}, {examples_per_step}")
        return dataclasses.replace(self, num_steps=int(num_steps), examples_per_step=float(examples_per_step))

    def k_range(self, n_steps: int) -> range:
        """Every k this schedule can give an example of `n_steps` steps (what length filtering must fit)."""
        return range(min(self.k_min, n_steps), n_steps + 1)

    def stage(self, position: int) -> int:
        """Stagewise: the stage of the example at global stream position `position`."""
        if not self.scheduled:
            raise ValueError("a stagewise curriculum needs the schedule's length first (with_schedule)")
        step = int(position // self.examples_per_step)
        stage_len = max(1, round(self.stage_fraction * self.num_steps))
        return min(step // stage_len, self.num_stages - 1)

    def latent_steps(self, position: int, example_id: str, n_steps: int, *, epoch_size: int) -> int:
        """k for the example `example_id` of `n_steps` steps at global stream position `position`, in a stream whose
        epochs hold `epoch_size` examples."""
        lo = min(self.k_min, n_steps)
        if self.mode == "random":
            epoch = position // max(epoch_size, 1)
            return lo + _stable_int(self.seed, example_id, epoch) % (n_steps - lo + 1)
        stage = self.stage(position)
        if stage == self.num_stages - 1:
            return n_steps
        return min(max(stage, lo), n_steps)


def _stable_int(seed: int, key: str, epoch: int, tag: str = "curriculum") -> int:
    # Python's hash() is salted per process; grain workers and other hosts must draw alike. The tag keeps two
    # draws for the same (seed, example, epoch) independent of each other.
    text = f"{tag}\x00{seed}\x00{key}\x00{epoch}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def ocr_step(seed: int, example_id: str, epoch: int, k: int) -> int | None:
    """The latent step j in [0, k) whose codes and text make an sft row's dual-branch target under
    codebook.render_unit=step (one latent step per row, drawn per example: an unbiased sample of the per-step
    loss): uniform from a hash of (seed, example id, epoch), a new draw every epoch; None when k = 0."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return _stable_int(seed, example_id, epoch, tag="ocr_step") % k if k else None


def step_counts(latents: Mapping[str, Sequence[int]], key: str) -> tuple[int, ...]:
    """Codes per step of example `key`'s latent span: `LatentTable.step_counts` where the table has it, else the
    whole span as one step (a plain mapping)."""
    n = len(latents[key])
    per_step = getattr(latents, "step_counts", None)
    counts = (n,) if per_step is None else tuple(int(c) for c in per_step(key))
    if sum(counts) != n or any(c < 0 for c in counts) or not counts:
        raise ValueError(f"example {key!r}: codes per step {counts} do not add up to its {n} latent codes")
    return counts


def latent_codes(codes: Sequence[int], counts: Sequence[int], k: int) -> tuple[int, ...]:
    """The codes of the first k steps."""
    return tuple(codes[: sum(counts[:k])])


def split_cot(cot: str, n_steps: int, k: int, *, example_id: str | None = None) -> tuple[str, str]:
    """(the text of the first k of the CoT's n_steps steps, the text of the rest), each cut from `cot` as written.
    k = 0 gives ("", cot), k = n_steps (cot, ""). Raises ValueError when `split_steps` does not find n_steps
    steps (the latent span's steps must be the CoT's)."""
    if not 0 <= k <= n_steps:
        raise ValueError(f"k must be in [0, {n_steps}], got {k}")
    bounds = _step_bounds(cot, n_steps, example_id)
    if k == 0:
        return "", cot
    if k == n_steps:
        return cot, ""
    return cot[: bounds[k - 1][1]], cot[bounds[k][0] :]


def _step_bounds(cot: str, n_steps: int, example_id: str | None) -> list[tuple[int, int]]:
    if n_steps == 1:  # the whole chain is the one step (render_unit chain): no cut to find
        return [(0, len(cot))]
    from dlr_jax.text.steps import split_steps

    steps = split_steps(cot)
    if len(steps) != n_steps:
        who = f"example {example_id!r}: " if example_id is not None else ""
        raise ValueError(
            f"{who}its latent span has {n_steps} steps but text.steps.split_steps finds {len(steps)} in its CoT "
            f"{cot[:80]!r}; the latent curriculum pairs code step i with text step i (a codebook rendered one step "
            "a canvas under codebook.render_view=cot, or the whole chain, render_unit=chain)")
    bounds, pos = [], 0
    for s in steps:  # steps are substrings of the CoT in order
        a = cot.index(s, pos)
        bounds.append((a, a + len(s)))
        pos = a + len(s)
    return bounds
