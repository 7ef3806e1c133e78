"""What `data.pipeline.make_stage_dataset` returns: `StageData`, a stage's batches as a resumable iterable, and its
iterator's data position (`StageIterator.get_state` / `set_state`: a count of global batches, or grain's packer state;
`data.pipeline`'s module docstring says which and why); and the grain read options every pipeline here uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grain
import numpy as np

from dlr_jax.config import ConfigError
from dlr_jax.data.curriculum import Curriculum
from dlr_jax.data.packing import PackStats


class StageData:
    """What `make_stage_dataset` returns: iterable (a fresh iterator from the start each time)."""

    def __init__(self, make: Any, global_batch: int, shard_count: int, *, packed: bool, examples: int,
                 pack: PackStats | None = None, curriculum: Curriculum | None = None, rebuild: Any = None,
                 pack_batch: str = "rows", batch_examples: int | None = None):
        """global_batch: rows a step (all processes). examples: how many examples fit max_len (what an epoch holds).
        pack: the epoch in rows (`data.packing`; one example a row unpacked). pack_batch: what the stage's
        batch_size counted ("examples": global_batch rows were chosen to hold about `batch_examples` examples a
        step). curriculum: the latent curriculum the stream follows; rebuild(curriculum) makes the same data with
        another (`schedule_curriculum`)."""
        self._make, self.global_batch, self.shard_count, self.packed = make, global_batch, shard_count, packed
        self.examples, self.pack = examples, pack
        self.pack_batch, self.batch_examples = pack_batch, global_batch if batch_examples is None else batch_examples
        self.curriculum, self._rebuild = curriculum, rebuild

    def schedule_curriculum(self, num_steps: int) -> StageData:
        """This data with its latent curriculum told the stage's length, `num_steps` optimizer steps of
        `examples_per_step` examples (a stagewise curriculum needs it before the first batch; else a no-op)."""
        if self.curriculum is None or self.curriculum.mode != "stagewise":
            return self
        return self._rebuild(self.curriculum.with_schedule(num_steps, self.examples_per_step))

    @property
    def examples_per_step(self) -> float:
        """Examples one global batch holds: batch size x examples a packed row holds (on average over an epoch;
        exactly the padded batch under pack_batch=exact)."""
        if self.pack_batch == "exact":
            return float(self.batch_examples)
        return self.global_batch * (self.pack.examples_per_row if self.packed and self.pack else 1.0)

    @property
    def by_batch(self) -> bool:
        """Whether the data position is a count of global batches (padded, and packed under pack_batch=exact), which
        resumes on any number of processes and rows (exact: those follow the processes, the mesh and the run's
        length); else grain's packer state (module docstring)."""
        return not self.packed or self.pack_batch == "exact"

    def __iter__(self) -> StageIterator:
        if self.curriculum is not None and not self.curriculum.scheduled:
            raise ValueError("a stagewise latent curriculum needs the stage's length before the first batch: "
                             "data = data.schedule_curriculum(num_steps)")
        return StageIterator(self)


class StageIterator:
    """Batches of a `StageData`; `get_state` / `set_state` as the module docstring says: unpacked, the
    state is the number of global batches read, which any process count can resume from."""

    def __init__(self, data: StageData):
        self._data, self._read = data, 0
        self._it = iter(data._make(0))

    def __iter__(self) -> StageIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        self._read += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        d = self._data
        state: dict[str, Any] = {"global_batches": self._read, "global_batch_size": d.global_batch}
        if d.packed and d.by_batch:  # pack_batch=exact: rows follow the run's length and mesh, the examples do not
            state["batch_examples"] = d.batch_examples
        if not d.by_batch:
            state |= {"shard_count": d.shard_count, "packed": self._it.get_state()}
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        d = self._data
        if "global_batches" not in state:  # a checkpoint from before global batches: grain's own state
            self._it.set_state(state)
            return
        if ("packed" in state) == d.by_batch:
            kinds = ("a count of global batches (padded rows, or data.pack_batch=exact)",
                     "grain's packer state (data.pack=true with data.pack_batch=rows|examples)")
            then, now = (kinds[1], kinds[0]) if "packed" in state else kinds
            raise ConfigError(f"the checkpointed data position is {then}, this run's data needs {now}: resume with "
                              "the data.pack / data.pack_batch the stage started with, or start the stage over in a "
                              "new --workdir")
        if d.by_batch:
            # Padded rows or exact packed steps: the position is global batches of batch_examples examples, whatever
            # the rows (exact: another mesh or a longer schedule may pack them into more).
            then = int(state.get("batch_examples", state["global_batch_size"]))
            if then != d.batch_examples:
                raise _other_batch_size(f"{then} (batch_size x processes)", d.batch_examples)
            self._read = int(state["global_batches"])
            self._it = iter(d._make(self._read))
            return
        if int(state["global_batch_size"]) != d.global_batch and d.pack_batch == "examples":
            raise ConfigError(
                f"the checkpointed data position counts steps of {state['global_batch_size']} packed rows, this "
                f"run's take {d.global_batch}: under data.pack_batch=examples the rows a step takes follow the "
                "examples' lengths, batch_size, grad_accum and the data-parallel devices (data.packing."
                "rows_for_examples). Resume with the mesh, grad_accum and batch_size the stage started with, or start "
                "the stage over in a new --workdir")
        if int(state["global_batch_size"]) != d.global_batch:
            raise _other_batch_size(f"{state['global_batch_size']} packed rows", d.global_batch)
        self._read = int(state["global_batches"])
        if int(state["shard_count"]) != d.shard_count:
            raise ValueError(f"packed data (data.pack=true) was checkpointed on {state['shard_count']} processes "
                             f"and cannot resume on {d.shard_count}: each process packs its own rows")
        self._it.set_state(state["packed"])


def _other_batch_size(then: str, now: int) -> ConfigError:
    # A ConfigError (one line, exit 2) that says how to back out: the workdir's config.yaml already holds the new
    # value, so going back to the recorded one is itself a change.
    return ConfigError(
        f"the checkpointed data position counts batches of {then}, this run's are {now}: a stage resumes with the "
        "batch size it started with. Rerun with that batch size and --set run.allow_config_change=true (the "
        "workdir's config.yaml now records the new one), or start the stage over in a new --workdir")


def read_options(num_threads: int, read_ahead: int) -> grain.ReadOptions:
    # grain's default (16 threads, 500 elements ahead) polls every buffered future on each element
    # (it slowed packing down several-fold) and would hold 500 whole batches in memory. Not
    # ThreadPrefetchIterDataset either: its daemon thread aborts the interpreter at exit (rc 134)
    # when an iterator is left open mid-tokenisation; grain's reader threads are joined cleanly.
    return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=read_ahead if num_threads else 0)


def mark_absl_flags_parsed() -> None:
    # grain 0.2.18 reads an absl flag when starting workers and raises UnparsedFlagAccessError in
    # scripts that never ran absl.app (google/grain#1355, fixed upstream by #1362). Marking the
    # flags parsed keeps their defaults; a program that parses its own absl flags is unaffected.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def prefetch(it: grain.IterDataset, num_workers: int) -> grain.IterDataset:
    """`it` read ahead by `num_workers` grain worker processes (0: in this process)."""
    if num_workers > 0:
        mark_absl_flags_parsed()
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=2))
    return it
