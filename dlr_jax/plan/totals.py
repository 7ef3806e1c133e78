"""A stage's total compute for the recipe's data size, next to the paper's (`stage_total_flops`): in padded rows, and
for the stages whose rows are tokens (textsft, align, sft: `PACKED_STAGES`) in packed rows from the data's measured
lengths (`packed_totals`; sft's dual branch counts its packed step, S OCR rows a row, apart: `packed_ocr_step`), and
the time each takes at the plan's roofline (`stage_times`). FLOPs are counted on a step's jaxpr (`program_flops`),
every loop body times its trips."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from dlr_jax.config import Config
from dlr_jax.core.sharding import MESH_AXES, use_mesh
from dlr_jax.data.items import STAGES as PACKED_STAGES  # the stages whose rows are tokens: packed or padded
from dlr_jax.plan.flops import FlopCount, count_jaxpr
from dlr_jax.plan.lengths import Lengths
from dlr_jax.plan.programs import Program, build_program
from dlr_jax.plan.targets import TARGETS, target_mesh

# The paper's total compute per stage (appendix table "FLOPS", one 8 x H100 node, bf16).
PAPER_TOTAL_FLOPS = {"codebook": 780e15, "align": 208e15, "sft": 325e15, "rl": 1365e15}


def corpus_size(cfg: Config) -> int | None:
    """The codebook corpus's examples from its entries' sample sizes and the releases' counts (the paper's ~1M:
    385,620 + 12,000 + 603,000); None when an entry's size is not on record."""
    from dlr_jax.data.readers import BENCHMARKS
    from dlr_jax.data.sources import CorpusEntry

    total = 0
    for spec in cfg.codebook.corpus:
        e = CorpusEntry.parse(spec)
        n = e.count or (BENCHMARKS[e.name].counts.get(e.split) if e.name in BENCHMARKS else None)
        if not n:
            return None
        total += n
    return total or None


def stage_total_flops(cfg: Config, stage: str, flops_per_step: float, prog: Program,
                      lengths: Lengths | None = None, mesh: Mesh | None = None) -> dict[str, Any] | None:
    """The stage's total FLOPs for the recipe's data size (paper data sizes; num_epochs), next to the paper's.
    With the stage's measured `lengths` (align, sft), also the totals of packed rows (`packed_totals`, whose packed
    sft dual-branch step is built on `mesh`)."""
    from dlr_jax.data.protocol import rl_count
    from dlr_jax.data.readers import BENCHMARKS

    spec = BENCHMARKS.get(cfg.data.dataset)
    n_train = (spec.counts or {}).get(cfg.data.train_split) if spec is not None else None
    if not n_train and cfg.data.dataset == "synthetic" and cfg.data.train_split == "train":
        n_train = cfg.data.synthetic_train  # generated: as many as the config asks for
    if not n_train:
        return None
    n_rl = rl_count(n_train, cfg.data.rl_split)
    if stage == "align" and cfg.data.align_part == "all":  # the paper aligns on the whole split
        tcfg, n = cfg.train.align, n_train
    elif stage in PACKED_STAGES:
        tcfg, n = getattr(cfg.train, stage), n_train - n_rl
    elif stage in ("rl", "rollout"):
        tcfg, n = cfg.train.rl, n_rl or n_train
    else:
        tcfg, n = cfg.codebook.train, corpus_size(cfg) or n_train
    # an RL step takes rl.num_prompts prompts (as the stage's schedule counts them), not one update's batch
    per = cfg.rl.num_prompts if stage == "rl" else prog.steps_per_epoch_examples
    epochs = tcfg.num_epochs or (tcfg.num_steps * per / n)
    steps = math.ceil(epochs * n / per)
    if stage == "rl":  # each RL step runs mu updates over its rollout batch
        steps *= cfg.rl.inner_epochs * cfg.rl.num_prompts * cfg.rl.group_size // cfg.train.rl.batch_size
    total = steps * flops_per_step
    out = {"stage_examples": n, "stage_steps": steps, "stage_total_flops": total}
    paper_key = "rl" if stage in ("rl", "rollout") else stage
    if paper_key in PAPER_TOTAL_FLOPS:
        out["paper_total_flops"] = PAPER_TOTAL_FLOPS[paper_key]
        if stage == "rollout":
            out["notes_total"] = "rollout only; the paper's RL figure covers rollouts + updates + scoring"
    if lengths is not None and stage in PACKED_STAGES:
        out |= packed_totals(cfg, stage, tcfg, n, steps, flops_per_step, lengths, mesh)
    return out


