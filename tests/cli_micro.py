"""Running `python -m dlr_jax.train` as a subprocess on a micro config (tests of the CLI's process
behaviour: exit codes, signals, the workdir lock). The child gets the test session's JAX settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.micro import codebook_nets
from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[1]
MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=120", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1", "sampling.prompt_bucket=16",
    "rl.num_prompts=2", "rl.group_size=4", "rl.max_new_tokens=16", "rl.max_latents=4", "rl.inner_epochs=1",
    "rl.constrain_format=true", "rl.prompt_pool=0", "rl.eval_prompts=0", "rl.process_weight=0",
]
for _s, _n in (("textsft", 4), ("textsft_direct", 2), ("align", 2), ("sft", 2), ("rl", 1)):
    MICRO += [f"train.{_s}.batch_size=8", f"train.{_s}.num_steps={_n}", f"train.{_s}.progress=false",
              f"train.{_s}.async_checkpointing=false", f"train.{_s}.learning_rate=1e-2",
              f"train.{_s}.log_every=1"]

# The codebook stage at micro size (on top of MICRO): the codebook's latents, a 128-px canvas (N = 4 codes; half font
# gives 64 px, N = 1), micro networks for either encoder (codebook.encoder=qwen3_vl reads the vit_* sizes), K and d_c
# from MICRO's latent.*, 2 main-phase steps with no warm-up, no continuous branch and no dead-code refresh, a 1-batch
# k-means start and a held-out check on 4 CoTs.
MICRO_CODEBOOK = [
    "latent.source=codebook", "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128",
    "codebook.max_text_len=48", *codebook_nets(num_queries=4), "codebook.train.num_steps=2",
    "codebook.train.batch_size=8", "codebook.train.progress=false", "codebook.train.async_checkpointing=false",
    "codebook.train.learning_rate=1e-2", "codebook.train.log_every=1", "codebook.train.checkpoint_every=100",
    "codebook.warmup_steps=0", "codebook.alpha_steps=0", "codebook.dead_code_every=0",
    "codebook.kmeans_init_batches=1", "codebook.kmeans_iters=1", "codebook.eval_examples=4",
    "codebook.eval_batch_size=8",
]


def micro_yaml(path: Path, extra: list[str] = ()) -> Path:
    """A YAML file = configs/tiny.yaml + MICRO (+ extra) overrides, written by the loader itself."""
    from dlr_jax.config import load_config, save_config

    save_config(load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, *extra]), path)
    return path


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1), PYTHONPATH=str(ROOT),
               TOKENIZERS_PARALLELISM="false")
    return env


# The child runs the real CLI; `kill_at` = (trainer name, step) sends the process a real signal from
# inside that trainer's step, so the stop lands at a known step (a timed kill from outside could land
# anywhere, or after the run ended).
_CHILD = """
import os, signal, sys
kill_at = {kill_at!r}
if kill_at:
    from dlr_jax.training.trainer import Trainer
    real = Trainer.train_step_async
    def step(self, batch):
        out = real(self, batch)
        if (self.name, self.step) == tuple(kill_at[:2]):
            os.kill(os.getpid(), getattr(signal, kill_at[2]))
        return out
    Trainer.train_step_async = step
from dlr_jax.train import main
sys.exit(main({argv!r}))
"""


def run_cli(argv: list[str], *, kill_at: tuple[str, int, str] | None = None, timeout: float = 300,
            background: bool = False):
    code = _CHILD.format(kill_at=kill_at, argv=argv)
    cmd = [sys.executable, "-c", code]
    if background:
        return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)
