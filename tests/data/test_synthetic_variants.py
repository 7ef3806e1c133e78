import re

import pytest

from dlr_jax.data import synthetic
from dlr_jax.data.readers import load_benchmark
from dlr_jax.data.synthetic import SyntheticConfig, phrase, synthetic_splits
from dlr_jax.data.synthetic_variants import HARD, HARD_SCALE, REWORDED, hard_config, variant_split

SIZES = {"test": 120, "valid": 20, "train": 200}
NUM = re.compile(r"\d+")


def test_the_generator_keeps_its_problems_and_records_their_story():
    """The story behind each question re-phrases to the same text, and seed 0's first test problems are the
    ones every earlier run of the synthetic task trained and evaluated on (pinned text)."""
    test = synthetic_splits(SIZES, seed=0, only=["test"])["test"]
    assert all(" ".join(phrase(e.extra)) == e.question for e in test)
    assert SyntheticConfig().plain and all("reworded" not in e.extra for e in test)
    assert test[0].question == ("Leo has 5 stamps. Leo then has 9 times as many stamps. "
                                "How many stamps does Leo have now?")
    assert test[1].cot == "<<10+9=19>> <<19-3=16>> <<16*6=96>>" and test[1].answer == "96"
    assert test[1].question.startswith("Ben has 10 marbles. Ben buys 9 more marbles. Ben gives away 3 marbles.")


def test_reworded_is_the_same_test_problems_in_new_words_with_one_distractor():
    cfg = SyntheticConfig(max_steps=3)
    base = synthetic_splits(SIZES, seed=2, config=cfg, only=["test"])["test"]
    rew = variant_split(REWORDED, "test", sizes=SIZES, seed=2, config=cfg)
    assert len(rew) == len(base) == SIZES["test"]
    train = synthetic_splits(SIZES, seed=2, config=cfg)["train"]
    train_words = {w.strip(".?") for e in train for w in e.question.split()}
    unseen = 0
    for b, r in zip(base, rew, strict=True):
        assert r.id == b.id.replace("synthetic/", "synthetic_reworded/") and r.source == REWORDED
        assert (r.cot, r.answer) == (b.cot, b.answer)
        sentences = r.question.split(". ")
        assert r.question != b.question and r.question.startswith(f"At first {b.extra['name']} owns ")
        assert r.question.endswith(f"What is the number of {b.extra['item']} {b.extra['name']} owns at the end?")
        assert "How many" not in r.question and " has now" not in r.question
        # the story's numbers in order, plus exactly one: the distractor's, about someone else's same item
        at = r.extra["distractor_at"]
        distractor = sentences[at]
        other, _, count, item = distractor.rstrip(".").split(" ")
        assert other != b.extra["name"] and item == b.extra["item"] and 1 <= at <= len(sentences) - 2
        assert NUM.findall(" ".join(sentences[:at] + sentences[at + 1:])) == NUM.findall(b.question)
        assert count.isdigit()
        unseen += bool({w.strip(".?") for w in r.question.split()} - train_words)
    assert unseen == len(rew)  # every question has wording the training data never uses
    again = load_benchmark(REWORDED, split="test", sizes=SIZES, seed=2, config=cfg)
    assert again == rew  # deterministic, and the registry serves it


def test_hard_has_numbers_ten_times_as_large_and_valid_chains():
    cfg = SyntheticConfig()
    hard = variant_split(HARD, "test", sizes=SIZES, seed=1, config=cfg)
    big = hard_config(cfg)
    assert (big.max_operand, big.max_value) == (cfg.max_operand * HARD_SCALE, cfg.max_value * HARD_SCALE)
    values = []
    for e in hard:
        assert e.id.startswith("synthetic_hard/test/") and e.source == HARD
        prev = None
        for a, op, b, c in re.findall(r"<<(\d+)([-+*/])(\d+)=(\d+)>>", e.cot):
            a, b, c = int(a), int(b), int(c)
            assert {"+": a + b, "-": a - b, "*": a * b}[op] == c and 0 <= c <= big.max_value and b <= big.max_operand
            assert prev is None or a == prev
            prev = c
            values.append(c)
        assert e.answer == str(prev)
    assert max(values) > cfg.max_value  # beyond anything the base task trains on
    assert sum(v > cfg.max_value for v in values) > len(values) // 3


