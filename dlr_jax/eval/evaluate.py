"""Evaluation: Pass@1 and #L on the benchmarks, as mean ± std over seeds.

    python -m dlr_jax.evaluate --workdir W --stage sft --benchmarks gsm8k,multiarith --seeds 5

Decoding (one `dlr_jax.generate.sampler.Sampler` per model, prompts exactly `formats.prompt_ids`). Which
reading of the paper each setting is (`EvalConfig`, dlr_jax/config/stages.py; configs/paper/gsm8k.yaml):

* `eval.temperature` 0 (the paper's reading, default): greedy. The paper gives a temperature for its RL
  rollouts only (T = 1.0) and calls its evaluation greedy; > 0 samples (an option).
* `latent` mode, `eval.decoding: dynamic` (the paper's "dynamic decoding", default): the model writes
  `<latent> z_1 .. z_n </latent>`, closes the span itself and goes on in text, nothing else forced
  (it may write text before `<answer>`, or no answer span at all); a logits processor only forces
  `</latent>` once `max_latents` latents are out of the first span (a cap against runaways).
  `force_latents=n` is the paper's "forced early stop after n latents": `</latent>` is forced right after
  the n-th latent (a model that closes earlier keeps its own, shorter span).
  `eval.decoding: constrained` (ours, an option; `constrain_format=True` here) adds a grammar: the first
  token is `<latent>`, inside the span only latent ids or `</latent>` may follow, after it latent ids and
  a second `<latent>`/`</latent>` are banned, `</answer>` needs an open `<answer>`, and `<eos>` is
  banned until `</answer>`; every generation that completes its answer span is format-valid
  (`rewards.format_reward` = 1).
* `cot` / `direct` (text SFT baselines): plain decoding; `constrained` masks latent ids and the
  latent boundaries out of the softmax.
* Decoding stops at `</answer>` or `<eos>` (the first complete answer span is the answer) or after
  `max_new_tokens`. The answer is read from the `<answer>` span of the decoded generation (latent ids left
  out) and scored by `rewards.is_correct`, as the RL answer reward scores it. `eval.answer_fallback: off`
  (the paper's reading, default): a generation without a span has no answer. `last_number` (an option):
  `rewards.extract_answer`'s fallbacks, the RL answer reward's rule; `answer_fallback_fired` counts them.

Batching: prompts are sorted by length and cut into batches of `batch_size` (the last one padded
with repeats of its last prompt), prompt blocks are left-padded to a multiple of `prompt_bucket`:
compiled shapes are reused across batches (one prefill + one decode variant per bucket).

Seeds and statistics. Pass@1 = accuracy of one generation per problem (a fraction in [0, 1];
tables print %). #L = the reasoning length as the paper counts it: the latent tokens of the first latent
span per problem in latent mode (boundary tokens not counted; also reported as `n_latents`; latent ids
written elsewhere are `latents_outside`), generated CoT tokens before `<answer>` in cot mode, 0 in direct
mode.
Each seed is one full pass; a metric is reported as mean and std over the per-seed values
(population std, ddof=0) plus the per-seed list. With temperature > 0 seed s samples with PRNG seed
s. Greedy decoding does not depend on the seed, so greedy evaluation runs once, records
`greedy_single_run: true`, and its std is 0: the paper's 5-seed spread for greedy decoding comes
from training seeds (evaluate each run's workdir, then `--aggregate W1 W2 ...`), or from sampling.

MultiArith: the full 600 problems, and also the 180-problem test split of Ho et al.
(`load_benchmark("multiarith", split="test")`) reported as the subset `test_180`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from dlr_jax.config import Config, ConfigError, EvalConfig, apply_overrides, load_config, to_dict
from dlr_jax.config.stages import ANSWER_FALLBACKS
from dlr_jax.core.files import atomic_path, write_text_atomic
from dlr_jax.core.machine import git_commit
from dlr_jax.core.sharding import mesh_from_config
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.readers import SYNTHETIC_FAMILY
from dlr_jax.data.records import DataFormatError, Example
from dlr_jax.data.sources import load_examples
from dlr_jax.eval.scoring import format_ok, score_one
from dlr_jax.eval.stats import STD_NOTE, length_sorted_batches, mean_std, summarise
from dlr_jax.generate.latent_grammar import eval_vocab_mask, latent_phase_processor, latent_processor_aux
from dlr_jax.generate.sampler import Sampler
from dlr_jax.rewards.answer_format import KNOWN_BENCHMARKS
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.run.workdir import stage_dir, workdir_config
from dlr_jax.text.tokens import Tokenizer

MODES = ("latent", "cot", "direct")
STAGE_MODES = {"textsft_cot": "cot", "textsft_direct": "direct", "textsft_direct_from_cot": "direct",
               "textsft": "cot"}  # others: latent
MULTIARITH_SUBSET = "test_180"


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """metrics: see `summarise`; samples: one dict per (seed, example), in example order per seed."""

    metrics: dict[str, Any]
    samples: list[dict[str, Any]]


# ----------------------------------------------------------------------------------------------
# One benchmark.


def evaluate_examples(
    model: Any,
    tok: Tokenizer,
    examples: Sequence[Example],
    benchmark: str,
    *,
    mode: str = "latent",
    seeds: int = 1,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    max_latents: int = 32,
    force_latents: int | None = None,
    batch_size: int = 64,
    mesh: Mesh | None = None,
    rules: Mapping | str = "fsdp",
    constrain_format: bool = True,
    answer_fallback: str = "off",
    prompt_bucket: int = 64,
    unstack_layers: bool | None = None,
    sampler: Sampler | None = None,
    subsets: Mapping[str, Collection[str]] | None = None,
    latent_prefix: Mapping[str, Sequence[int]] | None = None,
    progress: bool = False,
) -> EvalResult:
    """Generates one answer per example and seed and scores it (see the module docstring).

    model: an NNX module with the sampler interface (ignored when `sampler` is given — pass one to
    share compiled functions across benchmarks). benchmark: scoring rule for `rewards.is_correct`.
    force_latents: n -> `</latent>` forced after n latents (replaces the `max_latents` cap).
    constrain_format: the grammar (`eval.decoding: constrained`). This low-level default stays True (what the
    latent probe and the latent-cost benchmark measure); `evaluate`, `run_benchmarks` and the interpretability
    report take `eval.decoding` (dynamic, the paper's, by default). answer_fallback: `eval.answer_fallback`.
    subsets: name -> example ids; each gets its own metrics under `metrics["subsets"][name]`.
    latent_prefix: example id -> code indices (latent mode only): the prompt ends with the given span
    `<latent> z.. </latent>` and the model writes only the answer (with `constrain_format`, latent ids and
    boundaries masked out); #L counts the given codes; `force_latents` does not apply (an error).
    `dlr_jax.eval.latent_probe` uses it to ask how well the answer reads
    the latents (gold vs shuffled spans), apart from how well the model predicts them.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if benchmark.lower() not in KNOWN_BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(KNOWN_BENCHMARKS)}")
    if not examples:
        raise ValueError(f"{benchmark}: no examples to evaluate")
    if seeds < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"need seeds, batch_size, max_new_tokens >= 1; "
                         f"got {seeds}, {batch_size}, {max_new_tokens}")
    if force_latents is not None and force_latents < 0:
        raise ValueError(f"force_latents must be >= 0, got {force_latents}")
    if answer_fallback not in ANSWER_FALLBACKS:
        raise ValueError(f"answer_fallback must be one of {ANSWER_FALLBACKS}, got {answer_fallback!r}")
    if latent_prefix is not None:
        if mode != "latent":
            raise ValueError(f"latent_prefix needs mode 'latent', got {mode!r}")
        if force_latents is not None:
            raise ValueError("latent_prefix gives the latent span: force_latents cannot apply to it")
        missing = [ex.id for ex in examples if ex.id not in latent_prefix]
        if missing:
            raise ValueError(f"latent_prefix has no codes for {len(missing)} examples, e.g. {missing[:3]}")
    sampler = sampler or Sampler(model, mesh=mesh, rules=rules, prompt_bucket=prompt_bucket,
                                 unstack_layers=unstack_layers)
    vocab = sampler._vocab_size()
    processor, aux = None, None
    if mode == "latent" and latent_prefix is None:
        if tok.num_latents < 1 or vocab < tok.latent_offset + tok.num_latents:
            raise ValueError(
                f"latent mode needs a model with the {tok.num_latents} latent rows after id "
                f"{tok.latent_offset}; "
                f"this model has {vocab} output rows (a text-only stage? use --mode cot or direct)"
            )
        limit = max_latents if force_latents is None else force_latents
        if max_new_tokens < limit + 5:
            raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for an answer after {limit} "
                             f"latents: need >= {limit + 5} (<latent> z.. </latent> <answer> a </answer>)")
        processor = latent_phase_processor
        aux = latent_processor_aux(tok, limit=limit, constrain=constrain_format)
    # a given span is closed: what follows is the answer, as in direct mode
    vocab_mask = eval_vocab_mask(tok, vocab, "direct" if latent_prefix is not None else mode, constrain_format)
    stop_ids = [tok.answer_end_id, tok.eos_id]

    prompts = [prompt_ids(tok, ex.question) for ex in examples]
    if latent_prefix is not None:
        prompts = [p + [tok.latent_start_id, *tok.latent_ids(latent_prefix[ex.id]), tok.latent_end_id]
                   for p, ex in zip(prompts, examples, strict=True)]
    batches = length_sorted_batches([len(p) for p in prompts], min(batch_size, len(prompts)))
    greedy = temperature == 0.0
    run_seeds = [0] if greedy else list(range(seeds))
    samples: list[dict[str, Any]] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(run_seeds) * len(batches), desc=benchmark, unit="batch",
               disable=not progress or jax.process_index() != 0)
    batch_seconds: list[list[float]] = []
    compiled: list[list[bool]] = []  # batches whose generate call compiled (a new prompt bucket): not "warm"
    for seed in run_seeds:
        rows: dict[int, dict[str, Any]] = {}
        batch_seconds.append([])
        compiled.append([])
        for b, idx in enumerate(batches):
            variants = sampler.cache_size()
            t0 = time.perf_counter()  # generate returns host arrays: the clock stops after the device work
            out = sampler.generate(
                [prompts[i] for i in idx], max_new_tokens=max_new_tokens, temperature=temperature,
                top_k=top_k, top_p=top_p, stop_ids=stop_ids,
                rng=None if temperature == 0.0 else jax.random.fold_in(jax.random.key(seed), b),  # greedy: unused
                pad_id=tok.pad_id, logits_processor=processor, processor_aux=aux, vocab_mask=vocab_mask,
            )
            seconds = time.perf_counter() - t0
            batch_seconds[-1].append(seconds)
            compiled[-1].append(sampler.cache_size() != variants)
            real = len(set(idx.tolist()))  # the padding repeats cost time too: it is charged to the real rows
            for r, i in enumerate(idx.tolist()):
                if i not in rows:  # repeats padding the last batch come after the real row
                    gen = out.tokens[r, : out.lengths[r]]
                    rows[i] = score_one(tok, examples[i], benchmark, gen, bool(out.finished[r]), seed, mode,
                                        answer_fallback=answer_fallback)
                    if latent_prefix is not None:
                        given = [int(c) for c in latent_prefix[examples[i].id]]
                        span = np.asarray(prompts[i][-len(given) - 2:], gen.dtype)  # the grammar reads the whole output
                        rows[i].update(n_latents=len(given), L=len(given), latent_codes=given, latents_given=True,
                                       format_ok=format_ok(tok, np.concatenate([span, gen])))
                    rows[i]["wall_s"] = seconds / real
            bar.update(1)
        samples += [rows[i] for i in range(len(examples))]
    bar.close()

    metrics = {"benchmark": benchmark, "mode": mode, **summarise(samples, run_seeds), "seeds": run_seeds,
               "seeds_requested": seeds, "greedy_single_run": greedy, "temperature": temperature,
               "force_latents": force_latents, "max_latents": max_latents if mode == "latent" else None,
               "constrain_format": constrain_format, "decoding": "constrained" if constrain_format else "dynamic",
               "answer_fallback": answer_fallback,
               "answer_fallback_fired": sum(bool(s["answer_fallback"]) for s in samples),  # over every seed
               "latents_given": latent_prefix is not None, "std": STD_NOTE,
               "timing": {"batch_seconds": batch_seconds, "batch_rows": [len(set(i.tolist())) for i in batches],
                          "batch_compiled": compiled,
                          "note": "generation wall seconds per batch and seed (sampling + host transfer, not "
                          "scoring); batch_compiled: the call compiled a new shape (prompt bucket); "
                          "wall_s_per_question includes those batches, warm_wall_s_per_question only counts "
                          "the others"}}
    rows_of = metrics["timing"]["batch_rows"]
    warm = [[(t, r) for t, r, c in zip(ts, rows_of, cs, strict=True) if not c]
            for ts, cs in zip(batch_seconds, compiled, strict=True)]
    if all(warm):
        metrics["warm_wall_s_per_question"] = mean_std([sum(t for t, _ in w) / sum(r for _, r in w) for w in warm])
    if subsets:
        metrics["subsets"] = {}
        for name, ids in subsets.items():
            ids = set(ids)
            chosen = [s for s in samples if s["id"] in ids]
            if chosen:
                metrics["subsets"][name] = summarise(chosen, run_seeds)
    return EvalResult(metrics=metrics, samples=samples)


