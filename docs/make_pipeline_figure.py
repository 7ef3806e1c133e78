"""Draws docs/pipeline.png, README's figure: one chain of thought through DLR's stages.

    python docs/make_pipeline_figure.py                        # the committed figure
    python docs/make_pipeline_figure.py --from-report runs/demo/pipeline/report.jsonl --out my_run.png

Where each part of the figure comes from:
- the CoT: the third line of GSM8K-Aug's test file (public data, MIT; `dlr_jax.data.readers` reads the same
  file), quoted below;
- the image and N: `dlr_jax.text.render.render_cot` on that CoT at the mean font size (17 px), run here;
- the latent ids and the OCR-decoded text: no committed run artefact under results/ holds both for one CoT (the
  codebook reports keep decoded text without ids), so by default the figure draws the ids as z_1 .. z_N and says
  so. `--from-report FILE` takes the first row of an interpretability report's JSONL instead (`make demo` writes
  runs/demo/pipeline/report.jsonl; `python -m dlr_jax.interpret --html R.html` writes R.jsonl): its gold CoT,
  the latent ids the trained model generated and the OCR decoder's text for them.

Needs the project installed (`make venv`); matplotlib and Pillow come with it.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from dlr_jax.text.render import PATCH, render_cot  # noqa: E402

# GSM8K-Aug test set, line 3 (`question||<<steps>> #### answer`), verbatim.
QUESTION = ("Josh decides to try flipping a house.  He buys a house for $80,000 and then puts in $50,000 in "
            "repairs.  This increased the value of the house by 150%.  How much profit did he make?")
COT = "<<80000+50000=130000>> <<80000*1.5=120000>> <<120000+80000=200000>> <<200000-130000=70000>>"
ANSWER = "70000"
FONT_SIZE = 17  # the mean of the paper's font-size Gaussian (15-20 px)

OUT = Path(__file__).resolve().parent / "pipeline.png"


def _box(ax, x, y, w, h, title, body, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.008,rounding_size=0.015",
                                fc=color, ec="#444", lw=1.0, transform=ax.transAxes))
    ax.text(x + w / 2, y + h - 0.035, title, ha="center", va="top", fontsize=10.5, weight="bold",
            transform=ax.transAxes)
    ax.text(x + w / 2, y + h - 0.10, body, ha="center", va="top", fontsize=8.6, transform=ax.transAxes,
            family="DejaVu Sans Mono", linespacing=1.35)


def _arrow(ax, a, b, text=""):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, lw=1.3, color="#333",
                                 transform=ax.transAxes))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.03, text, ha="center", va="bottom", fontsize=8,
                color="#333", transform=ax.transAxes)


def draw(question: str, cot: str, answer: str, ids: list[int] | None, decoded: str | None, source: str,
         out: Path) -> int:
    image, n = render_cot(cot, font_size=FONT_SIZE)
    side = image.size[0]
    fig = plt.figure(figsize=(13.5, 5.4), dpi=110)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_axis_off()

    # 1. the text CoT
    wrapped_q = textwrap.fill(question, 44)
    wrapped_y = "\n".join(textwrap.wrap(cot, 30, break_on_hyphens=False))
    _box(ax, 0.012, 0.30, 0.205, 0.64, "question x, CoT y, answer a", "", "#f4f4f4")
    ax.text(0.022, 0.85, wrapped_q, ha="left", va="top", fontsize=7.6, transform=ax.transAxes)
    ax.text(0.022, 0.60, "y =\n" + wrapped_y, ha="left", va="top", fontsize=8, family="DejaVu Sans Mono",
            transform=ax.transAxes)
    ax.text(0.022, 0.36, f"answer a = {answer}", ha="left", va="top", fontsize=8.5, transform=ax.transAxes)

    # 2. the rendered image, its 64-px cells = the N visual tokens
    _arrow(ax, (0.222, 0.62), (0.262, 0.62), "render_cot")
    iax = fig.add_axes([0.268, 0.34, 0.16, 0.16 * 13.5 / 5.4])
    iax.imshow(np.asarray(image), interpolation="nearest")
    for k in range(PATCH, side, PATCH):
        iax.axhline(k - 0.5, color="#d33", lw=0.8, ls="--")
        iax.axvline(k - 0.5, color="#d33", lw=0.8, ls="--")
    iax.set_xticks([])
    iax.set_yticks([])
    ax.text(0.348, 0.29, f"{side} x {side} px at {FONT_SIZE} px type\n"
            f"N = ({side}/{PATCH})\u00b2 = {n} visual tokens", ha="center", va="top", fontsize=8.6,
            transform=ax.transAxes)

    # 3. encoder -> VQ -> ids; 4. the LM; 5. the OCR decoder reads the ids back
    _arrow(ax, (0.435, 0.62), (0.462, 0.62))
    _box(ax, 0.465, 0.50, 0.165, 0.44, "vision encoder",
         "SAM ViT-B patches\n-> 16x conv compressor\n-> causal flow over\n   [visual ; N queries]\n"
         f"-> h_1 .. h_{n}  (d_c each)", "#e8f0fb")
    _arrow(ax, (0.635, 0.72), (0.662, 0.72))
    id_text = " ".join(str(i) for i in ids) if ids is not None else " ".join(f"z_{i + 1}" for i in range(n))
    id_text = "\n".join(textwrap.wrap(id_text, 24))
    _box(ax, 0.665, 0.50, 0.15, 0.44, "VQ: nearest code",
         f"of K codes (10,000\nin the paper)\n\nlatent ids:\n{id_text}", "#fdf1dc")
    _arrow(ax, (0.82, 0.72), (0.847, 0.72))
    _box(ax, 0.85, 0.50, 0.14, 0.44, "LM (sft, rl)",
         "x <latent>\n  z_1 .. z_N\n</latent>\n<answer> a\n</answer>\n\none softmax over\ntext + K latent rows",
         "#e6f4e6")

    _arrow(ax, (0.74, 0.495), (0.74, 0.43), "")
    dec = "\n".join(textwrap.wrap(decoded, 60)[:3]) if decoded is not None else "(not shown: see the note below)"
    _box(ax, 0.50, 0.14, 0.48, 0.28, "OCR decoder: latent ids -> text",
         "trained with the encoder (codebook stage), again in sft's dual branch;\n"
         "rl's process reward reads generated latents through it\n\n" + dec, "#f4e9f7")

    ax.text(0.012, 0.085, source, ha="left", va="top", fontsize=8, color="#333", transform=ax.transAxes,
            wrap=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from-report", metavar="JSONL",
                   help="an interpretability report's rows (make demo: runs/demo/pipeline/report.jsonl)")
    p.add_argument("--row", type=int, default=0, help="which row of --from-report (default: the first)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.from_report:
        rows = [json.loads(ln) for ln in Path(a.from_report).read_text().splitlines() if ln.strip()]
        r = rows[a.row]
        source = (f"Ids and decoded text: row {a.row} of {a.from_report} (a trained run's generated latents, "
                  f"decoded by its OCR decoder); image re-rendered here with the default RenderConfig.")
        n = draw(r["question"], r["gold_cot"] or "", str(r["gold_answer"]), r["latent_codes"], r["decoded_cot"],
                 source, a.out)
    else:
        source = ("The CoT is GSM8K-Aug's test line 3; the image and N come from dlr_jax.text.render.render_cot. "
                  "No committed run artefact holds latent ids with their decoded text, so the ids are drawn as "
                  "z_1 .. z_N and no decoded text is shown.\nAfter `make demo`, "
                  "`python docs/make_pipeline_figure.py --from-report runs/demo/pipeline/report.jsonl "
                  "--out run.png` draws a trained run's real ids and OCR-decoded text.")
        n = draw(QUESTION, COT, ANSWER, None, None, source, a.out)
    print(f"wrote {a.out} (N = {n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
