"""The training loop: accumulation, filters, sharding, exact resume, divergence guard."""

import dataclasses

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.core import sharding as sh
from dlr_jax.models.transformer import Transformer
from dlr_jax.training.trainer import TrainConfig, Trainer, TrainingDiverged

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8
)
TCFG = TrainConfig(
    learning_rate=1e-2,
    batch_size=8,
    num_steps=6,
    log_every=1,
    checkpoint_every=100,
    progress=False,
    async_checkpointing=False,
)


def lm_loss(model, batch, rng):
    logits = model(batch["tokens"][:, :-1])
    targets = batch["tokens"][:, 1:]
    mask = batch["mask"][:, 1:].astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    return jnp.sum(nll * mask), jnp.sum(mask), {"nll": jnp.sum(nll * mask)}


def dataset(seed=0, n=64):
    rs = np.random.RandomState(seed)
    toks = rs.randint(0, 64, (n, 12)).astype(np.int32)
    lens = rs.randint(4, 13, n)
    mask = (np.arange(12)[None] < lens[:, None]).astype(np.int32)
    ds = grain.MapDataset.source(list(range(n))).shuffle(seed=1).repeat(None)
    ds = ds.map(lambda i: {"tokens": toks[i], "mask": mask[i]}).batch(8)
    return ds.to_iter_dataset()


def params_of(model):
    return jax.tree.map(np.asarray, nnx.state(model, nnx.Param))


def new_model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def assert_trees_close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, atol=atol)


def test_loss_decreases_and_metrics_written(tmp_path):
    res = Trainer(new_model(), lm_loss, dataclasses.replace(TCFG, num_steps=20), tmp_path).fit(
        iter(dataset())
    )
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 20 and '"grad_norm"' in lines[0]


def test_gradient_accumulation_uses_a_global_token_denominator(tmp_path):
    # Micro-batches have different token counts, so averaging per-micro-batch means would differ.
    # SGD keeps the update linear in the gradient (Adam's first step is ~sign(g), which turns
    # summation-order noise on near-zero gradients into visible parameter differences).
    cfg = dataclasses.replace(TCFG, num_steps=2, optimizer="sgd", learning_rate=0.5)
    a = Trainer(new_model(), lm_loss, cfg, tmp_path / "a").fit(iter(dataset()))
    b = Trainer(new_model(), lm_loss, dataclasses.replace(cfg, grad_accum=4), tmp_path / "b").fit(
        iter(dataset())
    )
    assert_trees_close(params_of(a.model), params_of(b.model), atol=1e-6)
    np.testing.assert_allclose(a.history[0]["loss"], b.history[0]["loss"], rtol=1e-6)


def _step_while_loops(tmp_path, grad_accum):
    tr = Trainer(new_model(), lm_loss, dataclasses.replace(TCFG, grad_accum=grad_accum), tmp_path)
    batch = tr.device_batch(next(iter(dataset())))
    args = (tr.params, tr.rest, tr.opt_state, batch, tr.rng, jnp.int32(0))
    return tr._build_step().lower(*args).as_text().count("stablehlo.while")


def test_single_micro_batch_step_is_not_wrapped_in_a_loop(tmp_path):
    # XLA:CPU runs the codebook step several times slower inside a length-1 scan than as straight-line code, so
    # grad_accum=1 must not loop over micro-batches (the model's own layer scans stay).
    one, four = _step_while_loops(tmp_path / "1", 1), _step_while_loops(tmp_path / "4", 4)
    assert one < four, (one, four)


def test_trainable_filter_freezes_everything_else(tmp_path):
    model = new_model()
    before = params_of(model)
    only_mlp = nnx.All(nnx.Param, nnx.PathContains("gate_proj"))
    res = Trainer(model, lm_loss, dataclasses.replace(TCFG, num_steps=2), tmp_path, trainable=only_mlp).fit(
        iter(dataset())
    )
    after = params_of(res.model)
    assert not np.allclose(before["layers"]["gate_proj"], after["layers"]["gate_proj"])
    for name in ("q_proj", "up_proj", "down_proj"):
        np.testing.assert_array_equal(before["layers"][name], after["layers"][name])
    np.testing.assert_array_equal(before["embed"], after["embed"])


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    full = Trainer(new_model(), lm_loss, TCFG, tmp_path / "full").fit(iter(dataset()))
    # "Killed" after 3 steps: a checkpoint every step, the process stops, a new one resumes.
    cfg = dataclasses.replace(TCFG, checkpoint_every=1)
    Trainer(new_model(), lm_loss, cfg, tmp_path / "r").fit(iter(dataset()), num_steps=3)
    resumed = Trainer(new_model(), lm_loss, cfg, tmp_path / "r").fit(iter(dataset()))
    assert resumed.step == 6
    assert_trees_close(params_of(full.model), params_of(resumed.model), atol=1e-6)
    assert [h["loss"] for h in resumed.history] == pytest.approx(
        [h["loss"] for h in full.history[3:]], abs=1e-6
    )


def test_non_finite_loss_stops_with_a_clear_message(tmp_path):
    def bad_loss(model, batch, rng):
        ls, w, m = lm_loss(model, batch, rng)
        return ls * jnp.nan, w, m

    with pytest.raises(TrainingDiverged, match="non-finite loss.*Last good checkpoint"):
        Trainer(new_model(), bad_loss, TCFG, tmp_path).fit(iter(dataset()))


