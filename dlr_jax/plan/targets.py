"""Compile targets of the planner: the machines a plan is for, their peak numbers, and a mesh of their
devices built with no device attached (deviceless AOT).

| target  | devices from                                            | HBM/device | bf16 peak   | HBM bw    |
|---------|---------------------------------------------------------|-----------:|------------:|----------:|
| h100    | XLA GPU target config `h100_sxm.txtpb` (plan-gpu extra) | 80 GiB     | 989 TFLOP/s | 3.35 TB/s |
| h200    | XLA GPU target config `h200.txtpb` (plan-gpu extra)     | 141 GiB    | 989 TFLOP/s | 4.8 TB/s  |
| tpu-v5p | libtpu topology description (tpu extra)                 | 95 GiB     | 459 TFLOP/s | 2.76 TB/s |
| cpu     | this host's (fake) CPU devices: a fallback, labelled so | —          | —           | —         |

GPU targets need `pip install -e .[plan-gpu]` (jax-cuda12-plugin, -pjrt and nvcc's ptxas: the real XLA
GPU compiler runs for sm_90a) and `JAX_PLATFORMS=cpu`; the target configs ship in
`dlr_jax/plan/specs/` (from openxla/xla, with the one field jaxlib 0.10 cannot parse removed). TPU
needs `pip install -e .[tpu]`. A compile for the CPU fallback is not a stand-in for GPU memory (it
doubled the temporaries of a test step); the planner says so in its output.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
from jax.sharding import AxisType, Mesh

from dlr_jax.core.sharding import MESH_AXES

SPECS = Path(__file__).resolve().parent / "specs"
GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    platform: str  # cuda | tpu | cpu
    hbm_bytes: float  # per device
    peak_flops: float  # dense bf16 FLOP/s per device
    hbm_bandwidth: float  # bytes/s per device
    spec_file: str | None = None  # GPU target config under specs/
    tpu_version: str | None = None

    @property
    def deviceless(self) -> bool:
        return self.platform != "cpu"


TARGETS: dict[str, Target] = {
    "h100": Target("h100", "cuda", 80 * GiB, 989e12, 3.35e12, spec_file="h100_sxm.txtpb"),
    "h200": Target("h200", "cuda", 141 * GiB, 989e12, 4.8e12, spec_file="h200.txtpb"),
    "tpu-v5p": Target("tpu-v5p", "tpu", 95 * GiB, 459e12, 2.76e12, tpu_version="v5p"),
    "cpu": Target("cpu", "cpu", float("inf"), float("nan"), float("nan")),
}


class TargetUnavailable(RuntimeError):
    """The compiler for a target is not installed here; the message says which extra installs it."""


_V5P_SLICES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
               512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}


def tpu_topology_name(version: str, n: int) -> str:
    """The slice of n chips: v5p slices are 3-D tori of 2x2x1 trays (2x2x2 = 8 chips, 4x4x4 = 64)."""
    if n not in _V5P_SLICES:
        raise ValueError(f"no {version} slice of {n} chips; slices: {sorted(_V5P_SLICES)}")
    return f"{version}:{_V5P_SLICES[n]}"


def target_devices(target: Target, n: int) -> list[jax.Device]:
    """n devices of `target`, deviceless for GPU and TPU (raises TargetUnavailable naming the extra)."""
    if target.platform == "cpu":
        devs = jax.devices("cpu")
        if len(devs) < n:
            raise TargetUnavailable(
                f"the cpu fallback needs {n} devices, this host has {len(devs)}: set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax starts"
            )
        return devs[:n]
    from jax.experimental import topologies

    if target.platform == "cuda":
        spec = (SPECS / target.spec_file).read_text()
        hosts = max(1, n // 8)
        per_host = n // hosts
        try:
            topo = topologies.get_topology_desc(platform="cuda", target_config=spec, topology=f"1x{hosts}x{per_host}")
        except Exception as e:  # noqa: BLE001 - jax raises several types when the plugin is missing
            raise TargetUnavailable(
                f"{target.name}: deviceless GPU compile unavailable ({type(e).__name__}: {e}); "
                "install the plan-gpu extra: pip install -e '.[plan-gpu]' and run with JAX_PLATFORMS=cpu"
            ) from None
        return list(topo.devices)
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=tpu_topology_name(target.tpu_version, n))
    except Exception as e:  # noqa: BLE001
        raise TargetUnavailable(
            f"{target.name}: TPU topology unavailable ({type(e).__name__}: {e}); install the tpu extra: "
            "pip install -e '.[tpu]'"
        ) from None
    return list(topo.devices)


def target_mesh(target: Target, shape: dict[str, int]) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh of `target`'s devices with Auto axes (no -1 allowed here)."""
    dims = [shape[a] for a in MESH_AXES]
    if any(d < 1 for d in dims):
        raise ValueError(f"a plan's mesh must be explicit, got {shape}")
    devices = target_devices(target, math.prod(dims))
    import numpy as np

    return Mesh(np.asarray(devices).reshape(dims), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
