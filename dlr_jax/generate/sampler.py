"""Batched autoregressive sampling with a KV cache: one jitted prefill, one jitted decode loop.

Works with any NNX module exposing `init_cache(batch, max_len[, dtype]) -> cache` and
`forward_cached(input_ids, positions, token_mask, cache) -> (logits [B, T, V] fp32, cache)`
(`Transformer`, and the latent LM that overrides its vocabulary seams). The model is used
functionally: `nnx.split` once, the jitted functions take `(graphdef [static], state, ...)`.

Log-prob convention (what GRPO needs for old / reference log-probs): `SampleOutput.logprobs` is
`log_softmax(masked_logits / T)[token]` for T > 0 and `log_softmax(masked_logits)[token]` for
greedy, where `masked_logits` are the model's logits with `vocab_mask` applied and *before*
`logits_processor`, top-k and top-p. They therefore equal `score(..., temperature=T)` on the same
sequence. Tokens forced by a `logits_processor` keep their (possibly very low) model log-prob.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dlr_jax.core.sharding import activation_rules, host_value, host_values, logical_to_spec, use_mesh
from dlr_jax.generate.decoding import (
    DecodeConfig,
    LogitsProcessor,
    decode_loop,
    mask_vocab,
    prefill,
    sample_logits,
    score_body,
    score_states_body,
    sequence_logprobs,
    token_logprobs,
)
from dlr_jax.models.transformer import KVCache

_STOP_SLOTS = 8  # stop-id arrays are padded to a multiple of this, so their count rarely recompiles

# XLA:CPU hands dots to YNNPACK by default, fused with their neighbours. For the prefill and teacher-
# forced scoring (many rows) XLA's own (Eigen) dot kernels beat both those fusions and YNNPACK's individual
# dots, with the same tokens (BENCHMARKS.md, section "Greedy sampling"; `python -m dlr_jax.bench --only sampling`).
# Training keeps the default (no difference there). CPU only; options of the pinned jaxlib.
CPU_SAMPLER_OPTIONS: dict[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}
# The decode loop's matmuls are skinny (a few rows, every weight read once per token). There YNNPACK
# taking each dot on its own, unfused, with the weights out-major (`attention.OutMajor`), streams them
# fastest, faster than either change alone, with the same greedy tokens (the same benchmark).
# Measured with the layers unstacked (`unstack_layers`, the CPU default); a layer scan keeps
# CPU_SAMPLER_OPTIONS.
CPU_DECODE_OPTIONS: dict[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


@dataclass(frozen=True)
class SampleOutput:
    """Host-side results. `tokens` [B, N] int32: generated ids, `pad_id` after a row finished;
    `logprobs` [B, N] float32 (0 at pad); `lengths` [B]: generated tokens per row, stop token
    included; `prompt_lengths` [B]; `finished` [B] bool: the row emitted a stop id."""

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    prompt_lengths: np.ndarray
    finished: np.ndarray


# ----------------------------------------------------------------------------------------------
# Jitted entry points (the bodies are in decoding.py; module names here so tests can wrap them).

_prefill = prefill
_score = score_body
_score_states = score_states_body
_score_jit = jax.jit(_score, static_argnums=0)


def score(
    model: Any, tokens: Any, mask: Any, *, temperature: float = 1.0, vocab_mask: Any = None
) -> np.ndarray:
    """Jitted teacher-forced log-probs, [B, T] float32 aligned with `tokens` (see
    `sequence_logprobs`). `model` is an NNX module or a `(graphdef, state)` pair; params keep
    their shardings. For explicit shardings on a mesh use `Sampler.score`."""
    graphdef, state = _split(model)
    out = _score_jit(graphdef, state, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, jnp.int32),
                     None if vocab_mask is None else jnp.asarray(vocab_mask, bool), jnp.float32(temperature))
    return host_value(out)


# ----------------------------------------------------------------------------------------------
# Host-side driver.


def _split(model_or_split: Any) -> tuple[nnx.GraphDef, nnx.State]:
    if isinstance(model_or_split, nnx.Module):
        return nnx.split(model_or_split)
    if isinstance(model_or_split, tuple) and len(model_or_split) == 2:
        return model_or_split
    raise TypeError(
        f"expected an nnx.Module or a (graphdef, state) pair, got {type(model_or_split).__name__}"
    )


@functools.lru_cache(maxsize=64)
def _seed_key(seed: int) -> jax.Array:
    """The PRNG key of an int seed, made once: making one is a device op, which a short call pays again."""
    return jax.random.key(seed)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads token lists to `length`: (ids [B, length] int32, prompt_lengths [B] int32)."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    lens = np.zeros((len(prompts),), np.int32)
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
        if len(p) > length:
            raise ValueError(f"prompt {i} has {len(p)} tokens, more than the {length} allowed")
        ids[i, length - len(p):] = np.asarray(p, np.int32)
        lens[i] = len(p)
    return ids, lens


class Sampler:
    """Jitted prefill + `lax.while_loop` decode over a KV cache, optionally on a mesh.

    Shapes are bucketed so that batches of similar prompts reuse compiled code: the prompt block
    is left-padded to a multiple of `prompt_bucket` and the cache holds `max_total_len` slots
    (or, if None, padded prompt + `max_new_tokens`). Batch size is part of the compiled shape.
    Params are used with the shardings they already have; on a mesh the batch is sharded over
    the `batch` logical axis (data x fsdp) when it divides, else replicated.
    """

    def __init__(
        self,
        model_or_split: Any,
        *,
        mesh: Mesh | None = None,
        rules: Mapping | str = "fsdp",
        max_total_len: int | None = None,
        prompt_bucket: int = 64,
        cache_dtype: str | None = None,
        unstack_layers: bool | None = None,
        compiler_options: Mapping[str, Any] | None = None,
    ):
        """`unstack_layers`: decode with each layer's weights sliced once per call (one extra copy of the
        layer weights while generating) and a cache of per-layer buffers, instead of scanning the
        stacked layers every token (XLA:CPU copies each layer's weight and cache slices, every token);
        None = on CPU devices, where the model offers `layer_slices` (on GPU and TPU the scan is kept: its
        fusions read the slices, and the extra weight copy would cost device memory; not measured there
        yet). Compile time grows with depth when on.
        `compiler_options`: XLA options for the prefill, decode and scoring compiles; None = on CPU devices
        `CPU_DECODE_OPTIONS` for an unstacked decode loop and `CPU_SAMPLER_OPTIONS` for the rest, none
        elsewhere."""
        if prompt_bucket < 1:
            raise ValueError(f"prompt_bucket must be >= 1, got {prompt_bucket}")
        self.graphdef, self.state = _split(model_or_split)
        model = model_or_split if isinstance(model_or_split, nnx.Module) else nnx.merge(self.graphdef, self.state)
        can = hasattr(model, "layer_slices")
        device = None if mesh is None else next(iter(getattr(mesh, "devices", np.empty(0)).flat), None)
        on_cpu = (getattr(device, "platform", None) or jax.default_backend()) == "cpu"
        if unstack_layers is None:  # the copies it removes are XLA:CPU's; elsewhere keep the memory
            unstack_layers = on_cpu
        self.unstack_layers = bool(unstack_layers) and can
        decode_options = compiler_options
        if compiler_options is None:
            compiler_options = CPU_SAMPLER_OPTIONS if on_cpu else {}
            decode_options = (CPU_DECODE_OPTIONS if self.unstack_layers else CPU_SAMPLER_OPTIONS) if on_cpu else {}
        self.compiler_options = dict(compiler_options) or None
        self.decode_compiler_options = dict(decode_options) or None
        self.mesh, self.rules = mesh, rules
        self.max_total_len, self.prompt_bucket, self.cache_dtype = max_total_len, prompt_bucket, cache_dtype
        # One jitted function per batch sharding (at most two: batch split or replicated); each
        # one's own jit cache holds the shape/static-config variants.
        self._prefill_fns: dict[Any, Any] = {}
        self._decode_fns: dict[Any, Any] = {}
        self._score_fns: dict[Any, Any] = {}
        self._vocab: int | None = None

    # -- state -----------------------------------------------------------------------------------
    def set_state(self, model_or_state: Any) -> None:
        """Swaps in new weights, e.g. after an RL step. They must keep the structure and the
        shardings of the first state (the compiled functions were built for those); no recompile."""
        self.state = nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) else model_or_state

    def cache_size(self) -> dict[str, int]:
        """Number of compiled variants held by the prefill / decode / score jit caches."""
        count = lambda fns: sum(f._cache_size() for f in fns.values())
        return {"prefill": count(self._prefill_fns), "decode": count(self._decode_fns),
                "score": count(self._score_fns)}

    @property
    def compile_count(self) -> int:
        return sum(self.cache_size().values())

    # -- shardings -------------------------------------------------------------------------------
    def _ctx(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        if self.mesh is None:
            return stack
        stack.enter_context(use_mesh(self.mesh))
        stack.enter_context(activation_rules(self.rules))
        return stack

    def _ns(self, axes: tuple[str | None, ...], shape: Sequence[int]) -> NamedSharding:
        return NamedSharding(self.mesh, logical_to_spec(axes, shape, self.mesh, self.rules))

    def _batch_key(self, b: int) -> PartitionSpec | None:
        return None if self.mesh is None else logical_to_spec(("batch",), (b,), self.mesh, self.rules)

    def _state_shardings(self):
        return jax.tree.map(lambda a: a.sharding, self.state)

    def cache_shardings(self, b: int, cache_len: int):
        """Shardings of the KV cache for `b` rows of `cache_len` positions on this sampler's mesh."""
        abstract = self._abstract_prefill(b, cache_len)[1]
        if isinstance(abstract, KVCache):
            kv_axes = (None, "batch", "act_kv_heads", "cache_length", None)
            kv = lambda x: (tuple(self._ns(kv_axes[1:], a.shape) for a in x) if isinstance(x, tuple)
                            else self._ns(kv_axes, x.shape))
            return KVCache(k=kv(abstract.k), v=kv(abstract.v),
                           valid=self._ns(("batch", "cache_length"), abstract.valid.shape),
                           index=NamedSharding(self.mesh, PartitionSpec()))
        # Unknown cache layout: replicate (correct, not memory-optimal).
        return jax.tree.map(lambda _: NamedSharding(self.mesh, PartitionSpec()), abstract)

    def _put(self, x: np.ndarray, sharding: NamedSharding | None) -> jax.Array | np.ndarray:
        if sharding is None:  # the jitted call moves host arrays itself, cheaper than one jnp.asarray each
            return x
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    def _batch_sharding(self, shape: Sequence[int]) -> NamedSharding | None:
        if self.mesh is None:
            return None
        return self._ns(("batch",) + (None,) * (len(shape) - 1), shape)

    def compiled_fns(self, b: int, cache_len: int, vocab: int):
        """(prefill, decode): the jitted `_prefill` and `decode_loop` for this batch bucket and cache
        length, built once and kept (the planner lowers the same decode)."""
        key = (self._batch_key(b), cache_len)
        if key in self._prefill_fns:
            return self._prefill_fns[key], self._decode_fns[key]
        opts, dopts = self.compiler_options, self.decode_compiler_options
        if self.mesh is None:
            prefill = jax.jit(_prefill, static_argnums=(0, 1), compiler_options=opts)
            decode = jax.jit(decode_loop, static_argnums=(0, 1), donate_argnums=(3,), compiler_options=dopts)
        else:
            rep = NamedSharding(self.mesh, PartitionSpec())
            st = self._state_shardings()
            cache = self.cache_shardings(b, cache_len)
            bt = self._batch_sharding((b, 1))  # any [B, T] array
            bv = self._ns(("batch", "act_vocab"), (b, vocab))
            b1 = self._batch_sharding((b,))
            prefill = jax.jit(_prefill, static_argnums=(0, 1), in_shardings=(st, bt, bt, bt),
                              out_shardings=(bv, cache), compiler_options=opts)
            # vocab_mask is None or a [V] bool; `rep` as a pytree prefix covers both.
            decode = jax.jit(decode_loop, static_argnums=(0, 1), donate_argnums=(3,),
                             in_shardings=(st, cache, bv, b1, rep, rep, rep, rep, rep, rep, rep),
                             out_shardings=(bt, bt, b1, b1, cache), compiler_options=dopts)
        self._prefill_fns[key], self._decode_fns[key] = prefill, decode
        return prefill, decode

    # -- public ----------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]] | np.ndarray,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_ids: Sequence[int] = (),
        rng: int | jax.Array | None = None,
        pad_id: int = 0,
        logits_processor: LogitsProcessor | None = None,
        processor_aux: Any = None,
        vocab_mask: Any = None,
    ) -> SampleOutput:
        """Samples up to `max_new_tokens` per prompt.

        prompts: token lists of any lengths (>= 1), or an int array [B, T] of equal-length rows.
        temperature 0 = greedy (top_k / top_p ignored); else temperature, then top-k (0 = off),
        then top-p (1.0 = off). A row finishes after emitting any of `stop_ids` (kept in the
        output); the loop exits when all rows finished. `rng`: int seed or PRNG key (None = 0).
        `vocab_mask` [V] bool: False ids are never sampled (padded vocab rows).
        `logits_processor` / `processor_aux`: see `LogitsProcessor`.
        Compiled variants: temperature and top_p values are traced; greedy vs sampled, top_k,
        top_p < 1 or not, max_new_tokens, batch size and the prompt bucket are static.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0 or not 0.0 < top_p <= 1.0 or top_k < 0:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got "
                             f"temperature={temperature}, top_p={top_p}, top_k={top_k}")
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts:
            raise ValueError("no prompts given")
        if processor_aux is not None and logits_processor is None:
            raise ValueError("processor_aux was given without a logits_processor")
        longest = max(len(p) for p in prompts)
        p_len = _round_up(longest, self.prompt_bucket)
        if self.max_total_len is not None:
            room = self.max_total_len - max_new_tokens
            if longest > room:
                raise ValueError(f"longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
                                 f"max_total_len={self.max_total_len}")
            p_len = min(p_len, room)
            cache_len = self.max_total_len
        else:
            cache_len = p_len + max_new_tokens
        ids, lens = left_pad(prompts, p_len, pad_id)
        b = ids.shape[0]
        real = np.arange(p_len)[None, :] >= (p_len - lens)[:, None]
        positions = np.where(real, np.arange(p_len)[None, :] - (p_len - lens)[:, None], 0).astype(np.int32)

        stops = np.full((_round_up(max(len(stop_ids), 1), _STOP_SLOTS),), -1, np.int32)
        stops[: len(stop_ids)] = np.asarray(list(stop_ids), np.int32)
        if rng is None or isinstance(rng, int | np.integer):
            rng = _seed_key(0 if rng is None else int(rng))
        greedy = temperature == 0.0
        cfg = DecodeConfig(max_new_tokens, greedy, 0 if greedy else int(top_k),
                         (not greedy) and top_p < 1.0, logits_processor, vocab_mask is not None,
                         self.unstack_layers)

        with self._ctx():
            vocab = self._vocab_size()
            prefill, decode = self.compiled_fns(b, cache_len, vocab)
            bs = self._batch_sharding((b, p_len))
            rep = None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())
            logits0, cache = prefill(self.graphdef, self._cache_cfg(cache_len), self.state,
                                     self._put(ids, bs), self._put(positions, bs), self._put(real, bs))
            vm = None if vocab_mask is None else self._put(np.asarray(vocab_mask, bool), rep)
            if vm is not None and vm.shape != (vocab,):
                raise ValueError(f"vocab_mask has shape {vm.shape}, expected ({vocab},)")
            if self.mesh is not None:
                # A global replicated array built from host data on every process (a device_put onto a
                # mesh that spans other processes' devices fails); the key is re-wrapped inside jit.
                typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
                rng = self._put(np.asarray(jax.random.key_data(rng) if typed else rng), rep)
            tokens, logps, lengths, finished, _ = decode(
                self.graphdef, cfg, self.state, cache, logits0, self._put(lens, self._batch_sharding((b,))),
                self._put(stops, rep), vm, self._put(np.int32(pad_id), rep),
                self._put(np.float32(temperature), rep), self._put(np.float32(top_p), rep), rng,
                None if processor_aux is None else jax.tree.map(lambda a: self._put(np.asarray(a), rep),
                                                                processor_aux),
            )
        tokens, logps, lengths, finished = host_values(tokens, logps, lengths, finished)
        return SampleOutput(tokens=tokens, logprobs=logps, lengths=lengths, prompt_lengths=lens, finished=finished)

    def score(
        self, tokens: Any, mask: Any, *, temperature: float = 1.0, vocab_mask: Any = None
    ) -> np.ndarray:
        """Teacher-forced log-probs [B, T] float32 aligned with `tokens` (see `sequence_logprobs`)."""
        tokens = np.asarray(tokens, np.int32)
        mask = np.asarray(mask, np.int32)
        if tokens.ndim != 2 or tokens.shape != mask.shape:
            raise ValueError(f"tokens and mask must both be [B, T]; got {tokens.shape} and {mask.shape}")
        b = tokens.shape[0]
        key = self._batch_key(b)
        with self._ctx():
            if key not in self._score_fns:
                if self.mesh is None:
                    self._score_fns[key] = jax.jit(_score, static_argnums=0, compiler_options=self.compiler_options)
                else:
                    rep = NamedSharding(self.mesh, PartitionSpec())
                    bt = self._batch_sharding(tokens.shape)
                    self._score_fns[key] = jax.jit(_score, static_argnums=0,
                                                   in_shardings=(self._state_shardings(), bt, bt, rep, rep),
                                                   out_shardings=bt, compiler_options=self.compiler_options)
            bt = self._batch_sharding(tokens.shape)
            rep = None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())
            vm = None if vocab_mask is None else self._put(np.asarray(vocab_mask, bool), rep)
            out = self._score_fns[key](self.graphdef, self.state, self._put(tokens, bt), self._put(mask, bt),
                                       vm, self._put(np.float32(temperature), rep))
        return host_value(out)

    def score_states(
        self, states: Sequence[Any], tokens: Any, mask: Any, *, temperature: float = 1.0, vocab_mask: Any = None
    ) -> list[np.ndarray]:
        """`score` of the same rows under each of `states` (same structure and shardings as this
        sampler's state, e.g. the policy and the reference) in one jitted pass."""
        tokens = np.asarray(tokens, np.int32)
        mask = np.asarray(mask, np.int32)
        if tokens.ndim != 2 or tokens.shape != mask.shape:
            raise ValueError(f"tokens and mask must both be [B, T]; got {tokens.shape} and {mask.shape}")
        key = ("states", len(states), self._batch_key(tokens.shape[0]))
        with self._ctx():
            bt = self._batch_sharding(tokens.shape)
            rep = None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())
            if key not in self._score_fns:
                if self.mesh is None:
                    self._score_fns[key] = jax.jit(_score_states, static_argnums=0,
                                                   compiler_options=self.compiler_options)
                else:
                    st = (self._state_shardings(),) * len(states)
                    self._score_fns[key] = jax.jit(_score_states, static_argnums=0,
                                                   in_shardings=(st, bt, bt, rep, rep),
                                                   out_shardings=(bt,) * len(states),
                                                   compiler_options=self.compiler_options)
            vm = None if vocab_mask is None else self._put(np.asarray(vocab_mask, bool), rep)
            out = self._score_fns[key](self.graphdef, tuple(states), self._put(tokens, bt), self._put(mask, bt),
                                       vm, self._put(np.float32(temperature), rep))
        return host_values(*out)

    def _vocab_size(self) -> int:
        if self._vocab is None:
            self._vocab = int(self._abstract_prefill(1, 1)[0].shape[-1])
        return self._vocab

    def _cache_cfg(self, cache_len: int) -> tuple[int, str | None, bool]:
        return cache_len, self.cache_dtype, self.unstack_layers

    def abstract_cache(self, b: int, cache_len: int) -> Any:
        """Shapes and dtypes of the KV cache the prefill hands the decode loop (per-layer buffers
        when `unstack_layers`)."""
        return self._abstract_prefill(b, cache_len)[1]

    def _abstract_prefill(self, b: int, cache_len: int) -> tuple[jax.ShapeDtypeStruct, Any]:
        ids = jax.ShapeDtypeStruct((b, 1), jnp.int32)
        return jax.eval_shape(
            lambda st, i, m: _prefill(self.graphdef, self._cache_cfg(cache_len), st, i, i, m),
            self.state, ids, jax.ShapeDtypeStruct((b, 1), jnp.bool_),
        )


# The decode maths and config types (decoding.py) stay reachable as `sampling.X`.
__all__ = ["CPU_DECODE_OPTIONS", "CPU_SAMPLER_OPTIONS", "DecodeConfig", "LogitsProcessor", "SampleOutput", "Sampler",
           "decode_loop", "left_pad", "mask_vocab", "sample_logits", "score", "sequence_logprobs", "token_logprobs"]