def test_bad_batch_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        Trainer(new_model(), lm_loss, dataclasses.replace(TCFG, grad_accum=3), tmp_path)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices (XLA_FLAGS)")
def test_sharded_step_equals_single_device_step(tmp_path):
    cfg = dataclasses.replace(CFG, hidden_size=64, num_heads=8, num_kv_heads=8, intermediate_size=128)
    tcfg = dataclasses.replace(TCFG, num_steps=2, optimizer="sgd", learning_rate=0.5)
    single = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)), lm_loss, tcfg, tmp_path / "1").fit(iter(dataset()))
    mesh = sh.make_mesh(2, 2, 2)
    model = sh.create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    tr = Trainer(model, lm_loss, tcfg, tmp_path / "8", mesh=mesh)
    assert tr.params["layers"]["q_proj"].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor", None
    )
    sharded = tr.fit(iter(dataset()))
    assert_trees_close(params_of(single.model), params_of(sharded.model), atol=1e-5)
    assert sh.sharded_fraction(nnx.state(sharded.model, nnx.Param)) > 0.9


class _TwoParts(nnx.Module):
    def __init__(self):
        self.lm = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        self.ocr = nnx.Linear(2, 2, rngs=nnx.Rngs(1))


def test_trainer_clip_group_keeps_one_part_from_shrinking_the_other(tmp_path):
    """sft's dual branch passes clip_group (OCR params vs the LM): huge OCR gradients must leave the
    LM's step as it is."""
    cfg = TrainConfig(learning_rate=1.0, warmup_ratio=0.0, optimizer="sgd", grad_clip=1.0, num_steps=10,
                      batch_size=1, progress=False, async_checkpointing=False)
    group = lambda path: "ocr" if "ocr" in path else "lm"  # noqa: E731  (what latent_common passes)
    steps = {}
    for name, cg in (("grouped", group), ("global", None)):
        tr = Trainer(_TwoParts(), lambda m, b, r: (0.0, 1.0, {}), cfg, tmp_path / name, clip_group=cg)
        grads = jax.tree_util.tree_map_with_path(
            lambda p, x: jnp.full_like(x, 100.0 if "ocr" in str(p) else 0.01), tr.params)
        upd, _ = tr.tx.update(grads, tr.opt_state, tr.params)
        steps[name] = upd
    lm_kernel = lambda u: np.asarray(u["lm"]["kernel"][...])  # noqa: E731
    np.testing.assert_allclose(lm_kernel(steps["grouped"]), -0.01, rtol=1e-6)  # sgd at lr 1: -grad, unclipped
    assert np.all(np.abs(lm_kernel(steps["global"])) < 1e-4)  # one global norm: the OCR part shrank it
    ocr = jax.tree.leaves(steps["grouped"]["ocr"])
    assert float(np.sqrt(sum(np.sum(np.square(x)) for x in ocr))) == pytest.approx(1.0, rel=1e-5)


def _bytes_on(tree, device) -> int:
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices (XLA_FLAGS)")
def test_optimizer_state_is_born_sharded_like_its_parameters(tmp_path):
    """Every AdamW moment carries its parameter's sharding (count/scalars replicated), at creation and
    after a restore, so device 0 holds ~1/8 of the optimizer state on an fsdp=8 mesh, not all of it."""
    cfg = dataclasses.replace(CFG, hidden_size=64, num_heads=8, num_kv_heads=8, intermediate_size=128)
    mesh = sh.make_mesh(1, 8, 1)
    tcfg = dataclasses.replace(TCFG, num_steps=1, checkpoint_every=1)

    def check(tr):
        p_sh = jax.tree.map(lambda x: x.sharding, tr.params)
        adam = tr.opt_state[1][0]  # chain(clip, adamw) -> adamw = chain(scale_by_adam, ...)
        for moment in (adam.mu, adam.nu):
            for m, s in zip(jax.tree.leaves(moment), jax.tree.leaves(p_sh), strict=True):
                assert m.sharding.is_equivalent_to(s, m.ndim), (m.sharding, s)
        assert adam.count.sharding.is_fully_replicated
        dev0 = mesh.devices.flat[0]
        total = sum(x.nbytes for x in jax.tree.leaves(tr.opt_state))
        frac = _bytes_on(tr.opt_state, dev0) / total
        # 1/8 plus the replicated norm scales (the only vectors): 0.128 on this config (main: 1.0).
        assert frac < 0.14, frac
        # and exactly twice the parameter bytes (mu + nu) plus two int32 step counts (adam, schedule)
        assert _bytes_on(tr.opt_state, dev0) == 2 * _bytes_on(tr.params, dev0) + 2 * 4

    model = sh.create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    tr = Trainer(model, lm_loss, tcfg, tmp_path, mesh=mesh)
    check(tr)
    tr.fit(iter(dataset()))
    check(tr)  # the jitted step keeps them
    model = sh.create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    again = Trainer(model, lm_loss, tcfg, tmp_path, mesh=mesh)
    assert again.restore()
    check(again)
