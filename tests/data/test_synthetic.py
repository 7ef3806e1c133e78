import re

import pytest

from dlr_jax.data import synthetic
from dlr_jax.data.gsm8k_aug import read_gsm8k_aug
from dlr_jax.data.synthetic import SyntheticConfig, generate, synthetic_splits

EQ = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>")


def check_chain(ex, cfg: SyntheticConfig):
    """Each equation is correct, starts from the previous result, and ends at the answer."""
    eqs = [EQ.fullmatch(t).groups() for t in ex.cot.split(" ")]
    assert cfg.min_steps <= len(eqs) <= cfg.max_steps
    prev = None
    for a, op, b, c in eqs:
        a, b, c = int(a), int(b), int(c)
        if op == "/":
            assert a % b == 0, "division must be exact"
        assert {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else None}[op] == c
        assert 0 <= c <= cfg.max_value and cfg.min_operand <= b <= cfg.max_operand
        if prev is not None:
            assert a == prev
        prev = c
        assert f" {b} " in ex.question, "every operand is stated in the question"
    assert ex.answer == str(prev)
    assert ex.question.startswith(f"{ex.question.split()[0]} has {eqs[0][0]} ")


def test_deterministic_and_seed_dependent():
    a, b, c = generate(50, seed=0), generate(50, seed=0), generate(50, seed=1)
    assert a == b
    assert [e.question for e in a] != [e.question for e in c]


@pytest.mark.parametrize(
    "cfg",
    [
        SyntheticConfig(),
        SyntheticConfig(min_steps=3, max_steps=3, ops=("+", "-", "*", "/"), max_operand=12, max_value=500),
        SyntheticConfig(min_steps=1, max_steps=2, ops=("/", "+"), min_operand=2),
    ],
)
def test_chains_are_valid(cfg):
    exs = generate(300, seed=7, config=cfg)
    for ex in exs:
        check_chain(ex, cfg)
    used = {op for ex in exs for op in ex.extra["ops"]}
    assert used == set(cfg.ops)
    assert {ex.extra["steps"] for ex in exs} == set(range(cfg.min_steps, cfg.max_steps + 1))


def test_small_vocabulary():
    words = {
        w.strip(".?") for ex in generate(2000, seed=0) for w in ex.question.split() if not w[0].isdigit()
    }
    assert len(words) < 60


def test_splits_disjoint_and_stable():
    sizes = {"test": 100, "valid": 20, "train": 500}
    s = synthetic_splits(sizes, seed=0)
    qs = [e.question for split in s.values() for e in split]
    assert len(qs) == len(set(qs)) == 620
    bigger = synthetic_splits({**sizes, "train": 800}, seed=0)
    assert bigger["test"] == s["test"] and bigger["valid"] == s["valid"]
    only_test = synthetic_splits(sizes, seed=0, only=["test"])
    assert list(only_test) == ["test"] and only_test["test"] == s["test"]


def test_too_small_space_raises():
    cfg = SyntheticConfig(min_steps=1, max_steps=1, min_operand=1, max_operand=1, ops=("+",), max_value=5)
    with pytest.raises(RuntimeError, match="could not draw"):
        synthetic_splits({"test": 1000}, config=cfg, max_tries_factor=2)


def test_bad_config():
    with pytest.raises(ValueError, match="ops must be"):
        SyntheticConfig(ops=("^",))
    with pytest.raises(ValueError, match="min_steps"):
        SyntheticConfig(min_steps=3, max_steps=2)