def packed_totals(cfg: Config, stage: str, tcfg: Any, n: int, padded_steps: int, flops_per_step: float,
                  lengths: Lengths, mesh: Mesh | None = None) -> dict[str, Any]:
    """The stage in packed rows (`data.packing`: grain's first-fit packer replayed on the measured lengths, as many
    bins as the batch has rows): fewer steps an epoch, each of `flops_per_step` (a packed row is as long as a
    padded one), except sft's dual branch, whose packed row computes S OCR rows (`packed_ocr_step`). A recipe
    counted in num_steps runs as many steps packed, each over more examples. Under `data.pack_batch=examples` a packed
    step is R rows holding about batch_size examples (`data.packing.rows_for_examples`, R a multiple of grad_accum x
    `mesh`'s data-parallel devices, as the stage picks it): about as many steps as padded, each R / batch_size of the
    padded step's FLOPs (`packed_row_share`; the FLOPs and the roofline time of a step scale with its rows). Under
    `exact` a step is the padded step's batch_size examples in the rows its fullest micro-batch needs
    (`exact_step_rows`): the padded steps, each of R / batch_size of the FLOPs."""
    from dlr_jax.data.packing import pack_stats, rows_for_examples

    max_len = cfg.data.max_len
    slots = None  # the dual branch's OCR slots a row: from the lengths, or (exact) from the replayed rows
    multiple = tcfg.grad_accum
    if mesh is not None:
        from dlr_jax.stages.common import row_multiple

        multiple = row_multiple(tcfg, mesh, cfg.mesh.rules, processes=1)
    if cfg.data.pack_batch == "examples":
        rows, stats = rows_for_examples(lengths.lengths, max_len, tcfg.batch_size, cfg.run.seed, multiple=multiple)
    elif cfg.data.pack_batch == "exact":
        rows, stats, slots = exact_step_rows(lengths.lengths, max_len, tcfg.batch_size, tcfg.grad_accum, multiple,
                                             cfg.run.seed)
    else:
        rows, stats = tcfg.batch_size, pack_stats(lengths.lengths, max_len, tcfg.batch_size, cfg.run.seed)
    steps = stats.steps(tcfg.num_epochs, rows, packed=True, examples=n) if tcfg.num_epochs > 0 else padded_steps
    if cfg.data.pack_batch == "exact":  # a step is the padded step's examples: as many steps
        steps = padded_steps
    share = rows / tcfg.batch_size
    out = {"data_pack": cfg.data.pack, "pack_batch": cfg.data.pack_batch, "packed_rows_per_step": rows,
           "packed_row_share": share, "examples_per_row": stats.examples_per_row,
           "packed_efficiency": stats.packed_efficiency, "padded_efficiency": stats.padded_efficiency,
           **lengths.summary(max_len)}
    if stage == "sft":
        from dlr_jax.plan.programs import plans_dual_branch

        if plans_dual_branch(cfg):
            out |= packed_ocr_step(cfg, lengths, mesh, slots)
            flops_per_step = out["flops_per_step_packed"]
    return out | {"stage_steps_packed": steps, "stage_total_flops_packed": steps * flops_per_step * share}


