"""The one training loop every stage uses.

A stage supplies a model, a loss function, a trainable-parameter filter and a data iterator; the
trainer owns everything else: optax AdamW with warmup + cosine, gradient accumulation with a
global denominator, a jitted step with explicit shardings and donated state, Orbax checkpoints
(params, optimizer state, step, RNG, data-iterator state) with exact resume, metrics.jsonl +
TensorBoard, a progress bar, profiling, SIGTERM handling and a non-finite-loss guard.

Loss contract: `loss_fn(model, batch, rng) -> (loss_sum, weight, metrics)` where `loss_sum` is a
*sum* over tokens (or sequences) and `weight` the matching count. The optimised loss is
`Σ loss_sum / Σ weight` over all micro-batches of a step, so gradient accumulation gives exactly
the gradient of the full batch, whatever the padding per micro-batch. `metrics` values are sums
too and are divided by the total weight for logging, or by the total of `metrics["tokens"]` where a loss
gives it: a loss normalised per example (`TrainConfig.loss_reduction` = sum: weight = #examples) still logs
per-token means, and `tokens` (the step's total) and `tokens_per_s` count tokens, not examples.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dlr_jax.config import TrainConfig
from dlr_jax.core import preemption
from dlr_jax.core.iterator_state import gather_states, own_state
from dlr_jax.core.metrics_log import MetricsWriter, ProfileWindow, jsonable, progress
from dlr_jax.core.sharding import all_processes_ok, logical_to_spec, make_mesh, use_mesh, wait_for_all_processes
from dlr_jax.run.checkpoint import (
    CheckpointUnreadable,
    configure_orbax,
    move_aside,
    reported_unreadable,
    short_error,
)
from dlr_jax.run.preflight import check_train_config
from dlr_jax.training.optimizer import make_optimizer, opt_state_shardings

LossFn = Callable[[nnx.Module, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, jax.Array, dict]]
TOKENS = "tokens"  # the metric a loss may give: its token count, the denominator of the logged metric means


class TrainingDiverged(RuntimeError):
    """The loss became NaN/Inf; the last good checkpoint is left untouched."""


@dataclasses.dataclass
class TrainResult:
    model: nnx.Module
    step: int
    preempted: bool
    history: list[dict[str, float]]


def batch_hash(batch: Mapping[str, jax.Array]) -> jax.Array:
    """An order-sensitive uint32 fingerprint of a whole (global) batch, computed on device: each
    element's 32 bits times a per-position odd multiplier, summed mod 2**32. Integer sums are exact
    whatever the sharding or reduction order, so the same global batch hashes the same on any number
    of processes and devices (logged as `batch_hash`, to compare data orders)."""
    h = jnp.uint32(0)
    for i, k in enumerate(sorted(batch)):
        x = batch[k]
        x = jax.lax.bitcast_convert_type(x, jnp.uint32) if x.dtype.itemsize == 4 else x.astype(jnp.uint32)
        pos = jax.lax.broadcasted_iota(jnp.uint32, x.shape, 0)
        for d in range(1, x.ndim):
            pos = pos * jnp.uint32(x.shape[d]) + jax.lax.broadcasted_iota(jnp.uint32, x.shape, d)
        mult = pos * jnp.uint32(2654435761) + jnp.uint32(2 * i + 1)
        h = h * jnp.uint32(31) + jnp.sum(x * (mult | jnp.uint32(1)), dtype=jnp.uint32)
    return h


def _shardings(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.sharding, tree)


def build_step_fn(graphdef: nnx.GraphDef, loss_fn: LossFn, tx: optax.GradientTransformation,
                  schedule: optax.Schedule) -> Callable:
    """The pure step `(params, rest, opt_state, batch, rng, step) -> (params, opt_state, metrics)` the
    Trainer jits: gradients of `Σ loss_sum / Σ weight` over the batch's leading micro-batch axis, one
    optimizer update. Also what `dlr_jax.plan.cli` lowers from abstract shapes for a target machine."""

    def step_fn(params, rest, opt_state, batch, rng, step):
        def grad_of(mb, i):
            def f(p):
                model = nnx.merge(graphdef, p, rest)
                ls, w, met = loss_fn(model, mb, jax.random.fold_in(rng, i))
                return ls, (w, met)

            (ls, (w, met)), g = jax.value_and_grad(f, has_aux=True)(params)
            return g, ls, w, met

        a = jax.tree.leaves(batch)[0].shape[0]
        if a == 1:
            # Straight-line code, no scan: XLA:CPU runs the same step several times slower inside a while
            # loop, a length-1 scan included (tests/training/test_trainer.py keeps the loop out).
            grads, loss_sum, weight, metrics = grad_of(jax.tree.map(lambda x: x[0], batch), 0)
            loss_sum, weight = jnp.asarray(loss_sum, jnp.float32), jnp.asarray(weight, jnp.float32)
            metrics = jax.tree.map(lambda m: jnp.asarray(m, jnp.float32), metrics)
        else:
            def micro(carry, xs):
                g, ls, w, met = grad_of(*xs)
                grads, loss_sum, weight, metrics = carry
                return (jax.tree.map(jnp.add, grads, g), loss_sum + ls, weight + w,
                        jax.tree.map(jnp.add, metrics, met)), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            first = jax.tree.map(lambda x: x[0], batch)
            met_shape = jax.eval_shape(lambda: loss_fn(nnx.merge(graphdef, params, rest), first, rng)[2])
            met0 = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), met_shape)
            init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), met0)
            (grads, loss_sum, weight, metrics), _ = jax.lax.scan(micro, init, (batch, jnp.arange(a)))
        denom = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        tokens = metrics.pop(TOKENS, None)
        m_denom = denom if tokens is None else jnp.maximum(tokens, 1.0)
        out = {k: v / m_denom for k, v in metrics.items()}
        if tokens is not None:
            out[TOKENS] = tokens
        out |= {
            "loss": loss_sum / denom,
            "weight": weight,
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(step),
            "batch_hash": batch_hash(batch),
        }
        if "segment_ids" in batch:  # the LM stages' rows (data/pipeline.py), padded or packed
            seg = batch["segment_ids"]
            # share of the batch's tokens that are not padding, and the sequences (examples) it holds
            out["pack_efficiency"] = jnp.mean((seg > 0).astype(jnp.float32))
            out["sequences"] = jnp.sum(jnp.max(seg, axis=-1)).astype(jnp.float32)
        return params, opt_state, out

    return step_fn


class Trainer:
    """Trains `model` in place (its parameters are replaced by the trained ones on return)."""

    def __init__(
        self,
        model: nnx.Module,
        loss_fn: LossFn,
        cfg: TrainConfig,
        workdir: str | os.PathLike,
        *,
        trainable: Any = nnx.Param,
        mesh: Mesh | None = None,
        rules: str = "fsdp",
        name: str = "train",
        clip_group: Callable[[tuple[str, ...]], str] | None = None,
    ):
        """clip_group: clip gradients per group of trainable params (`clip_by_group_global_norm`)."""
        if cfg.batch_size % cfg.grad_accum:
            raise ValueError(f"batch_size={cfg.batch_size} must be divisible by grad_accum={cfg.grad_accum}")
        self.cfg = cfg
        self.loss_fn = loss_fn
        if mesh is None and jax.process_count() > 1:  # each process would train its own copy, silently
            raise ValueError(f"{name}: a multi-process run needs a mesh over every process's devices (mesh=)")
        self.mesh = mesh or make_mesh(1, 1, 1, devices=jax.local_devices()[:1])  # this process's own device
        self.rules = rules
        self.name = name
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.graphdef, self.params, self.rest = nnx.split(model, trainable, ...)
        if not jax.tree.leaves(self.params):
            raise ValueError(f"{name}: the trainable filter {trainable!r} selects no parameters")
        self.tx, self.schedule = make_optimizer(cfg, clip_group=clip_group)
        with use_mesh(self.mesh):
            self.params = self._place(self.params)
            self.rest = self._place(self.rest)
            # Born sharded: each moment on its parameter's devices (restore reuses these shardings).
            o_sh = opt_state_shardings(self.tx, self.params, self.mesh)
            self.opt_state = jax.jit(self.tx.init, out_shardings=o_sh)(self.params)
        self.step = 0
        self.rng = jax.random.key(cfg.seed)
        self._step_fn = None
        configure_orbax()
        self.ckpt = ocp.CheckpointManager(
            (self.dir / "checkpoints").resolve(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=cfg.keep_checkpoints,
                enable_async_checkpointing=cfg.async_checkpointing,
                create=True,
            ),
        )

    # -- placement -------------------------------------------------------------------------------
    def _place(self, state: Any) -> Any:
        """Arrays that already live on this mesh keep their sharding; others are replicated."""

        def put(x):
            if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh == self.mesh:
                return x
            return jax.device_put(x, NamedSharding(self.mesh, PartitionSpec()))

        return jax.tree.map(put, state)

    def _batch_sharding(self, ndim: int, batch_dim_size: int) -> NamedSharding:
        spec = logical_to_spec(("batch",), (batch_dim_size,), self.mesh, self.rules)
        return NamedSharding(self.mesh, PartitionSpec(None, spec[0], *([None] * (ndim - 2))))

    def device_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Per-process [batch_size / processes, ...] host arrays -> global [accum, micro, ...] arrays
        sharded on the batch dim."""
        a, nproc = self.cfg.grad_accum, jax.process_count()
        local = self.cfg.batch_size // nproc
        out = {}
        for k, v in batch.items():
            v = np.asarray(v)
            if v.shape[0] != local:
                raise ValueError(
                    f"batch[{k!r}] has leading dim {v.shape[0]}, expected batch_size / processes = {local}"
                )
            v = v.reshape(a, local // a, *v.shape[1:])
            global_shape = (a, (local // a) * nproc, *v.shape[2:])
            sharding = self._batch_sharding(v.ndim, global_shape[1])
            out[k] = jax.make_array_from_process_local_data(sharding, v, global_shape)
        return out

    # -- the step --------------------------------------------------------------------------------
    def _build_step(self):
        step_fn = build_step_fn(self.graphdef, self.loss_fn, self.tx, self.schedule)
        p_sh, r_sh, o_sh = _shardings(self.params), _shardings(self.rest), _shardings(self.opt_state)
        return jax.jit(
            step_fn,
            in_shardings=(p_sh, r_sh, o_sh, None, None, None),
            out_shardings=(p_sh, o_sh, None),
            donate_argnums=(0, 2),
        )

    def lower_step(self, batch: Mapping[str, np.ndarray]) -> jax.stages.Lowered:
        """The jitted train step lowered for `batch`'s shapes and this state, without running it: for
        XLA's cost analysis and compile timing (benchmarks, planning)."""
        if self._step_fn is None:
            self._step_fn = self._build_step()
        with use_mesh(self.mesh):
            return self._step_fn.lower(self.params, self.rest, self.opt_state, self.device_batch(batch), self.rng,
                                       jnp.asarray(self.step, jnp.int32))

    def train_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One optimizer step; returns its metrics as floats (waits for the device)."""
        return {k: float(v) for k, v in jax.device_get(self.train_step_async(batch)).items()}

    def train_step_async(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """One optimizer step without waiting: metrics stay on device, so the host can prepare the
        next batch while the device computes."""
        if self._step_fn is None:
            self._step_fn = self._build_step()
        with use_mesh(self.mesh):
            dev_batch = self.device_batch(batch)
            rng = jax.random.fold_in(self.rng, self.step)
            self.params, self.opt_state, metrics = self._step_fn(
                self.params, self.rest, self.opt_state, dev_batch, rng, jnp.asarray(self.step, jnp.int32)
            )
        self.step += 1
        return metrics

    # -- checkpoints -----------------------------------------------------------------------------
    def _abstract(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)

    def save(self, data_iter: Any = None, *, force: bool = False) -> None:
        meta = {"step": self.step, "seed": self.cfg.seed, "stage": self.name}
        items = {
            "params": ocp.args.StandardSave(self.params),
            "opt_state": ocp.args.StandardSave(self.opt_state),
            "meta": ocp.args.JsonSave(meta),
        }
        if jax.tree.leaves(self.rest):  # Orbax refuses empty items (everything trainable)
            items["rest"] = ocp.args.StandardSave(self.rest)
        if data_iter is not None and hasattr(data_iter, "get_state"):
            # Every process's position (Orbax writes JSON from process 0 only: iterator_state.py).
            state = gather_states(jsonable(data_iter.get_state()), jax.process_count())
            items["data"] = ocp.args.JsonSave(state)
        self.ckpt.save(self.step, args=ocp.args.Composite(**items), force=force)

    def restore(self, data_iter: Any = None, step: int | None = None) -> bool:
        """Restores the latest (or given) checkpoint onto the current shardings.

        Without `step`, a checkpoint that does not restore (a truncated or missing file: the restore attempt is the
        check) is skipped for the one before it; once one restores, every newer one is moved aside
        (`checkpoints/<step>.damaged-<time>/`, never deleted) with one line each, so the run saves those steps
        again. When none restores, nothing is moved (the cause may be this code rather than the files) and
        `CheckpointUnreadable` says so in one line."""
        if step is not None:
            return self._restore_step(step, data_iter)
        failed: list[tuple[int, BaseException | None]] = []
        for s in sorted(self.ckpt.all_steps(), reverse=True):
            try:
                self._restore_step(s, data_iter)
                err = None
            except Exception as e:  # noqa: BLE001 - any failure to read it; agreed on below, then reported
                err = e
                reported_unreadable(self.dir.resolve() / "checkpoints" / str(s))
            if all_processes_ok(err is None):  # a process may read other shards: all agree before moving anything
                self._move_aside(failed)
                return True
            failed.append((s, err))
        if not failed:
            return False
        ckpts = self.dir / "checkpoints"
        why = "; ".join(f"step {s}: {short_error(e) if e is not None else 'failed on another process'}"
                        for s, e in failed)
        raise CheckpointUnreadable(
            f"[{self.name}] no checkpoint in {ckpts} restores ({why}). Nothing was moved. If their files are damaged "
            f"(a full disk, a truncated copy), move {ckpts} aside and rerun to start the stage over")

    def _move_aside(self, failed: list[tuple[int, BaseException | None]]) -> None:
        """Moves the checkpoints newer than the restored one out of the manager's sight (process 0; the others wait)."""
        if not failed:
            return
        if jax.process_index() == 0:
            for s, e in failed:
                dest = move_aside(self.dir / "checkpoints" / str(s))
                print(f"[{self.name}] checkpoint {s} is damaged "
                      f"({short_error(e) if e is not None else 'failed on another process'}): moved to {dest}; "
                      f"falling back to step {self.step}", flush=True)
        wait_for_all_processes(f"{self.name}: damaged checkpoints moved aside")
        self.ckpt.reload()

    def _restore_step(self, step: int, data_iter: Any) -> bool:
        items = {
            "params": ocp.args.StandardRestore(self._abstract(self.params)),
            "opt_state": ocp.args.StandardRestore(self._abstract(self.opt_state)),
            "meta": ocp.args.JsonRestore(),
        }
        if jax.tree.leaves(self.rest):
            items["rest"] = ocp.args.StandardRestore(self._abstract(self.rest))
        has_data = (self.dir / "checkpoints" / str(step) / "data").exists()
        if has_data:
            items["data"] = ocp.args.JsonRestore()
        restored = self.ckpt.restore(step, args=ocp.args.Composite(**items))
        self.params, self.opt_state = restored["params"], restored["opt_state"]
        if "rest" in items:
            self.rest = restored["rest"]
        self.step = int(restored["meta"]["step"])
        if has_data and data_iter is not None and hasattr(data_iter, "set_state"):
            data_iter.set_state(own_state(restored["data"], jax.process_index(), jax.process_count()))
        return True

    def finalize(self) -> nnx.Module:
        """Writes the trained parameters back into the model object and returns it."""
        self.ckpt.wait_until_finished()
        nnx.update(self.model, self.params, self.rest)
        return self.model

    # -- the loop --------------------------------------------------------------------------------
    def fit(
        self,
        data_iter: Iterator[Mapping[str, np.ndarray]],
        num_steps: int | None = None,
        *,
        resume: bool = True,
        bar_total: int | None = None,
        window: ProfileWindow | None = None,
    ) -> TrainResult:
        """Train until step `num_steps` (default cfg.num_steps). `window`: the profiler window of a run fitted in
        chunks (the caller builds it once over the whole run and closes it); by default this call's own, from
        cfg.profile_steps. `bar_total`: the step the progress bar
        counts to, for callers that fit a run in chunks (default: `num_steps`)."""
        cfg = self.cfg
        total = cfg.num_steps if num_steps is None else num_steps
        check_train_config(cfg, self.name, total)
        if resume and self.restore(data_iter):
            print(f"[{self.name}] resumed from step {self.step} ({self.dir / 'checkpoints'})", flush=True)
        history: list[dict[str, float]] = []
        # Rows past the restored step were logged by a run that died before its next checkpoint: this
        # run redoes those steps, so they go (metrics.jsonl keeps one row per step).
        writer = MetricsWriter(self.dir, enabled=jax.process_index() == 0, resume_step=self.step)
        own_window = window is None
        if window is None:
            window = ProfileWindow(cfg.profile_steps, self.dir / "profile", self.name, self.step, total)
        bar = progress(bar_total or total, self.step, cfg.progress and jax.process_index() == 0, self.name)
        t_last, w_last = time.perf_counter(), 0.0
        preempted = False
        pending: list[tuple[int, dict[str, jax.Array]]] = []
        with preemption.handling_signals():
            try:
                # A stop asked before the first step (e.g. while the data loaded): nothing new to save.
                preempted = self.step < total and preemption.should_stop()
                while self.step < total and not preempted:
                    window.before(self.step)
                    try:
                        batch = next(data_iter)
                    except StopIteration:
                        print(f"[{self.name}] data exhausted at step {self.step}", flush=True)
                        break
                    pending.append((self.step + 1, self.train_step_async(batch)))
                    window.after(self.step)
                    bar.update(1)
                    log_now = self.step % cfg.log_every == 0 or self.step == total
                    ckpt_now = self.step % cfg.checkpoint_every == 0
                    # Multi-process: the stop is agreed only at log/checkpoint steps (preemption.py).
                    stop_now = preemption.should_stop(sync=log_now or ckpt_now)
                    if not (log_now or ckpt_now or stop_now):
                        continue
                    # Host sync only here: every pending step's metrics are checked before a checkpoint
                    # can be written, so a checkpoint never holds parameters after a non-finite loss.
                    for step, dev in pending:
                        metrics = {k: float(v) for k, v in jax.device_get(dev).items()}
                        if not math.isfinite(metrics["loss"]):
                            last = self.ckpt.latest_step()
                            raise TrainingDiverged(
                                f"[{self.name}] non-finite loss ({metrics['loss']}) at step {step}; stopped "
                                f"without saving. Last good checkpoint: "
                                f"{self.dir / 'checkpoints' / str(last) if last is not None else 'none'}. "
                                "Lower the learning rate or check the data."
                            )
                        w_last += metrics.get(TOKENS, metrics["weight"])
                        metrics["step"] = step
                        history.append(metrics)
                    pending.clear()
                    if log_now or stop_now:
                        now = time.perf_counter()
                        metrics["tokens_per_s"] = w_last / max(now - t_last, 1e-9)
                        t_last, w_last = now, 0.0
                        writer.write(self.step, metrics)
                        bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
                    if stop_now:
                        print(f"[{self.name}] stop requested: saving step {self.step} and exiting", flush=True)
                        self.save(data_iter, force=True)
                        preempted = True
                    elif ckpt_now:
                        self.save(data_iter)
                else:
                    if not preempted and self.ckpt.latest_step() != self.step:
                        self.save(data_iter, force=True)
            finally:
                if own_window:
                    window.close()
                bar.close()
                writer.close()
        return TrainResult(self.finalize(), self.step, preempted, history)
