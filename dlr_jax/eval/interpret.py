"""Interpretability report: what the latent tokens say, decoded back to text by the OCR decoder.

    python -m dlr_jax.interpret --workdir W --benchmark gsm8k --n 20 --html report.html
    python -m dlr_jax.interpret --workdir W --question "Tom has 3 apples ..." --html one.html

For each question: the gold chain of thought rendered as the codebook stage renders it (the image the
encoder compresses), the latent ids the model generated (greedy, with the workdir's `eval.decoding` and
`eval.answer_fallback`, as `dlr_jax.eval.evaluate` generates and scores them), the OCR decoder's text for
those ids, and the predicted and gold answers. The page is one standalone HTML file (images inlined as PNG
data, no network assets); the same rows go to a JSONL file beside it (images left out).

When the codebook renders one step a canvas (`codebook.render_unit=step`), each row also shows the gold CoT's
steps in order: each step's image, its codes (the step's canvas encoded as the export stage encodes it) and the
OCR decoder's reading of those codes; when every step has the same number of codes (codebook.min_side =
max_side) the generated latents are read back step by step too.

The OCR decoder is stage sft's dual-branch decoder when sft trained one, else the codebook stage's
(`dlr_jax.stages.codebook.models.load_decoder`); on a DeepSeek-OCR-2 codebook that is the fine-tuned OCR-2
decoder, decoding with its KV cache. A `--question` has no gold: its row shows no gold
image or answer and no correctness.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlr_jax.core.files import MissingStageError
from dlr_jax.data.cot_view import cot_view, step_results
from dlr_jax.data.latents import cut_steps, fixed_step_codes
from dlr_jax.data.records import Example
from dlr_jax.run.workdir import final_dir

GOLDLESS = "custom"


def default_stage(workdir: str | Path) -> str:
    """The latest trained latent stage of a workdir: rl, else sft."""
    for stage in ("rl", "sft", "align"):
        if final_dir(workdir, stage).exists():
            return stage
    raise MissingStageError(f"{workdir}: no finished latent stage (rl, sft or align); run `python -m dlr_jax.train "
                            f"--stage align --workdir {workdir}` (after textsft) first")


def _png_data_uri(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def build_rows(workdir: str | Path, *, stage: str | None = None, benchmark: str = "gsm8k", n: int = 20,
               questions: Sequence[str] = (), max_latents: int | None = None,
               data_dir: str | Path | None = None, decoding: str | None = None) -> list[dict[str, Any]]:
    """One dict per question: id, question, gold_cot, gold_answer, gold_image (data URI or None),
    latent_codes, decoded_cot, prediction, answer, correct (None without a gold), n_latents.
    decoding: dynamic | constrained (None: the workdir's eval.decoding); constrained opens a latent span for every
    question, which shows what the codebook reads even from a model that has not learnt to open one itself."""
    from dlr_jax.data.readers import SYNTHETIC_FAMILY
    from dlr_jax.data.render_pipeline import render_config
    from dlr_jax.data.sources import load_examples
    from dlr_jax.eval.evaluate import default_loader, evaluate_examples
    from dlr_jax.run.handoff import load_stage_model
    from dlr_jax.stages.codebook.models import check_render_view, load_decoder
    from dlr_jax.text import render

    stage = stage or default_stage(workdir)
    model, tok, cfg = load_stage_model(workdir, stage)
    decoder = load_decoder(workdir)  # before generating: a missing or other-view codebook stops here
    check_render_view(cfg, workdir)
    if questions:
        # No gold: any number scores the generation, and the row drops the score below.
        examples = [Example(id=f"{GOLDLESS}/{i}", question=q, cot="", answer="0", source=GOLDLESS)
                    for i, q in enumerate(questions)]
        scored_as = "synthetic"
    else:
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")
        if benchmark in SYNTHETIC_FAMILY and cfg.data.dataset == "synthetic" and data_dir is None:
            examples = load_examples(cfg, cfg.data.eval_split, benchmark)
        else:
            examples = default_loader(data_dir)(benchmark, None)
        examples, scored_as = examples[:n], benchmark
    ev = cfg.eval
    res = evaluate_examples(
        model, tok, examples, scored_as, mode="latent", max_new_tokens=ev.max_new_tokens,
        max_latents=max_latents or ev.max_latents, batch_size=min(ev.batch_size, len(examples)),
        prompt_bucket=cfg.sampling.prompt_bucket, unstack_layers=cfg.sampling.unstack,
        constrain_format=(decoding or ev.decoding) == "constrained", answer_fallback=ev.answer_fallback,
    )
    decoded = decoder.decode([s["latent_codes"] for s in res.samples])
    rcfg, view = render_config(cfg.codebook), cfg.codebook.render_view
    by_step = cfg.codebook.render_unit == "step"
    gold_steps = step_panels(cfg, workdir, examples, decoder) if by_step else [None] * len(examples)
    read_steps = (latent_steps([s["latent_codes"] for s in res.samples], cfg.codebook, decoder) if by_step
                  else [None] * len(examples))
    rows = []
    for ex, s, text, steps, read in zip(examples, res.samples, decoded, gold_steps, read_steps, strict=True):
        gold = ex.source != GOLDLESS
        image = None
        # the image the codebook renders (a CoT without calculator steps has none under the results views)
        if gold and ex.cot and (view == "cot" or step_results(ex.cot)):
            rendered = cot_view(ex.cot, view)
            image = _png_data_uri(render.render_cot(rendered, font_size=round(rcfg.font_mean), config=rcfg)[0])
        rows.append({
            "id": ex.id, "question": ex.question, "gold_cot": ex.cot if gold else None,
            "gold_answer": ex.answer if gold else None, "gold_image": image,
            "latent_codes": [int(c) for c in s["latent_codes"]], "n_latents": int(s["n_latents"]),
            "decoded_cot": text, "prediction": s["prediction"], "answer": s["answer"],
            "correct": bool(s["correct"]) if gold else None, "steps": steps, "latent_steps": read,
        })
    return rows


def step_panels(cfg: Any, workdir: str | Path, examples: Sequence[Example], decoder: Any
                ) -> list[list[dict[str, Any]] | None]:
    """Per example (None without a gold CoT, or one with nothing to render under a results view): its steps as
    the codebook renders them (`cot_view.step_views`), each {text, image (PNG data URI), codes (the step's canvas
    encoded as the export stage encodes it), decoded (the OCR decoder's reading of those codes)}, in order."""
    from dlr_jax.data.cot_view import step_views
    from dlr_jax.data.render_pipeline import render_config
    from dlr_jax.stages.codebook.models import encode_ids, load_codebook_model
    from dlr_jax.text import render

    cb = cfg.codebook
    shown = [ex.source != GOLDLESS and ex.cot.strip() and (cb.render_view == "cot" or step_results(ex.cot))
             for ex in examples]
    texts = [step_views(ex.cot, cb.render_view, example_id=ex.id) if ok else [] for ex, ok in zip(examples, shown,
                                                                                                   strict=True)]
    flat = [t for ts in texts for t in ts]
    codes = encode_ids(load_codebook_model(workdir), flat, cb)[0] if flat else []
    read = decoder.decode(codes) if flat else []
    rcfg = render_config(cb)
    out: list[list[dict[str, Any]] | None] = []
    at = 0
    for ts in texts:
        out.append([{"text": t, "codes": [int(c) for c in codes[at + j]], "decoded": read[at + j],
                     "image": _png_data_uri(render.render_cot(t, font_size=round(rcfg.font_mean), config=rcfg)[0])}
                    for j, t in enumerate(ts)] or None)
        at += len(ts)
    return out


def latent_steps(codes: Sequence[Sequence[int]], cb: Any, decoder: Any) -> list[list[dict[str, Any]] | None]:
    """Generated latents read back one step at a time, [{codes, decoded}] per row, when every step has the same
    number of codes (codebook.min_side = max_side: (side / 64)^2); else None per row, as a run of codes whose
    canvases differ in size cannot be cut into steps."""
    per = fixed_step_codes(cb)
    if per is None:
        return [None] * len(codes)
    chunks = [cut_steps(z, per) for z in codes]
    read = iter(decoder.decode([c for cs in chunks for c in cs]))
    return [[{"codes": [int(k) for k in c], "decoded": next(read)} for c in cs] for cs in chunks]


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;background:#fafafa;color:#222}
h1{font-size:22px;margin:0 0 4px} .meta{color:#666;margin-bottom:18px;font-size:13px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:14px 16px;margin:0 0 16px;
display:grid;grid-template-columns:minmax(0,1fr) auto;gap:8px 20px}
.q{grid-column:1/3;font-weight:600} .label{color:#777;font-size:12px;text-transform:uppercase;margin-top:6px}
.codes span{display:inline-block;background:#e8eefc;border:1px solid #b8c8f0;border-radius:4px;
padding:1px 5px;margin:2px;font-family:ui-monospace,monospace;font-size:12px}
.decoded,.gold{font-family:ui-monospace,monospace;white-space:pre-wrap;background:#f4f4f4;padding:6px;border-radius:4px}
.ok{color:#137333;font-weight:600} .bad{color:#b3261e;font-weight:600} img{border:1px solid #ccc;max-width:320px}
.steps{grid-column:1/3;display:flex;flex-wrap:wrap;gap:10px} .stepcard{max-width:240px} .step{margin:2px 0}
"""


def render_html(rows: Sequence[dict[str, Any]], *, title: str, subtitle: str = "") -> str:
    esc = html.escape
    cards = []
    for r in rows:
        codes = "".join(f"<span>z{c}</span>" for c in r["latent_codes"]) or "<em>(no latents)</em>"
        if r["correct"] is None:
            verdict = f"predicted <b>{esc(str(r['answer']))}</b>"
        else:
            mark = '<span class="ok">✓ correct</span>' if r["correct"] else '<span class="bad">✗ wrong</span>'
            verdict = (f"predicted <b>{esc(str(r['answer']))}</b> · gold <b>{esc(str(r['gold_answer']))}</b> "
                       f"· {mark}")
        left = [f'<div class="label">latent ids ({r["n_latents"]})</div><div class="codes">{codes}</div>',
                f'<div class="label">OCR decoder reads them as</div><div class="decoded">{esc(r["decoded_cot"])}</div>']
        if r.get("latent_steps"):  # a step codebook with a fixed number of codes a step: read one step at a time
            left.append('<div class="label">read step by step</div>' + "".join(
                f'<div class="step"><span class="codes">{_code_spans(st["codes"])}</span> '
                f'<span class="decoded">{esc(st["decoded"])}</span></div>' for st in r["latent_steps"]))
        if r["gold_cot"]:
            left.append(f'<div class="label">gold chain of thought</div><div class="gold">{esc(r["gold_cot"])}</div>')
        left.append(f'<div class="label">answer</div><div>{verdict}</div>')
        shown = "gold CoT as the codebook renders it"  # the whole chain, or its results (codebook.render_view)
        right = (f'<div class="label">{shown}</div><img alt="{shown}" src="{r["gold_image"]}">'
                 if r["gold_image"] else "")
        cards.append(f'<div class="card" id="{esc(r["id"])}"><div class="q">{esc(r["question"])}</div>'
                     f'<div>{"".join(left)}</div><div>{right}</div>{_steps_html(r.get("steps"))}</div>')
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title><style>{_CSS}</style>'
            f'</head><body><h1>{esc(title)}</h1><div class="meta">{esc(subtitle)}</div>{"".join(cards)}</body></html>')


def _code_spans(codes: Sequence[int]) -> str:
    return "".join(f"<span>z{c}</span>" for c in codes)


def _steps_html(steps: Sequence[dict[str, Any]] | None) -> str:
    """The gold CoT one step a canvas (codebook.render_unit=step): each step's image, codes and their reading."""
    if not steps:
        return ""
    esc = html.escape
    items = "".join(
        f'<div class="stepcard"><div class="label">step {i + 1}</div><img alt="step {i + 1}" src="{st["image"]}">'
        f'<div class="codes">{_code_spans(st["codes"])}</div><div class="decoded">{esc(st["decoded"])}</div>'
        f'<div class="gold">{esc(st["text"])}</div></div>' for i, st in enumerate(steps))
    return (f'<div class="steps"><div class="label">gold CoT one step a canvas: image, codes, OCR reading, text'
            f'</div>{items}</div>')


def write_report(rows: Sequence[dict[str, Any]], html_path: str | Path, *, title: str, subtitle: str = "",
                 jsonl_path: str | Path | None = None) -> tuple[Path, Path]:
    html_path = Path(html_path)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(rows, title=title, subtitle=subtitle), encoding="utf-8")
    jsonl_path = Path(jsonl_path) if jsonl_path else html_path.with_suffix(".jsonl")
    with open(jsonl_path, "w", encoding="utf-8") as f:
        for r in rows:
            row = {k: v for k, v in r.items() if k != "gold_image"}
            if row.get("steps"):  # images stay in the page only
                row["steps"] = [{k: v for k, v in st.items() if k != "image"} for st in row["steps"]]
            f.write(json.dumps(row) + "\n")
    return html_path, jsonl_path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlr_jax.interpret", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="a trained workdir (codebook + a latent stage)")
    p.add_argument("--stage", help="rl, sft or align (default: the latest finished)")
    p.add_argument("--benchmark", default="gsm8k", help="benchmark whose first --n questions are shown")
    p.add_argument("--n", type=int, default=20, help="questions from the benchmark (default 20)")
    p.add_argument("--question", action="append", default=[], help="your own question (repeatable; replaces "
                   "the benchmark questions)")
    p.add_argument("--max-latents", type=int, help="latent cap (default: eval.max_latents)")
    p.add_argument("--decoding", choices=("dynamic", "constrained"),
                   help="default: the workdir's eval.decoding; constrained always opens a latent span")
    p.add_argument("--data-dir",
                   help="data root (default: $DLR_DATA_DIR, else the checkout's ../shared/data, else its data/)")
    p.add_argument("--html", required=True, help="the standalone HTML file to write")
    p.add_argument("--jsonl", help="the rows as JSONL (default: the --html path with .jsonl)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    stage = a.stage or default_stage(a.workdir)
    rows = build_rows(a.workdir, stage=stage, benchmark=a.benchmark, n=a.n, questions=a.question,
                      max_latents=a.max_latents, data_dir=a.data_dir, decoding=a.decoding)
    what = f"{len(rows)} custom question(s)" if a.question else f"first {len(rows)} {a.benchmark} questions"
    scored = [r["correct"] for r in rows if r["correct"] is not None]
    acc = f"; {sum(scored)}/{len(scored)} correct" if scored else ""
    h, j = write_report(rows, a.html, jsonl_path=a.jsonl, title=f"Latent reasoning, decoded: {a.workdir} ({stage})",
                        subtitle=f"{what}{acc}; latents decoded by the OCR decoder")
    print(f"wrote {h} and {j} ({what}{acc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
