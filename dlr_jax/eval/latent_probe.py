"""Latent probe: does the answer read the latents, and does the model predict them?

    python -m dlr_jax.eval.latent_probe --workdir W --stage sft [--split test] [--limit 500]

DLR can only beat Direct-SFT if two things hold: the latent span carries what the answer needs, and
the model writes the right span for an unseen question. A Pass@1 number mixes them; this probe
separates them on the questions of one split and their gold codes (the export stage's
`W/latents/<split>.jsonl` for codebook latents; computed for `latent.source` random or step_results),
with the evaluation code (`dlr_jax.eval.evaluate.evaluate_examples`, greedy):

* `generated` — the model writes its own latents, then the answer (what `evaluate` reports);
* `gold` — the prompt ends with the question's own gold span `<latent> z.. </latent>` and the model
  writes only the answer: the most the latents can give this answer head;
* `shuffled` — the same, with another question's gold span (a random derangement): what the answer
  head gets from the question alone when the span says something else.

`gold - shuffled` is what the answer reads from the latents; `gold - generated` is what predicting
them loses. Latent match compares generated with gold codes per position and as whole spans, and
Pass@1 is split by whether the span matched. Two questions can share a gold span (short spans, few
codes): `shuffled_equals_gold` says how often the shuffled span is the question's own.
Writes `W/<stage>/eval/latent_probe_<split>.json`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

CONDITIONS = ("generated", "gold", "shuffled")


def derangement(n: int, seed: int) -> np.ndarray:
    """A permutation of range(n) with no fixed point (n >= 2): a random cycle through all indices."""
    if n < 2:
        raise ValueError(f"shuffling needs at least 2 examples, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    out = np.empty(n, np.int64)
    out[order] = np.roll(order, -1)  # each index takes the next one along the cycle
    return out


def latent_match(generated: Sequence[Sequence[int]], gold: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Exact-span rate, per-position match rate (over the gold length; a missing code is a miss) and
    the share of spans of the gold length."""
    if len(generated) != len(gold) or not gold:
        raise ValueError(f"need equally many generated and gold spans, got {len(generated)} and {len(gold)}")
    width = max(len(g) for g in gold)
    hits, counts = np.zeros(width), np.zeros(width)
    for g, z in zip(generated, gold, strict=True):
        for i, code in enumerate(z):
            counts[i] += 1
            hits[i] += i < len(g) and int(g[i]) == int(code)
    return {
        "exact_span": float(np.mean([list(map(int, g)) == list(map(int, z)) for g, z in zip(generated, gold,
                                                                                          strict=True)])),
        "per_position": [float(h / c) for h, c in zip(hits, counts, strict=True) if c],
        "same_length": float(np.mean([len(g) == len(z) for g, z in zip(generated, gold, strict=True)])),
    }


