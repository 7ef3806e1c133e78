"""Latent GRPO: the stage end to end on a micro workdir (resume, sharded sampling) and the loss on policy.
(The step's update on a toy task: test_grpo_step.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ConfigError, apply_overrides, load_config
from dlr_jax.core.sharding import make_mesh
from dlr_jax.data.sources import load_examples
from dlr_jax.rewards.answer_format import RewardInputs, register_reward
from dlr_jax.run.checkpoint import read_meta
from dlr_jax.run.handoff import load_stage_model, save_stage_model
from dlr_jax.stages import common
from dlr_jax.stages.latent_common import new_latent_lm
from dlr_jax.stages.rl import stage as rl
from tests.stages.rl.test_step import TOY, toy_model, toy_rollouts  # noqa: F401 - the fixture is used by name

ROOT = Path(__file__).resolve().parents[3]
MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=60", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1", "sampling.prompt_bucket=16",
]
RL = [
    "rl.num_prompts=2", "rl.group_size=4", "rl.max_new_tokens=16", "rl.max_latents=4", "rl.inner_epochs=1",
    "rl.constrain_format=true", "train.rl.batch_size=8", "train.rl.progress=false",
    "train.rl.async_checkpointing=false", "train.rl.learning_rate=1e-3", "rl.prompt_pool=0", "rl.eval_prompts=0",
]


def one_rl_step():
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The files stage rl reads — tokenizer, textsft_cot/final (the evaluator), sft/final (policy and
    reference) — written in the stages' own formats from untrained micro models. (The stages that
    produce them are exercised in test_stages.py; training them here would triple this file's time.)"""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO + RL)
    w = tmp_path_factory.mktemp("rl_wd")
    common.prepare_workdir(cfg, w)
    tok = common.get_tokenizer(cfg, w, load_examples(cfg, "train"))
    backbone = common.new_backbone(cfg, tok, one_rl_step())
    save_stage_model(backbone, w, "textsft_cot", kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, w, tok, one_rl_step())
    save_stage_model(lm, w, "sft", kind="latent_lm", model_cfg=lm.model_cfg)
    return cfg, w


class RecordingDecoder:
    def __init__(self):
        self.codes: list[list[int]] = []

    def decode(self, codes: list[list[int]]) -> list[str]:
        self.codes += codes
        return [f"<<{len(c)}+1={len(c) + 1}>>" for c in codes]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rl_runs_resumes_on_an_fsdp_mesh_with_other_sampling_sharding(workdir, capsys):
    cfg, w = workdir
    dec = RecordingDecoder()
    first = rl.run(cfg, w, num_steps=1, latent_decoder=dec)
    auto = "layers unstacked" if jax.default_backend() == "cpu" else "layer scan"  # the CPU's default, the GPU's
    assert f"decode loop: {auto} (sampling.unstack_layers=auto)" in capsys.readouterr().out
    assert first.step == 1 and not first.preempted
    (m1,) = _lines(w / "rl" / "metrics.jsonl")
    for k in (*rl.METRICS, "reward/process"):
        assert k in m1 and np.isfinite(m1[k]), k
    assert m1["step"] == 1 and m1["updates"] == 1  # mu = 1 epoch, one minibatch of all 8 rollouts
    # Constrained decoding closes every latent span (cap 4), so every rollout's trace was decoded.
    assert len(dec.codes) == 8 and all(1 <= len(c) <= 4 for c in dec.codes)
    assert all(0 <= k < cfg.latent.num_latents for c in dec.codes for k in c)
    assert m1["n_latents"] <= 4
    # On policy: sampler log-probs = teacher-forced recomputation = the trainer's (ratio 1, no clipping).
    assert m1["logprob_gap/max"] < 1e-3 and abs(m1["ratio_mean"] - 1) < 1e-4 and m1["clip_fraction"] == 0
    assert read_meta(w / "rl" / "final")["rl_steps"] == 1

    # Rerunning continues from the checkpoint — here on FSDP (1,8,1) training with (2,1,4) sampling.
    # a user reward from the registry rides along (weight 0: the update is unchanged, the part is logged)
    # and the rollouts decode with the layer scan (the GPU default), still on policy
    more = ["rl.process_weight=0", "rl.extra_rewards=[test_completion_share=0.0]",
            f"rl.reward_modules=[{__name__}]", "sampling.unstack_layers=off"]
    if jax.device_count() >= 8:
        more += ["mesh.fsdp=8", "rl.sample_mesh=data=2,fsdp=1,tensor=4"]
    else:
        print(f"resuming on one device: the sharded part needs 8 devices, have {jax.device_count()}")
    with open(w / "rl" / "metrics.jsonl", "a") as f:  # a row a run logged before dying, past its checkpoint
        f.write(json.dumps({"step": 2, "stale": True}) + "\n")
    second = rl.run(apply_overrides(cfg, more), w, num_steps=2)
    assert "decode loop: layer scan (sampling.unstack_layers=off)" in capsys.readouterr().out
    (m2,) = second.history
    assert m2["step"] == 2 and "reward/process" not in m2
    assert 0 <= m2["reward/test_completion_share"] <= 1
    assert m2["logprob_gap/max"] < 1e-3 and abs(m2["ratio_first_update"] - 1) < 1e-4 and m2["clip_fraction"] == 0
    lines = _lines(w / "rl" / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2] and lines[1]["updates"] == 2 and "stale" not in lines[1]
    state = json.loads((w / "rl" / "checkpoints" / "2" / "data" / "metadata").read_text())
    assert state["steps"] == 2 and state["pos"] == 4  # the prompt stream went on, not back to the start
    if jax.device_count() >= 8:
        specs = {str(x.sharding.spec) for x in jax.tree.leaves(nnx.state(second.model, nnx.Param))}
        assert any("fsdp" in s for s in specs)
    meta = read_meta(w / "rl" / "final")
    assert meta["kind"] == "latent_lm" and meta["rl_steps"] == 2

    final = load_stage_model(w, "rl", mesh=one_rl_step())[0]
    sft = load_stage_model(w, "sft", mesh=one_rl_step())[0]
    np.testing.assert_array_equal(np.asarray(final.codebook[...]), np.asarray(sft.codebook[...]))  # frozen