@pytest.mark.parametrize("name", [HARD, REWORDED])
def test_variants_are_for_evaluation_only(name):
    with pytest.raises(ValueError, match="evaluation only"):
        variant_split(name, "train", sizes=SIZES)
    with pytest.raises(ValueError, match="unknown synthetic variant"):
        variant_split("synthetic_easy", "test", sizes=SIZES)
    assert len(variant_split(name, "valid", sizes=SIZES)) == SIZES["valid"]


def test_reworded_templates_match_the_base_template_counts():
    base, reworded = synthetic.STEP_TEMPLATES, synthetic.REWORDED_STEPS
    assert {op: len(t) for op, t in reworded.items()} == {op: len(t) for op, t in base.items()}


def test_a_varied_task_mixes_both_wordings_and_distractors_over_the_base_tasks_problems():
    """data.synthetic_wording=varied / synthetic_distractor_rate: SVAMP's analogue as a training task. The
    stories (numbers, chains, answers) are the base task's; only the telling changes."""
    cfg = SyntheticConfig(wording="varied", distractor_rate=0.5)
    base = synthetic_splits(SIZES, seed=4)
    varied = synthetic_splits(SIZES, seed=4, config=cfg)
    for split in SIZES:
        assert [(e.id, e.cot, e.answer) for e in varied[split]] == [(e.id, e.cot, e.answer) for e in base[split]]
    test = varied["test"]
    flags = [f for e in test for f in e.extra["reworded"]]
    assert 0.35 < sum(flags) / len(flags) < 0.65  # each sentence in either wording
    assert 0.35 < sum("distractor_at" in e.extra for e in test) / len(test) < 0.65
    for e in test:
        told = phrase(e.extra, e.extra["reworded"])
        if "distractor_at" in e.extra:
            told.insert(e.extra["distractor_at"], e.question.split(". ")[e.extra["distractor_at"]] + ".")
        assert " ".join(told) == e.question
    assert varied == synthetic_splits(SIZES, seed=4, config=cfg)  # deterministic
    reworded = synthetic_splits(SIZES, seed=4, config=SyntheticConfig(wording="reworded"))["test"]
    assert all(e.question.startswith("At first") and "distractor_at" not in e.extra for e in reworded)


def test_the_data_section_carries_the_wording_to_every_stage():
    from dlr_jax.config import Config, DataConfig
    from dlr_jax.data.sources import load_examples

    cfg = Config(data=DataConfig(synthetic_train=60, synthetic_eval=30, synthetic_wording="reworded",
                                 synthetic_distractor_rate=1.0))
    train = load_examples(cfg, "train")
    assert len(train) == 60 and all(e.question.startswith("At first") and "distractor_at" in e.extra for e in train)


@pytest.mark.parametrize("bad", [{"wording": "shuffled"}, {"distractor_rate": 1.5}])
def test_bad_wording_settings_are_refused(bad):
    with pytest.raises(ValueError, match="wording|distractor_rate"):
        SyntheticConfig(**bad)


def test_restyled_repeats_are_still_rejected_so_no_problem_crosses_splits():
    """Duplicates are judged on the base wording: in a small problem space many draws repeat a problem, and a
    repeat told in other words (or with a distractor) must not slip into train as a 'new' problem."""
    small = SyntheticConfig(max_steps=1, max_operand=4, max_value=20)
    sizes = {"test": 100, "valid": 50, "train": 600}
    base = synthetic_splits(sizes, seed=0, config=small)
    varied = synthetic_splits(sizes, seed=0, config=SyntheticConfig(max_steps=1, max_operand=4, max_value=20,
                                                                    wording="varied", distractor_rate=0.5))
    stories = {}
    for split in sizes:
        assert [(e.id, e.cot, e.answer) for e in varied[split]] == [(e.id, e.cot, e.answer) for e in base[split]]
        stories[split] = [" ".join(phrase(e.extra)) for e in varied[split]]
    every = [q for split in sizes for q in stories[split]]
    assert len(set(every)) == len(every)  # no problem twice, within or across splits