def test_cli_writes_gsm8k_aug(tmp_path, capsys):
    synthetic.main(
        [
            "--out",
            str(tmp_path),
            "--train",
            "30",
            "--valid",
            "5",
            "--test",
            "10",
            "--seed",
            "2",
            "--ops",
            "+-*/",
            "--max-steps",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert "wrote 30 train problems" in out
    back = read_gsm8k_aug(tmp_path / "train.txt", split="train", source="synthetic")
    assert len(back) == 30
    cfg = SyntheticConfig(max_steps=3, ops=("+", "-", "*", "/"))
    for ex in back:
        check_chain(ex, cfg)


@pytest.mark.parametrize("cfg", [SyntheticConfig(),
                                 SyntheticConfig(min_steps=3, max_steps=6, ops=("+", "-", "*", "/"))])
def test_natural_chains_tell_the_same_problems_step_by_step(cfg):
    """data.synthetic_cot_style=natural (GSM8K-Aug-NL's analogue): the same questions, ids and answers as the
    equation style; each step a sentence carrying that step's annotation, in order, so the annotations joined are
    the equation chain (and the `results` render view reads the same numbers); the last sentence says the answer."""
    import dataclasses

    from dlr_jax.data.cot_view import cot_view

    sizes = {"test": 40, "train": 60}
    eq = synthetic_splits(sizes, seed=3, config=cfg)
    nat = synthetic_splits(sizes, seed=3, config=dataclasses.replace(cfg, cot_style="natural"))
    for split in sizes:
        for e, n in zip(eq[split], nat[split], strict=True):
            assert (n.id, n.question, n.answer) == (e.id, e.question, e.answer)
            check_chain(e, cfg)
            assert " ".join(re.findall(r"<<[^>]*>>", n.cot)) == e.cot
            sentences = re.split(r"(?<=\.) ", n.cot)
            assert len(sentences) == len(e.cot.split(" ")) + 1  # a sentence a step, then the closing one
            for sentence, (a, op, b, c) in zip(sentences, EQ.findall(e.cot), strict=False):
                assert f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c} " in sentence  # GSM8K's "48/2 = <<48/2=24>>24 clips"
            assert sentences[-1] == f"So {e.extra['name']} has {e.answer} {e.extra['item']} at the end."
            assert cot_view(n.cot, "results") == cot_view(e.cot, "results")
    assert nat == synthetic_splits(sizes, seed=3, config=dataclasses.replace(cfg, cot_style="natural"))


def test_natural_chains_are_several_times_the_equation_chains_as_gsm8ks_solutions_are():
    """Why the style exists: a chain of GSM8K's length. GSM8K's solutions are 6.6x the characters of their
    annotations; the natural synthetic chain is 5-8x its equation chain (the share of the closing sentence falls
    with the number of steps)."""
    for lo, hi in ((1, 4), (3, 6)):
        eq = generate(300, seed=0, config=SyntheticConfig(min_steps=lo, max_steps=hi))
        nat = generate(300, seed=0, config=SyntheticConfig(min_steps=lo, max_steps=hi, cot_style="natural"))
        ratio = sum(len(e.cot) for e in nat) / sum(len(e.cot) for e in eq)
        assert 5.0 < ratio < 8.0, (lo, hi, ratio)


def test_the_data_section_chooses_the_chain_style():
    from dlr_jax.config import Config, ConfigError, DataConfig
    from dlr_jax.data.sources import load_examples
    from dlr_jax.data.synthetic_variants import VARIANTS

    cfg = Config(data=DataConfig(synthetic_train=30, synthetic_eval=10, synthetic_cot_style="natural"))
    for split in ("train", "test"):
        assert all(ex.cot.endswith(" at the end.") and "<<" in ex.cot for ex in load_examples(cfg, split))
    for variant in VARIANTS:  # the evaluation-only analogues of GSM-Hard and SVAMP keep the style
        assert all(ex.cot.endswith(" at the end.") for ex in load_examples(cfg, "test", benchmark=variant))
    with pytest.raises(ValueError, match="cot_style must be one of"):
        SyntheticConfig(cot_style="prose")
    with pytest.raises(ConfigError, match=r"data\.synthetic_cot_style must be equations\|natural, got 'prose'"):
        DataConfig(synthetic_cot_style="prose")
    with pytest.raises(ConfigError, match="applies to data.dataset=synthetic, not 'gsm8k'"):
        DataConfig(dataset="gsm8k", synthetic_cot_style="natural")