def exact_step_rows(lengths: Any, max_len: int, batch_size: int, grad_accum: int, multiple: int,
                    seed: int) -> tuple[int, Any, int]:
    """(rows a step, the epoch's `PackStats` in those rows, the most segments a row) under `data.pack_batch=exact`
    (`data.exact_rows`): the most rows first-fit-decreasing needs for any global micro-batch of one seeded shuffled
    epoch of `lengths` (a measured sample: the run replays every batch it reads, so its rows can be a little more), in
    multiples of multiple / grad_accum, times grad_accum."""
    import numpy as np

    from dlr_jax.data.exact_rows import rows_needed
    from dlr_jax.data.packing import PackStats

    lengths = np.asarray(lengths, np.int64)
    lengths = lengths[lengths <= max_len]
    order = np.random.default_rng(seed).permutation(len(lengths))
    per = max(1, multiple // grad_accum)
    group = max(1, batch_size // grad_accum)
    rows, segments = rows_needed(lengths[order], group, max_len, per)
    rows *= grad_accum
    epoch_rows = max(1, round(len(lengths) / batch_size * rows))
    return rows, PackStats(len(lengths), int(lengths.sum()), max_len, rows=epoch_rows), segments


def packed_ocr_step(cfg: Config, lengths: Lengths, mesh: Mesh | None = None,
                    slots: int | None = None) -> dict[str, Any]:
    """sft's dual branch on packed rows: S OCR rows a token row (`data.ocr_rows.ocr_slots` from the measured lengths,
    as the pipeline sizes them from its own; or `slots`, under data.pack_batch=exact the most segments a replayed
    row held), and the FLOPs of that step (`step_flops` on `mesh`, a one-device CPU mesh when None: the count is of
    the global program, the same on any mesh)."""
    from dlr_jax.data.ocr_rows import ocr_slots

    sampled = len(lengths.lengths) < lengths.population  # a sample's shortest may be longer than the data's
    if slots is None:
        slots = ocr_slots(lengths.lengths, cfg.data.max_len)
        how = "data.ocr_rows.ocr_slots: max_len // the shortest " + ("measured " if sampled else "") + "sequence"
    else:
        how = "data.pack_batch=exact: the most segments a row of the replayed batches held"
    if mesh is None:
        mesh = target_mesh(TARGETS["cpu"], dict.fromkeys(MESH_AXES, 1))
    note = (f"the dual branch's packed row computes {slots} OCR rows ({how}), one per segment slot, unused slots "
            "included: the packed step counts them")
    return {"ocr_slots": slots, "flops_per_step_packed": step_flops(cfg, "sft", mesh, ocr_slots=slots),
            "notes_packed": note}


def step_flops(cfg: Config, stage: str, mesh: Mesh, *, ocr_slots: int | None = None) -> float:
    """The counted FLOPs of the stage's step (`plan.flops` on its jaxpr, as `plan_once` counts them; no compile),
    with `ocr_slots` OCR rows a token row for sft's dual branch (`programs.train_program`)."""
    with use_mesh(mesh):
        prog = build_program(cfg, stage, mesh, ocr_slots=ocr_slots)
    with use_mesh(prog.mesh or mesh):
        return program_flops(prog).total


def stage_times(plan: Mapping[str, Any]) -> dict[str, float]:
    """The stage's time at the plan's roofline: its steps times the roofline step time, padded
    (`stage_roofline_s`) and packed (`stage_roofline_s_packed`). A packed step is the padded step's program but for
    sft's dual branch (`flops_per_step_packed` in the plan), whose own step time is `roofline_step_s_packed` (its
    compile); without that, or without a roofline (the CPU fallback), the time is left out, not guessed."""
    out: dict[str, float] = {}
    step = plan.get("roofline_step_s")
    if step is not None and "stage_steps" in plan:
        out["stage_roofline_s"] = plan["stage_steps"] * step
    packed = plan.get("roofline_step_s_packed") if "flops_per_step_packed" in plan else step
    share = plan.get("packed_row_share", 1.0)
    if packed is not None and share < 1.0:  # a packed step of fewer rows (pack_batch=examples)
        # Its FLOPs shrink with its rows; its bytes only in part (weights and optimizer state do not shrink), so the
        # B-row step's memory term is kept: an upper bound on that term. Without the two terms: left out.
        if "flops_per_step_packed" in plan or not {"roofline_compute_s", "roofline_memory_s"} <= plan.keys():
            packed = None
        else:
            packed = max(plan["roofline_compute_s"] * share, plan["roofline_memory_s"])
    if packed is not None and "stage_steps_packed" in plan:
        out["stage_roofline_s_packed"] = plan["stage_steps_packed"] * packed
    return out


def program_flops(prog: Program) -> FlopCount:
    """`plan.flops` on the program's jaxpr (every loop body times its trips); call under the program's mesh."""
    static = (0, 1) if prog.stage == "rollout" else ()  # the decode loop's graphdef and config are static
    return count_jaxpr(jax.make_jaxpr(prog.pure, static_argnums=static)(*prog.args), prog.while_trips)
