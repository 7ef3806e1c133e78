"""What of a CoT the codebook renders and its OCR decoder reads back (`codebook.render_view`).

`cot` (the paper) renders the whole chain of thought. `results` renders only the result of each
calculator step `<<a+b=c>>`, space-separated ("19 16 96"): the visual counterpart of the
`latent.source=step_results` control (the last result is the answer, so these views hand the
answer's digits to the image, as the control's codes do). `result_lines` puts each result on its own line, so that a
step's result sits where one code of the causal flow's reading order can hold it. On the synthetic
task a from-scratch encoder keeps a full chain's layout but few of its digits (BENCHMARKS.md, the
latent probe); a few numbers are what such an encoder can learn to read, so these views measure how
far visual latents get when they carry each step's result. The text CoT (CoT-SFT, the align stage's
targets) is never changed by the view. Text outside `<<...>>` annotations is not rendered under
`results` / `result_lines`; a CoT with no annotation at all is an error.

`step_views` is what the codebook renders under `codebook.render_unit=step`: one text a canvas, each step of
`text.steps.split_steps` under the view (under `results` / `result_lines`, the steps that hold a calculator
step; the others show nothing and are left out).
"""

from __future__ import annotations

import re

from dlr_jax.config.stages import RENDER_VIEWS
from dlr_jax.text.steps import split_steps

__all__ = ["cot_view", "render_texts", "step_results", "step_views"]

# the `c` of a calculator annotation <<a+b=c>> (GSM8K-Aug and the synthetic task write them)
_STEP_RESULT = re.compile(r"=\s*([^<>=]+?)\s*>>")


def step_results(cot: str) -> list[str]:
    """Each calculator step's result, in order (empty when the CoT has no annotation)."""
    return _STEP_RESULT.findall(cot)


def cot_view(cot: str, view: str, *, example_id: str | None = None) -> str:
    """The text the codebook renders for `cot` under `view` (one of `RENDER_VIEWS`). A CoT without a
    calculator step is an error under `results` and `result_lines` (an empty image would say nothing), named by
    `example_id` when given."""
    if view == "cot":
        return cot
    if view not in RENDER_VIEWS:
        raise ValueError(f"codebook.render_view must be one of {RENDER_VIEWS}, got {view!r}")
    results = step_results(cot)
    if not results:
        who = f"example {example_id!r}: " if example_id is not None else ""
        raise ValueError(f"codebook.render_view={view}: {who}CoT {cot[:80]!r} has no calculator step <<a+b=c>>; "
                         f"this view needs annotated CoTs (synthetic, gsm8k_aug)")
    return ("\n" if view == "result_lines" else " ").join(results)


def step_views(cot: str, view: str, *, example_id: str | None = None) -> list[str]:
    """The texts the codebook renders for `cot` one step a canvas (`codebook.render_unit=step`), in order: each
    step of `split_steps(cot)` under `view`. Under `results` / `result_lines` a step without a calculator step is
    left out, and a CoT without any is the same error as `cot_view`'s."""
    steps = split_steps(cot)
    if view == "cot":
        return steps
    shown = [cot_view(s, view) for s in steps if step_results(s)]
    return shown or [cot_view(cot, view, example_id=example_id)]  # no step holds a result: cot_view's error


def render_texts(cot: str, view: str, unit: str, *, example_id: str | None = None) -> list[str]:
    """What the codebook renders for `cot`, one text a canvas: `[cot_view(...)]` (`codebook.render_unit=chain`,
    the paper) or `step_views(...)` (`step`; a blank CoT is one blank canvas, as a chain's is)."""
    if unit == "step" and cot.strip():
        return step_views(cot, view, example_id=example_id)
    return [cot_view(cot, view, example_id=example_id)]