# ----------------------------------------------------------------------------------------------
# Several benchmarks, files, table.

Loader = Callable[[str, str | None], list[Example]]


def parse_benchmark(spec: str) -> tuple[str, str | None]:
    """`"gsm8k"` -> ("gsm8k", None); `"gsm8k_aug:valid"` -> ("gsm8k_aug", "valid")."""
    name, _, split = spec.strip().partition(":")
    return name, (split or None)


def default_loader(data_dir: str | Path | None = None) -> Loader:
    """`load_benchmark` with `data_dir` as the data root (None: `$DLR_DATA_DIR` / shared data)."""
    from dlr_jax.data.readers import BENCHMARKS, load_benchmark

    def load(name: str, split: str | None) -> list[Example]:
        path = None
        if data_dir is not None and name in BENCHMARKS:
            spec = BENCHMARKS[name]
            sub = Path(data_dir) / spec.subdir
            # a missing folder: the file expected in it, which the error then names
            path = sub if sub.exists() else sub / spec.files.get(split or spec.default_split, "")
        elif data_dir is not None and (Path(data_dir) / name).exists():  # synthetic data written to the root
            path = Path(data_dir) / name
        return load_benchmark(name, path=path, split=split)

    return load


def run_benchmarks(
    model: Any,
    tok: Tokenizer,
    eval_cfg: EvalConfig,
    *,
    mode: str = "latent",
    force_latents: int | None = None,
    prompt_bucket: int = 64,
    unstack_layers: bool | None = None,
    mesh: Mesh | None = None,
    rules: Mapping | str = "fsdp",
    loader: Loader | None = None,
    out_dir: str | Path | None = None,
    tag: str = "",
    record: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluates `eval_cfg.benchmarks` (each `name[:split]`) with one shared Sampler; writes
    `<out_dir>/results[_tag].json` and `samples[_tag].jsonl` when `out_dir` is given (results.json names the samples
    file's SHA-256 under `samples_file`: `samples_match`); returns the results dict. `record`: extra fields for
    results.json (workdir, stage, config). Decoding, temperature and answer reading: `eval_cfg` (the module
    docstring says which reading of the paper each is)."""
    loader = loader or default_loader()
    constrain_format = eval_cfg.decoding == "constrained"
    sampler = Sampler(model, mesh=mesh, rules=rules, prompt_bucket=prompt_bucket, unstack_layers=unstack_layers)
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "git_commit": git_commit(),
        **dict(record or {}), "mode": mode,
        "eval": {**to_dict(eval_cfg), "force_latents": force_latents, "constrain_format": constrain_format,
                 "prompt_bucket": prompt_bucket},
        "notes": [STD_NOTE, "pass_at_1 is a fraction in [0, 1]; n_latents counts the latents of the first latent span",
                  "greedy decoding runs once (seeds would be identical)" if eval_cfg.temperature == 0 else
                  f"temperature {eval_cfg.temperature}: seed s samples with PRNG seed s"]
        + [f"decoding {eval_cfg.decoding}: " + ("a grammar forces the latent/answer format (ours; see "
                                                "dlr_jax/eval/evaluate.py)" if constrain_format else
                                                "the model closes its latent span and writes its answer itself "
                                                "(the paper's dynamic decoding)"),
           "answers read from the <answer> span only" if eval_cfg.answer_fallback == "off" else
           f"answer fallback {eval_cfg.answer_fallback}: without an <answer> span the answer is "
           "rewards.extract_answer's (answer_fallback_fired counts them)"],
        "benchmarks": {},
    }
    all_samples: list[dict[str, Any]] = []
    # Every benchmark is read before the first is evaluated: a bad name or file later in the list then stops
    # the run before any generation, not after the earlier benchmarks' results were computed and lost.
    unknown = [spec for spec in eval_cfg.benchmarks if parse_benchmark(spec)[0].lower() not in KNOWN_BENCHMARKS]
    if unknown:
        raise ConfigError(f"eval.benchmarks: unknown benchmark(s) {', '.join(unknown)}; known: "
                          f"{', '.join(KNOWN_BENCHMARKS)} (each optionally name:split)")
    loaded = []
    for spec in eval_cfg.benchmarks:
        name, split = parse_benchmark(spec)
        examples = loader(name, split)
        if eval_cfg.limit:
            examples = examples[: eval_cfg.limit]
        subsets = None
        if name == "multiarith" and split in (None, "all"):
            try:
                subsets = {MULTIARITH_SUBSET: [ex.id for ex in loader(name, "test")]}
            except DataFormatError as e:  # a copy other than the 600-problem file: it has no test split
                results["notes"].append(f"{spec}: no {MULTIARITH_SUBSET} subset ({e})")
                print(f"note: {spec}: no {MULTIARITH_SUBSET} subset, the whole file is scored ({e})",
                      file=sys.stderr, flush=True)
        loaded.append((spec, name, examples, subsets))
    for spec, name, examples, subsets in loaded:
        res = evaluate_examples(
            None, tok, examples, name, mode=mode, seeds=eval_cfg.seeds, temperature=eval_cfg.temperature,
            max_new_tokens=eval_cfg.max_new_tokens, max_latents=eval_cfg.max_latents,
            force_latents=force_latents, batch_size=eval_cfg.batch_size, constrain_format=constrain_format,
            answer_fallback=eval_cfg.answer_fallback, sampler=sampler, subsets=subsets, progress=progress,
        )
        results["benchmarks"][spec] = res.metrics
        all_samples += [{"benchmark": spec, **s} for s in res.samples]
    if out_dir is not None and jax.process_index() == 0:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        suffix = f"_{tag}" if tag else ""
        # The samples first: results.json is what marks an evaluation done (the experiments runner). It names the
        # samples file's hash, so a reader can tell a pair from two runs (a kill between the two renames):
        # samples_match.
        digest = hashlib.sha256()
        with atomic_path(out / f"samples{suffix}.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            for s in all_samples:
                line = json.dumps(s) + "\n"
                digest.update(line.encode("utf-8"))
                f.write(line)
        results["samples_file"] = {"name": f"samples{suffix}.jsonl", "sha256": digest.hexdigest(),
                                   "rows": len(all_samples)}
        write_text_atomic(out / f"results{suffix}.json", json.dumps(results, indent=2) + "\n")
    return results


def samples_match(results_file: str | Path) -> bool:
    """Whether the samples file that `results_file` names is the one written with it (same SHA-256): False for a
    samples file of another run, a missing one, or results written before they named one."""
    results_file = Path(results_file)
    named = json.loads(results_file.read_text()).get("samples_file")
    if not named:
        return False
    f = results_file.with_name(named["name"])
    if not f.is_file():
        return False
    digest = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == named["sha256"]


# ----------------------------------------------------------------------------------------------
# Workdir entry point and CLI.


def default_mode(stage: str) -> str:
    return STAGE_MODES.get(stage, "latent")


def model_mesh(model: Any) -> Mesh | None:
    """The mesh a loaded model's params live on (None on one device): the sampler shards onto it."""
    from flax import nnx

    for leaf in jax.tree.leaves(nnx.state(model)):
        sh = getattr(leaf, "sharding", None)
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
    return None


def evaluate(
    workdir: str | Path,
    stage: str,
    *,
    benchmarks: Sequence[str] | None = None,
    seeds: int | None = None,
    limit: int | None = None,
    max_latents: int | None = None,
    force_latents: int | None = None,
    mode: str | None = None,
    decoding: str | None = None,
    answer_fallback: str | None = None,
    temperature: float | None = None,
    data_dir: str | Path | None = None,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    tag: str = "",
    progress: bool = True,
) -> dict[str, Any]:
    """Loads `<workdir>/<stage>` (`handoff.load_stage_model`), evaluates, writes
    `<workdir>/<stage>/eval/results.json` + `samples.jsonl`. Settings: the workdir's config, then
    the `eval`/`sampling` sections of `config`, then `overrides` (`eval.batch_size=16`), then the
    keyword arguments that are not None (`decoding`, `answer_fallback`, `temperature`: `EvalConfig`'s)."""
    mesh = None
    if any(o.strip().startswith("mesh.") for o in overrides):
        mesh = mesh_from_config(apply_overrides(workdir_config(workdir), overrides).mesh)
    model, tok, cfg = load_stage_model(workdir, stage, mesh=mesh)
    cfg = _eval_settings(cfg, config, overrides)
    ev = cfg.eval
    given = {"benchmarks": None if benchmarks is None else tuple(benchmarks), "seeds": seeds, "limit": limit,
             "max_latents": max_latents, "decoding": decoding, "answer_fallback": answer_fallback,
             "temperature": temperature}
    ev = dataclasses.replace(ev, **{k: v for k, v in given.items() if v is not None})  # EvalConfig checks them
    mode = mode or default_mode(stage)
    base_loader = default_loader(data_dir)

    def loader(name: str, split: str | None) -> list[Example]:
        if name in SYNTHETIC_FAMILY and cfg.data.dataset == "synthetic" and data_dir is None:
            return load_examples(cfg, split or cfg.data.eval_split, name)  # the generator training used
        return base_loader(name, split)

    results = run_benchmarks(
        model, tok, ev, mode=mode, force_latents=force_latents, prompt_bucket=cfg.sampling.prompt_bucket,
        unstack_layers=cfg.sampling.unstack, mesh=mesh or model_mesh(model), rules=cfg.mesh.rules, loader=loader,
        out_dir=stage_dir(workdir, stage) / "eval", tag=tag,
        record={"workdir": str(workdir), "stage": stage, "config": to_dict(cfg)}, progress=progress,
    )
    return results


def _eval_settings(cfg: Config, config: str | Path | None, overrides: Sequence[str]) -> Config:
    if config is not None:
        other = load_config(config)
        cfg = dataclasses.replace(cfg, eval=other.eval, sampling=other.sampling)
    return apply_overrides(cfg, overrides)
