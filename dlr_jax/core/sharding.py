"""Device mesh, logical-axis rules, sharded parameter creation and activation constraints.

Parameters carry *logical* axis names (`embed`, `mlp`, `q_heads`, ...). A rules table per hardware
profile maps each logical name to a mesh axis of `("data", "fsdp", "tensor")` (or None). A logical
dim whose size does not divide its mesh axis falls back to replication, so tiny configs run on any
mesh; `sharded_fraction` reports how much of the model that left unsharded.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
LogicalAxes = tuple[str | None, ...]
MeshAxis = str | tuple[str, ...] | None

# One table per hardware profile. Parameters: FSDP shards the `embed` dim of every matrix over
# "fsdp", tensor parallelism shards heads / mlp / vocab over "tensor". Activations: the batch dim
# spans data x fsdp (FSDP is data parallel for activations).
RULES: dict[str, dict[str, MeshAxis]] = {
    "fsdp": {
        "layers": None,
        "embed": "fsdp",
        "mlp": "tensor",
        "q_heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "vocab": "tensor",
        "codes": "tensor",
        "latent_dim": None,
        "norm": None,
        # activations
        "batch": ("data", "fsdp"),
        "length": None,
        "act_embed": None,
        "act_heads": "tensor",
        "act_kv_heads": "tensor",
        "act_mlp": "tensor",
        "act_vocab": "tensor",
        "cache_length": None,
    },
    # Pure tensor parallelism (+ data parallel): weights replicated over data, split over tensor.
    "tp": {
        "layers": None,
        "embed": None,
        "mlp": "tensor",
        "q_heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "vocab": "tensor",
        "codes": "tensor",
        "latent_dim": None,
        "norm": None,
        "batch": ("data", "fsdp"),
        "length": None,
        "act_embed": None,
        "act_heads": "tensor",
        "act_kv_heads": "tensor",
        "act_mlp": "tensor",
        "act_vocab": "tensor",
        "cache_length": None,
    },
}
# Vision encoder (models/vision.py, causal_flow.py): conv kernel dims, position tables and the
# query pool are small; replicate them in every profile.
for _rules in (RULES["fsdp"], RULES["tp"]):
    _rules.update(
        dict.fromkeys(("conv_h", "conv_w", "conv_in", "conv_out", "pos_h", "pos_w", "rel_pos", "queries"))
    )
# MoE (models/moe.py): experts are split over the FSDP axis (expert parallelism; the `embed` dim of
# an expert matrix is then whole, as a mesh axis is used once per array), or over "tensor" under
# pure TP. `moe_mlp` (an expert's hidden dim) takes "tensor" when the expert dim did not.
RULES["fsdp"].update(expert="fsdp", moe_mlp="tensor")
RULES["tp"].update(expert="tensor", moe_mlp="tensor")
# TPU pods: same logical layout as GPU FSDP; the ICI topology makes "fsdp" the large axis.
RULES["tpu"] = dict(RULES["fsdp"])


def make_mesh(
    data: int = 1,
    fsdp: int = -1,
    tensor: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh with Auto axis types; one axis may be -1 (the rest)."""
    explicit = devices is not None
    devices = list(devices if devices is not None else jax.devices())
    shape = [data, fsdp, tensor]
    if not explicit and -1 not in shape and math.prod(shape) < len(devices):
        # A mesh smaller than the host (e.g. fsdp=1 on 8 devices): use the first devices.
        devices = devices[: math.prod(shape)]
    n = len(devices)
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, shape, strict=True))}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if n % known:
            raise ValueError(
                f"{n} devices do not divide into mesh {dict(zip(MESH_AXES, shape, strict=True))}"
            )
        shape[shape.index(-1)] = n // known
    if math.prod(shape) != n:
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, shape, strict=True))} needs {math.prod(shape)} devices, have {n}"
        )
    try:
        from jax.experimental import mesh_utils

        dev_array = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # fake CPU devices or odd topologies: plain row-major order
        dev_array = np.asarray(devices).reshape(shape)
    return Mesh(dev_array, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def mesh_from_config(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    return make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor, devices=devices)


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """`"data=1,fsdp=8,tensor=1"` -> {"data": 1, "fsdp": 8, "tensor": 1}."""
    out = {"data": 1, "fsdp": 1, "tensor": 1}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in out or not v:
            raise ValueError(f"bad mesh spec {spec!r}: expected data=N,fsdp=N,tensor=N")
        out[k] = int(v)
    return out


def logical_to_spec(
    axes: LogicalAxes,
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules: Mapping[str, MeshAxis] | str = "fsdp",
) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec.

    A mesh axis is used at most once per array. With `shape` and `mesh` given, a dim that does
    not divide evenly over its mesh axes is replicated instead (tiny configs on big meshes).
    """
    rules = RULES[rules] if isinstance(rules, str) else rules
    used: set[str] = set()
    out: list[MeshAxis] = []
    for i, name in enumerate(axes):
        target = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(a for a in names if a not in used)
        if mesh is not None:
            names = tuple(a for a in names if mesh.shape[a] > 1)
        if names and shape is not None and mesh is not None:
            size = math.prod(mesh.shape[a] for a in names)
            if shape[i] % size:
                names = ()
        used.update(names)
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*out)


def named_sharding(
    mesh: Mesh, axes: LogicalAxes, shape: Sequence[int] | None = None, rules: Mapping | str = "fsdp"
) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def host_values(*xs: Any) -> list[np.ndarray]:
    """The whole values of `xs` on this host. Arrays that span other processes' devices (multi-process runs)
    are gathered: a collective, so every process must call this at the same point with the same shapes. The
    local ones come back in one `device_get` (their copies overlap: on a GPU each separate fetch would wait
    for its own round trip)."""
    from jax.experimental import multihost_utils

    def local(x: Any) -> bool:  # every process holds all of it (a replicated array: its own copy)
        return not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated

    if all(local(x) for x in xs):
        return [np.asarray(x) for x in jax.device_get(xs)]
    return [np.asarray(x) if local(x) else np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in xs]


def host_value(x: Any) -> np.ndarray:
    """`host_values` of one value."""
    return host_values(x)[0]


def put_global(x: Any, sharding: NamedSharding) -> jax.Array:
    """A host value (the same on every process) as a global array with `sharding`: each process
    places only its addressable shards. Unlike `jax.device_put`, this works when the mesh spans
    other processes' devices (multi-process runs)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def state_shardings(state: nnx.State, mesh: Mesh, rules: Mapping | str = "fsdp") -> nnx.State:
    """NamedShardings for every Variable in `state` from its `logical_axes` metadata.

    Variables without logical axes are replicated (scalars, RNG counters).
    """

    def one(var: Any) -> Any:
        value = var.get_value() if isinstance(var, nnx.Variable) else var
        axes = var.get_metadata().get("logical_axes") if isinstance(var, nnx.Variable) else None
        shape = getattr(value, "shape", ())
        if axes is None or len(shape) == 0:
            return NamedSharding(mesh, PartitionSpec())
        if len(axes) != len(shape):
            raise ValueError(f"logical axes {axes} do not match shape {shape}")
        return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create_sharded(
    make_model: Callable[[], nnx.Module], mesh: Mesh, rules: Mapping | str = "fsdp"
) -> nnx.Module:
    """Builds a model whose parameters are born sharded: abstract shapes first, then one jitted
    init with out_shardings, so no device ever holds a full copy of a sharded tensor."""
    abstract = nnx.eval_shape(make_model)
    graphdef, abs_state = nnx.split(abstract)
    # A tree of NamedShardings with the State's structure down to each Variable: a valid prefix
    # of the real state tree for out_shardings.
    shardings = state_shardings(abs_state, mesh, rules)

    def init() -> nnx.State:
        return nnx.split(make_model())[1]

    with use_mesh(mesh):
        state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


@contextlib.contextmanager
def use_mesh(mesh: Mesh):
    """Sets `mesh` as the ambient mesh (for jit, nnx.Optimizer, sharding constraints)."""
    with jax.set_mesh(mesh):
        yield mesh


_ACTIVE_RULES: list[Mapping[str, MeshAxis]] = [RULES["fsdp"]]


@contextlib.contextmanager
def activation_rules(rules: Mapping | str):
    _ACTIVE_RULES.append(RULES[rules] if isinstance(rules, str) else rules)
    try:
        yield
    finally:
        _ACTIVE_RULES.pop()


def active_rules() -> Mapping[str, MeshAxis]:
    """The rules `constrain` applies now (the innermost `activation_rules`)."""
    return _ACTIVE_RULES[-1]


def constrain(x: jax.Array, axes: LogicalAxes) -> jax.Array:
    """`with_sharding_constraint` by logical names; a no-op outside a multi-device mesh."""
    mesh = get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return x
    spec = logical_to_spec(axes, x.shape, mesh, _ACTIVE_RULES[-1])
    return jax.lax.with_sharding_constraint(x, spec)


def get_abstract_mesh():
    try:
        return jax.sharding.get_abstract_mesh()
    except Exception:
        return None


def sharded_fraction(tree: Any) -> float:
    """Fraction of parameter bytes whose array is split across more than one device."""
    total = 0
    sharded = 0
    for leaf in jax.tree.leaves(tree):
        if not hasattr(leaf, "sharding") or not hasattr(leaf, "nbytes"):
            continue
        total += leaf.nbytes
        shard_shape = leaf.sharding.shard_shape(leaf.shape)
        if math.prod(shard_shape) < math.prod(leaf.shape):
            sharded += leaf.nbytes
    return sharded / total if total else 0.0


def max_bytes_on_one_device(tree: Any) -> int:
    """The largest per-device buffer of any leaf (to check nothing was fully materialised)."""
    worst = 0
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", []):
            worst = max(worst, shard.data.nbytes)
    return worst


def maybe_initialize_distributed() -> None:
    """Multi-process runs: `DLR_COORDINATOR`/`DLR_NUM_PROCESSES`/`DLR_PROCESS_ID` (see launch/)."""
    coord = os.environ.get("DLR_COORDINATOR")
    if not coord:
        return
    if jax.distributed.is_initialized():  # e.g. train and evaluate called in one process
        return

    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coord,
        num_processes=int(os.environ["DLR_NUM_PROCESSES"]),
        process_id=int(os.environ["DLR_PROCESS_ID"]),
    )


def all_processes_ok(ok: bool) -> bool:
    """Whether every process of the run says `ok` (one process: `ok`). A collective: all call it once."""
    return not processes_not_ok(ok)


def processes_not_ok(ok: bool) -> list[int]:
    """The indices of the processes that say not `ok` (one process: [0] or []). A collective: all call it once."""
    if jax.process_count() == 1:
        return [] if ok else [0]
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.int32(ok))).reshape(-1)
    return [int(i) for i in np.flatnonzero(flags == 0)]


def wait_for_all_processes(name: str) -> None:
    """A barrier (no-op with one process): e.g. until process 0 has written files the others read next."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