def probe_examples(model: Any, tok: Any, examples: Sequence[Any], gold: Mapping[str, Sequence[int]],
                   benchmark: str, *, seed: int = 0, batch_size: int = 64, max_new_tokens: int = 64,
                   max_latents: int = 32, prompt_bucket: int = 64, mesh: Any = None, rules: Any = "fsdp",
                   progress: bool = False, unstack_layers: bool | None = None) -> dict[str, Any]:
    """Runs the three conditions (module docstring) on `examples` with one Sampler; returns
    {"conditions": {name: {pass_at_1, n_latents, format_ok}}, "latent_match", "by_match", "samples"}."""
    from dlr_jax.eval.evaluate import evaluate_examples
    from dlr_jax.generate.sampler import Sampler

    examples = list(examples)
    perm = derangement(len(examples), seed)
    shuffled = {ex.id: gold[examples[j].id] for ex, j in zip(examples, perm, strict=True)}
    sampler = Sampler(model, mesh=mesh, rules=rules, prompt_bucket=prompt_bucket, unstack_layers=unstack_layers)
    kw = dict(mode="latent", batch_size=batch_size, max_new_tokens=max_new_tokens, max_latents=max_latents,
              sampler=sampler, progress=progress)
    runs = {
        "generated": evaluate_examples(None, tok, examples, benchmark, **kw),
        "gold": evaluate_examples(None, tok, examples, benchmark, latent_prefix=gold, **kw),
        "shuffled": evaluate_examples(None, tok, examples, benchmark, latent_prefix=shuffled, **kw),
    }
    conditions = {name: {k: r.metrics[k]["mean"] for k in ("pass_at_1", "n_latents", "format_ok")}
                  for name, r in runs.items()}
    own = runs["generated"].samples
    spans = [[int(c) for c in gold[ex.id]] for ex in examples]
    matched = [s["latent_codes"] == z for s, z in zip(own, spans, strict=True)]

    def acc(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {"n": len(rows), "pass_at_1": float(np.mean([r["correct"] for r in rows])) if rows else None}

    by_match = {}
    for name in ("generated", "gold"):
        rows = runs[name].samples
        by_match[name] = {"span_matched": acc([r for r, m in zip(rows, matched, strict=True) if m]),
                          "span_missed": acc([r for r, m in zip(rows, matched, strict=True) if not m])}
    samples = [{"id": ex.id, "gold": ex.answer, "codes": {"gold": z, "generated": own[i]["latent_codes"],
                                                       "shuffled": [int(c) for c in shuffled[ex.id]]},
                **{f"{k}_{name}": runs[name].samples[i][k] for name in CONDITIONS for k in ("answer", "correct")}}
               for i, (ex, z) in enumerate(zip(examples, spans, strict=True))]
    same = float(np.mean([list(map(int, shuffled[ex.id])) == z for ex, z in zip(examples, spans, strict=True)]))
    return {"n": len(examples), "conditions": conditions, "shuffled_equals_gold": same,
            "latent_match": latent_match([s["latent_codes"] for s in own], spans),
            "by_match": by_match, "shuffle_seed": seed, "samples": samples}


def format_probe(result: Mapping[str, Any]) -> str:
    c, m = result["conditions"], result["latent_match"]
    lines = [f"{'latents':<10} {'Pass@1 (%)':>10} {'#L':>6} {'format ok':>9}"]
    for name in CONDITIONS:
        lines.append(f"{name:<10} {100 * c[name]['pass_at_1']:>10.1f} {c[name]['n_latents']:>6.2f} "
                     f"{100 * c[name]['format_ok']:>8.1f}%")
    reads = 100 * (c["gold"]["pass_at_1"] - c["shuffled"]["pass_at_1"])
    lost = 100 * (c["gold"]["pass_at_1"] - c["generated"]["pass_at_1"])
    pos = ", ".join(f"{100 * p:.0f}" for p in m["per_position"])
    bm = result["by_match"]["generated"]
    hit, miss = bm["span_matched"], bm["span_missed"]
    lines += [
        f"the answer reads the latents: gold - shuffled = {reads:+.1f} points; predicting them costs "
        f"gold - generated = {lost:+.1f} points",
        f"generated vs gold codes (n = {result['n']}): whole span {100 * m['exact_span']:.1f}%, per position "
        f"[{pos}]%, same length {100 * m['same_length']:.1f}%; shuffled span = own gold span for "
        f"{100 * result['shuffled_equals_gold']:.1f}%",
        "Pass@1 of generated when its span matched gold: "
        + (f"{100 * hit['pass_at_1']:.1f}% (n = {hit['n']})" if hit["n"] else "no span matched")
        + (f"; when it did not: {100 * miss['pass_at_1']:.1f}% (n = {miss['n']})" if miss["n"] else ""),
    ]
    return "\n".join(lines)


def run(workdir: str | Path, stage: str = "sft", *, split: str | None = None, limit: int = 0, seed: int = 0,
        progress: bool = True) -> dict[str, Any]:
    """Loads `workdir`'s `stage` and the gold codes of `split` (default data.eval_split), probes,
    writes `<workdir>/<stage>/eval/latent_probe_<split>.json`."""
    from dlr_jax.data.sources import load_examples
    from dlr_jax.eval.evaluate import model_mesh
    from dlr_jax.rewards.answer_format import KNOWN_BENCHMARKS
    from dlr_jax.run.handoff import load_stage_model
    from dlr_jax.run.workdir import stage_dir
    from dlr_jax.stages.latent_common import latents_for

    model, tok, cfg = load_stage_model(workdir, stage)
    if tok.num_latents < 1:
        raise ValueError(f"{workdir}/{stage}: a text-only stage has no latents to probe (use sft, rl or align)")
    split = split or cfg.data.eval_split
    examples = load_examples(cfg, split)
    if limit:
        examples = examples[:limit]
    gold = latents_for(cfg, workdir, split, examples)
    benchmark = cfg.data.dataset if cfg.data.dataset in KNOWN_BENCHMARKS else "gsm8k"
    ev = cfg.eval
    result = probe_examples(model, tok, examples, {ex.id: gold[ex.id] for ex in examples}, benchmark, seed=seed,
                            batch_size=ev.batch_size, max_new_tokens=ev.max_new_tokens,
                            max_latents=ev.max_latents, prompt_bucket=cfg.sampling.prompt_bucket,
                            mesh=model_mesh(model), rules=cfg.mesh.rules, progress=progress,
                            unstack_layers=cfg.sampling.unstack)
    result = {"workdir": str(workdir), "stage": stage, "split": split, "latent_source": cfg.latent.source,
              "benchmark": benchmark, **result}
    out = stage_dir(workdir, stage) / "eval" / f"latent_probe_{split.replace(':', '-')}.json"  # math500:test
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    result["path"] = str(out)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dlr_jax.eval.latent_probe",
        description="Separate the two things DLR needs: does the answer read the latents (gold vs shuffled "
        "gold spans in the prompt), and does the model write them (its own span vs gold)? Greedy, the "
        "evaluation code, on the questions of one split with their gold codes.",
        epilog="Writes <workdir>/<stage>/eval/latent_probe_<split>.json (conditions, latent match, per-question "
        "answers and codes) and prints a table.",
    )
    p.add_argument("--workdir", required=True, help="a trained workdir with a latent stage (codebook latents: "
                   "also the export stage's latents/<split>.jsonl)")
    p.add_argument("--stage", default="sft", help="latent stage to probe: sft (default), rl or align")
    p.add_argument("--split", help="split with gold codes in <workdir>/latents/ (default: data.eval_split); "
                   "train shows what the model fit")
    p.add_argument("--limit", type=int, default=0, help="only the first N questions (0 = all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled spans' derangement")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    result = run(a.workdir, a.stage, split=a.split, limit=a.limit, seed=a.seed, progress=a.progress)
    print(f"latent probe of {a.workdir} stage {a.stage}, split {result['split']} "
          f"({result['latent_source']} latents; {result['n']} questions):")
    print(format_probe(result))
    print(f"written: {result['path']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
