"""Stage codebook: alpha schedule, the skipped continuous branch, and one end-to-end run that resumes
(micro sizes, synthetic CoTs)."""

import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.sources import corpus_texts
from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
from dlr_jax.rewards.process import LatentDecoder
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.stages.codebook.models import load_codebook_model, load_latent_decoder
from tests.micro import codebook_nets

ROOT = Path(__file__).resolve().parents[3]
MICRO = [
    "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128", "codebook.max_text_len=48",
    *codebook_nets(num_queries=4),
    "latent.num_latents=16", "latent.latent_dim=16", "mesh.fsdp=1", "data.synthetic_train=48",
    "data.synthetic_eval=8", "codebook.train.batch_size=8", "codebook.train.progress=false",
    "codebook.train.async_checkpointing=false", "codebook.train.learning_rate=1e-2", "codebook.train.log_every=1",
    "codebook.train.checkpoint_every=100", "codebook.kmeans_init_batches=2", "codebook.kmeans_iters=2",
    "codebook.eval_examples=8", "codebook.eval_batch_size=8", "codebook.char_dropout=0.5",
]


def _cfg(*extra):
    return load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, *extra])


def test_alpha_schedule_and_feed():
    assert [codebook.alpha_at(s, 4) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert codebook.alpha_at(0, 0) == 0.0
    trainer = types.SimpleNamespace(step=0, cfg=types.SimpleNamespace(batch_size=2))
    batches = iter([{"images": np.zeros((2, 4, 4), np.uint8)}] * 4)
    feed = codebook._AlphaFeed(batches, trainer, alpha_steps=2)
    seen = []
    for step in range(4):
        trainer.step = step
        seen.append(next(feed).get("alpha"))
    assert np.array_equal(seen[0], [1.0, 1.0]) and np.array_equal(seen[1], [0.5, 0.5])
    assert seen[2] is None and seen[3] is None  # alpha = 0: the batch no longer asks for CE(H)


def test_continuous_branch_is_skipped_once_alpha_is_zero():
    cfg = _cfg()
    model = build_codebook_model(CodebookModelConfig.from_config(cfg), seed=0)
    texts = corpus_texts(cfg)
    plan = rp.BatchPlan(texts, batch_size=8, seed=0, config=rp.render_config(cfg.codebook), max_text_len=48)
    batch = {k: jnp.asarray(v) for k, v in rp.render_train_batch(0, None, plan=plan, rows=slice(None)).items()}
    loss = jax.jit(lambda b, r: codebook.codebook_loss(model, b, r, lambda_vq=0.25, beta=0.1, dropout=0.5))
    rng = jax.random.key(0)
    q_sum, w, met = loss(batch, rng)
    assert "ce_c" not in met
    zero_sum, w0, met0 = loss({**batch, "alpha": jnp.zeros(8)}, rng)
    np.testing.assert_allclose(zero_sum, q_sum, rtol=1e-5)  # alpha = 0 -> the quantized-branch loss
    one_sum, _, met1 = loss({**batch, "alpha": jnp.ones(8)}, rng)
    vq_term = w * 0.25 * (met["vq"] / w + 0.1 * met["commit"] / w)
    np.testing.assert_allclose(one_sum, met1["ce_q"] + met1["ce_c"] + vq_term, rtol=1e-5)
    np.testing.assert_allclose(met1["ce_q"], met["ce_q"], rtol=1e-5)
    # the compiled step without alpha does not pay for the second decoder pass
    flops = [jax.jit(lambda b: codebook.codebook_loss(model, b, rng, lambda_vq=0.25, beta=0.1, dropout=0.5)[0])
             .lower(b).cost_analysis()["flops"] for b in (batch, {**batch, "alpha": jnp.ones(8)})]
    assert flops[1] > 1.2 * flops[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, compile_cache):
    w = tmp_path_factory.mktemp("cb")
    # alpha_steps=0: the alpha branch is covered by the loss test above; each variant is a compile
    cfg = _cfg("codebook.warmup_steps=1", "codebook.alpha_steps=0", "codebook.dead_code_every=2",
               "codebook.dead_code_batches=1", "codebook.train.num_steps=3")
    first = codebook.run(cfg, w, num_steps=2)
    second = codebook.run(cfg, w)
    return cfg, w, first, second


def test_stage_writes_artifacts(run_dir):
    cfg, w, _, report = run_dir
    out = w / "codebook"
    cb = np.load(out / "codebook.npy")
    assert cb.shape == (16, 16) and np.all(np.isfinite(cb))
    saved = json.loads((out / "report.json").read_text())
    h = saved["held_out"]
    assert saved["steps"] == 3 and saved["K"] == 16 and h["examples"] == 8
    assert 0 <= h["cer_true"] and 0 <= h["cer_shuffled"] and 1 <= h["perplexity"] <= 16
    assert 1 <= h["used_codes"] <= 16 and h["mean_n"] == 4.0
    meta = json.loads((out / "final" / "meta.json").read_text())
    assert meta["kind"] == "codebook" and CodebookModelConfig.from_dict(meta["model"]).num_codes == 16
    model = load_codebook_model(w)
    np.testing.assert_array_equal(np.asarray(model.vq.codebook[...]), cb)


def test_stage_resumed_and_refreshed_codes(run_dir):
    _, w, first, second = run_dir
    steps = [json.loads(line)["step"] for line in (w / "codebook" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # the second run continued from the step-2 checkpoint
    assert first["steps"] == 2 and second["steps"] == 3
    # the refresh due at step 2 runs in the resumed run, before step 3 (the first run stopped at 2)
    assert [s for s, _ in second["dead_code_refreshes"]] == [2]
    metrics = [json.loads(line) for line in (w / "codebook" / "metrics.jsonl").read_text().splitlines()]
    assert all("ce_q" in m and "ce_c" not in m for m in metrics)  # alpha_steps=0: never CE(H)
    warm = [json.loads(line) for line in (w / "codebook" / "warmup" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in warm] == [1] and "ce_c" in warm[0] and "ce_q" not in warm[0]


def test_checkpoint_report_matches_the_final_report(run_dir, capsys):
    """`python -m dlr_jax.stages.codebook.report` on the last checkpoint gives the numbers the finished
    stage wrote (same model, CoTs and shuffle); an earlier step can be asked for."""
    from dlr_jax.stages.codebook import report as codebook_report
    _, w, _, _ = run_dir
    final = json.loads((w / "codebook" / "report.json").read_text())["held_out"]
    assert codebook_report.main(["--workdir", str(w)]) == 0
    got = json.loads((w / "codebook" / "report_step3.json").read_text())
    assert got["step"] == 3 and "CER true=" in capsys.readouterr().out
    for k in ("examples", "cer_true", "cer_shuffled", "cer_continuous", "final_number_true",
              "final_number_shuffled", "perplexity", "used_codes"):
        assert got[k] == pytest.approx(final[k], abs=1e-6), k
    assert codebook_report.checkpoint_report(w, step=2, examples=4)["step"] == 2
    with pytest.raises(FileNotFoundError, match="no main-phase checkpoint at step 7"):
        codebook_report.checkpoint_report(w, step=7)


def test_latent_decoder_from_the_stage(run_dir):
    cfg, w, _, _ = run_dir
    dec = load_latent_decoder(cfg, w)
    assert isinstance(dec, LatentDecoder)
    out = dec.decode([[0, 1, 2, 3], [5], []])
    assert len(out) == 3 and all(isinstance(s, str) for s in out) and out[2] == ""
    assert load_latent_decoder(cfg, w / "nowhere") is None


def test_sigterm_in_warmup_stops_the_stage(tmp_path, monkeypatch):
    """A preempted warm-up must end the run (the next one resumes it), not go on to k-means and the
    main phase with a half-trained encoder."""
    from dlr_jax.training.trainer import Trainer, TrainResult

    def preempted_fit(self, data, num_steps=None, resume=True):
        assert self.name == "codebook-warmup", f"{self.name} ran after a preempted warm-up"
        return TrainResult(None, 0, True, [])

    monkeypatch.setattr(Trainer, "fit", preempted_fit)
    out = codebook.run(_cfg("codebook.warmup_steps=2", "codebook.train.num_steps=2"), tmp_path)
    assert out == {"preempted": True, "phase": "warmup", "step": 0}
    assert not (tmp_path / "codebook" / "final").exists() and not (tmp_path / "codebook" / "codebook.npy").exists()


@pytest.mark.parametrize("warm_drop, expect", [(None, 0.5), (1.0, 1.0)])
def test_warmup_char_dropout(tmp_path, monkeypatch, warm_drop, expect):
    """The warm-up's teacher-forced inputs lose codebook.warmup_char_dropout of their characters
    (default: char_dropout, 0.5 in MICRO)."""
    from dlr_jax.training.trainer import Trainer, TrainResult

    seen = {}

    def fit(self, data, num_steps=None, resume=True):
        seen[self.name] = self.loss_fn.keywords["dropout"]
        return TrainResult(None, 0, True, [])  # stop after the warm-up

    monkeypatch.setattr(Trainer, "fit", fit)
    # null: unset, whatever configs/tiny.yaml says
    extra = ["codebook.warmup_char_dropout=" + ("null" if warm_drop is None else str(warm_drop))]
    codebook.run(_cfg("codebook.warmup_steps=2", *extra), tmp_path)
    assert seen == {"codebook-warmup": expect}


@pytest.mark.parametrize("piece_chars", [0, 12])
def test_warmup_piece_chars(tmp_path, monkeypatch, piece_chars):
    """codebook.warmup_piece_chars > 0 trains the warm-up on short whole-word pieces of the corpus
    CoTs (nothing else of them); the main phase and k-means still see whole CoTs."""
    from dlr_jax.data import render_pipeline as rp
    from dlr_jax.training.trainer import Trainer, TrainResult

    seen = {}
    real = rp.make_render_dataset

    def record(plan, **kw):
        seen.setdefault("plans", []).append(list(plan.texts))
        return real(plan, **kw)

    def fit(self, data, num_steps=None, resume=True):
        seen[self.name] = len(seen["plans"])
        return TrainResult(None, 0, True, [])  # stop after the warm-up

    monkeypatch.setattr(rp, "make_render_dataset", record)
    monkeypatch.setattr(Trainer, "fit", fit)
    cfg = _cfg("codebook.warmup_steps=2", f"codebook.warmup_piece_chars={piece_chars}")
    codebook.run(cfg, tmp_path)
    cots = corpus_texts(cfg)
    assert seen["codebook-warmup"] == 1
    warm_texts = seen["plans"][0]
    if piece_chars == 0:
        assert warm_texts == cots
    else:
        assert warm_texts == [p for t in cots for p in rp.cot_pieces(t, piece_chars)]
        assert len(warm_texts) > len(cots)
        assert all(len(p) <= piece_chars or " " not in p for p in warm_texts)


def test_warmup_whole_steps_follow_the_pieces(tmp_path, monkeypatch):
    """codebook.warmup_whole_steps: a second continuous warm-up, on whole CoTs, after the piece warm-up,
    in its own resumable directory; SIGTERM there stops the stage with phase "warmup_whole"."""
    from dlr_jax.training.trainer import Trainer, TrainResult

    plans, fits = [], []
    real = rp.make_render_dataset

    def record(plan, **kw):
        plans.append(list(plan.texts))
        return real(plan, **kw)

    def fit(self, data, num_steps=None, resume=True):
        fits.append((self.name, num_steps, len(plans), self.dir.name))
        return TrainResult(self.model, num_steps, self.name == "codebook-warmup-whole", [])

    monkeypatch.setattr(rp, "make_render_dataset", record)
    monkeypatch.setattr(Trainer, "fit", fit)
    cfg = _cfg("codebook.warmup_steps=2", "codebook.warmup_piece_chars=12", "codebook.warmup_whole_steps=3")
    out = codebook.run(cfg, tmp_path)
    assert out == {"preempted": True, "phase": "warmup_whole", "step": 3}
    assert fits == [("codebook-warmup", 2, 1, "warmup"), ("codebook-warmup-whole", 3, 2, "warmup_whole")]
    cots = corpus_texts(cfg)
    assert plans[0] == [p for t in cots for p in rp.cot_pieces(t, 12)]
    assert plans[1] == cots