# ----------------------------------------------------------------------------------------------
# The loss on a plain tiny Transformer (its rollouts and the update: test_grpo_step.py).


def _loss_means(loss_fn, model):
    """Jitted `batch -> (loss_sum, weight, metric means)`."""
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda st, b: loss_fn(nnx.merge(graphdef, st), b, jax.random.key(0)))

    def call(batch):
        ls, w, met = f(state, {k: jax.numpy.asarray(v) for k, v in batch.items()})
        return float(ls), float(w), {k: float(v) / float(w) for k, v in met.items()}

    return call


class ZeroLogits:
    """A stand-in policy (uniform next-token distribution) for checks that need no real model."""

    def __call__(self, tokens, attention_mask=None):
        return jax.numpy.zeros((*tokens.shape, TOY.vocab_size))


def test_on_policy_ratio_is_one_and_loss_is_minus_mean_advantage(toy_model):  # noqa: F811
    model = toy_model
    batch, out = toy_rollouts(model, temperature=0.7)
    rs = np.random.RandomState(0)
    batch["advantages"] = rs.normal(size=len(out.tokens)).astype(np.float32)
    batch["ref_logps"] = batch["old_logps"]
    loss = _loss_means(rl.make_grpo_loss(temperature=0.7, beta=0.04), model)
    ls, w, m = loss(batch)
    cm = batch["completion_mask"]
    assert w == cm.sum()
    assert abs(m["ratio_mean"] - 1.0) < 1e-5 and m["clip_ratio/region_mean"] == 0.0 and m["kl"] < 1e-8
    n = cm.sum(1)
    np.testing.assert_allclose(ls / w, -(batch["advantages"] * n).sum() / n.sum(), rtol=1e-4, atol=1e-6)
    # Old log-probs 0.5 above the current ones: ratio e^-0.5 < 1 - 0.2, clipped where A < 0.
    _, _, m2 = loss(dict(batch, old_logps=batch["old_logps"] + 0.5 * cm))
    neg = (batch["advantages"] < 0)[:, None] * cm
    np.testing.assert_allclose(m2["clip_ratio/low_mean"], neg.sum() / cm.sum(), rtol=1e-5)
    np.testing.assert_allclose(m2["ratio_mean"], np.exp(-0.5), rtol=1e-4)
    # Other aggregations: the trainer's denominator is sequences (grpo) or sequences x budget (dr_grpo).
    uniform = dict(batch, old_logps=np.log(1 / TOY.vocab_size) * cm)  # ZeroLogits: ratio 1
    for mode, want in (("token-mean", cm.sum()), ("seq-mean-token-mean", len(cm)), ("dr_grpo", len(cm) * 6)):
        fn = rl.make_grpo_loss(temperature=0.7, beta=0.0, loss_agg_mode=mode, max_completion_length=6)
        ls_mode, w_mode, m_mode = fn(ZeroLogits(), uniform, None)
        assert float(w_mode) == want and abs(float(m_mode["ratio_mean"]) / want - 1) < 1e-5
        per_seq = -(batch["advantages"] * n)  # ratio 1: each token contributes -A
        expect = {"token-mean": per_seq.sum(), "dr_grpo": per_seq.sum(),
                  "seq-mean-token-mean": (per_seq / np.maximum(n, 1)).sum()}[mode]
        np.testing.assert_allclose(float(ls_mode), expect, rtol=1e-4, atol=1e-5)


