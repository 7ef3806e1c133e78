import json

import pytest

from dlr_jax.eval import cli as ev_cli
from dlr_jax.eval.aggregate import aggregate, results_file


def _write(w, stage, pass_at_1, length, mode="latent", benches=("gsm8k", "svamp")):
    f = results_file(w, stage)
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"mode": mode, "benchmarks": {
        b: {"n": 10, "pass_at_1": {"mean": pass_at_1 + i / 10}, "L": {"mean": length},
            "n_latents": {"mean": length}, "gen_tokens": {"mean": length + 5}} for i, b in enumerate(benches)}}))


def test_aggregate_is_mean_and_population_std_over_runs(tmp_path, capsys):
    for i, (p, n) in enumerate([(0.4, 6.0), (0.5, 7.0), (0.6, 8.0)]):
        _write(tmp_path / f"s{i}", "rl", p, n)
    out = tmp_path / "agg.json"
    agg = ev_cli.main(["--aggregate", *(str(tmp_path / f"s{i}") for i in range(3)), "--stage", "rl", "--out", str(out)])
    g = agg["benchmarks"]["gsm8k"]
    assert g["pass_at_1"]["mean"] == pytest.approx(0.5) and g["pass_at_1"]["std"] == pytest.approx((2 / 300) ** 0.5)
    assert g["L"]["per_run"] == [6.0, 7.0, 8.0]
    assert agg["benchmarks"]["svamp"]["pass_at_1"]["mean"] == pytest.approx(0.6)
    assert json.loads(out.read_text()) == agg
    assert "gsm8k" in capsys.readouterr().out


def test_aggregate_refuses_mismatched_runs(tmp_path):
    _write(tmp_path / "a", "rl", 0.4, 6.0)
    _write(tmp_path / "b", "rl", 0.4, 6.0, benches=("gsm8k",))
    with pytest.raises(ValueError, match="differ from"):
        aggregate([tmp_path / "a", tmp_path / "b"], "rl")
    with pytest.raises(FileNotFoundError, match="results.json: not found"):
        aggregate([tmp_path / "a", tmp_path / "c"], "rl")


def test_a_damaged_or_foreign_results_file_is_named(tmp_path):
    """A results.json cut short (a full disk) or not written by evaluate names its file, not a bare
    JSONDecodeError or KeyError."""
    from dlr_jax.eval.aggregate import ResultsFileError

    _write(tmp_path / "a", "rl", 0.4, 6.0)
    _write(tmp_path / "b", "rl", 0.4, 6.0)
    cut = results_file(tmp_path / "b", "rl")
    cut.write_text(cut.read_text()[:40])
    with pytest.raises(ResultsFileError, match=rf"{cut}:1: expected results.json as `python -m dlr_jax.evaluate`"):
        aggregate([tmp_path / "a", tmp_path / "b"], "rl")
    cut.write_text(json.dumps({"mode": "latent", "benchmarks": {"gsm8k": {"n": 10, "L": {"mean": 1.0}}}}))
    with pytest.raises(ResultsFileError, match=rf"{cut}: .*benchmark 'gsm8k' has no 'n' and 'pass_at_1.mean'"):
        aggregate([tmp_path / "a", tmp_path / "b"], "rl")