@register_reward("test_completion_share", overwrite=True)
def _completion_share(inputs: RewardInputs) -> np.ndarray:
    """A user reward for the tests: share of the generated budget actually used."""
    m = inputs.completion_mask
    return m.sum(1) / m.shape[1]


def test_extra_rewards_are_parsed_and_checked():
    from types import SimpleNamespace as NS

    assert rl.extra_reward_weights(NS(reward_modules=(), extra_rewards=("test_completion_share=0.5",))) == {
        "test_completion_share": 0.5}
    for bad, match in [("test_completion_share", "name=weight"), ("x=abc", "name=weight"),
                       ("answer=1", "rl.answer_weight"), ("nope=1", "unknown reward 'nope'")]:
        with pytest.raises(ValueError, match=match):
            rl.extra_reward_weights(NS(reward_modules=(), extra_rewards=(bad,)))
    with pytest.raises(ModuleNotFoundError):
        rl.extra_reward_weights(NS(reward_modules=("no_such_module_xyz",), extra_rewards=()))


def test_prompt_stream_is_seeded_and_resumable():
    a = rl.PromptStream(5, 3, seed=1)
    seen = [next(a) for _ in range(2)]
    assert sorted(np.concatenate(seen)[:5].tolist()) == [0, 1, 2, 3, 4]  # one epoch before repeats
    state = a.get_state()
    want = next(a)
    b = rl.PromptStream(5, 3, seed=1)
    b.set_state(state)
    np.testing.assert_array_equal(next(b), want)
    assert b.steps == 3
    with pytest.raises(ValueError, match="different data or seed"):
        rl.PromptStream(6, 3, seed=1).set_state(state)


def test_process_reward_is_skipped_for_ids_that_are_not_the_codebooks(workdir, monkeypatch, capsys):
    cfg, w = workdir

    def no_decoder(*a, **k):
        raise AssertionError("the OCR decoder must not be loaded for step_results ids")

    monkeypatch.setattr(rl, "load_latent_decoder", no_decoder)
    other = w.parent / "rl_step_results"  # the module's workdir, before any rl run
    shutil.copytree(w, other, ignore=shutil.ignore_patterns("rl"))
    # the RL loop honours the profiler window as the Trainer's loop does (launch/profile.sh rl ...)
    res = rl.run(apply_overrides(cfg, ["latent.source=step_results", "train.rl.profile_steps=0:1"]), other,
                 num_steps=1)
    out = capsys.readouterr().out
    assert "process reward skipped: latent.source=step_results" in out
    assert "reward/process" not in res.history[0]
    assert "[rl] profile of steps 0:1" in out and list((other / "rl" / "profile").rglob("*.xplane.pb"))


def test_bad_rl_config_is_rejected(workdir):
    cfg, w = workdir
    bad = apply_overrides(cfg, ["rl.group_size=3", "train.rl.batch_size=4", "rl.temperature=0"])
    with pytest.raises(ValueError, match="divisible by train.rl.batch_size=4.*temperature"):
        rl.run(bad, w)


def test_a_step_codebook_needs_a_fixed_canvas_for_the_process_reward(workdir, tmp_path, monkeypatch):
    cfg, w = workdir
    step = ["codebook.render_unit=step"]
    assert rl.process_step_codes(cfg) is None  # render_unit chain: the span decodes as one
    assert rl.process_step_codes(apply_overrides(cfg, [*step, "codebook.min_side=64", "codebook.max_side=64"])) == 1
    fixed = apply_overrides(cfg, [*step, "codebook.min_side=128", "codebook.max_side=128"])
    assert rl.process_step_codes(fixed) == 4
    loose = apply_overrides(cfg, [*step, "codebook.min_side=64", "codebook.max_side=256"])
    keys = "codebook.min_side = codebook.max_side \\(now 64 and 256.*rl.process_weight=0"
    with pytest.raises(ConfigError, match=keys):
        rl.process_step_codes(loose)
    # refused at the start, before the workdir is touched; no process reward, nothing to refuse
    with pytest.raises(ConfigError, match="render_unit=step"):
        rl.run(loose, tmp_path / "untouched", latent_decoder=RecordingDecoder())
    assert not (tmp_path / "untouched").exists()
    with pytest.raises(ConfigError, match="render_unit=step"):  # codebook ids: the codebook's decoder would read them
        rl.run(apply_overrides(loose, ["latent.source=codebook"]), tmp_path / "untouched")

    class Built(Exception):
        pass

    def capture(*a, step_codes=None, **k):
        raise Built(step_codes)

    monkeypatch.setattr(rl, "ProcessReward", capture)  # the stage hands the scorer the codes per step
    other = w.parent / "rl_step_codebook"
    shutil.copytree(w, other, ignore=shutil.ignore_patterns("rl"))
    with pytest.raises(Built) as built:
        rl.run(fixed, other, num_steps=1, latent_decoder=RecordingDecoder())
    assert built.value.args == (4,)
