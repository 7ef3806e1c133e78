"""Answer extraction and scoring (dlr_jax/text/answers.py): numeric (incl. GSM-Hard float-artifact golds),
MATH, and R_ans; and that dlr_jax.rewards.answer_format re-exports them."""

import json
import threading

import numpy as np
import pytest

from dlr_jax.rewards import answer_format as rewards
from dlr_jax.text import answers
from dlr_jax.text.answers import KNOWN_BENCHMARKS, answer_reward, extract_answer, is_correct


def test_rewards_reexports_the_answer_functions():
    for name in ("KNOWN_BENCHMARKS", "answer_reward", "extract_answer", "is_correct"):
        assert getattr(rewards, name) is getattr(answers, name)


# ------------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    "text, want",
    [
        ("<answer>42</answer>", "42"),
        ("<answer> -3 ", "-3"),  # missing </answer> at end of text
        ("<answer>1</answer> then <answer>$1,000.</answer>", "1000"),  # last span wins
        ("<answer>7</answer> The answer is 9. #### 11", "7"),  # tags beat markers
        ("The answer is 9. \\boxed{12}", "12"),  # boxed beats textual markers
        ("#### 5\nThe answer is 6", "6"),  # last marker wins
        ("answer: 3 and later 99", "3"),  # marker beats last number
        ("she has 5-3 = 2 apples", "2"),  # fallback: last number, binary minus is not a sign
        ("x = -3", "-3"),
        ("The answer is 50%.", "50"),
        ("#### 1,000", "1000"),
        ("It costs $5.", "5"),
        ("The answer is \\$5", "5"),
        ("The final answer is: **-7**", "-7"),
        ("Answer: 3/4", "3/4"),
        ("The answer is 42 because 6*7", "42"),
        ("Total 18.0.", "18.0"),
        ("#### 18\nmore text 99", "18"),
        ("<answer>42<|eot_id|>", "42"),
        ("so he has \\boxed{\\frac{1}{2}} left", "\\frac{1}{2}"),
        ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # nested braces
        ("answer: (1,2]", "(1,2]"),  # interval commas survive
        ("The answer is 2\\sqrt{2}", "2\\sqrt{2}"),  # not cut to the leading "2"
        ("<answer></answer> 5", None),  # an explicit empty answer is no answer
        ("nothing numeric here", None),
        ("", None),
    ],
)
def test_extract_answer(text, want):
    assert extract_answer(text) == want


# -------------------------------------------------------------------------------------- numeric scoring


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("18.0", "18", True),
        ("18", "18.0", True),
        ("18.01", "18", False),
        ("1,000", "1000", True),
        ("$5", "5", True),
        ("50%", "50", True),
        ("-3", "3", False),
        ("-3", "-3", True),
        ("3/4", "0.75", True),
        ("\\frac{3}{4}", "0.75", True),
        ("-\\dfrac{3}{4}", "-0.75", True),
        ("0.76", "0.75", False),
        ("18 apples", "18", True),  # not a bare number: its last number
        ("6*7 = 42", "42", True),
        ("abc", "5", False),
        ("1e999999999", "5", False),  # rejected before Fraction() builds a huge integer
        ("5/0", "5", False),
    ],
)
def test_numeric_is_correct(pred, gold, ok):
    assert is_correct(pred, gold, "gsm8k") is ok


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("3244047.1", "3244047.0999999996", True),
        ("3244047.10", "3244047.0999999996", True),
        ("3244047.0999999996", "3244047.0999999996", True),
        ("3244047.2", "3244047.0999999996", False),
        ("3244047", "3244047.0999999996", False),
        ("0.3", "0.30000000000000004", True),
        ("0.31", "0.30000000000000004", False),
        ("14053029.67", "14053029.666666666", True),  # rounded to the cent
        ("14053029.667", "14053029.666666666", True),
        ("14053029.66", "14053029.666666666", False),  # truncation is not rounding
        ("14053029.7", "14053029.666666666", False),
        ("42159089/3", "14053029.666666666", True),  # the exact value
        ("55938720", "55938720.00000001", True),
        ("-1895420.5", "-1895420.4999999998", True),
        ("9284017268534", "9284017268534.4", False),  # 0.01 cap: no rounding to an integer
        ("0.333333333", "1/3", False),  # an exact fraction gold is not a float artifact
        ("1/3", "1/3", True),
    ],
)
def test_float_artifact_golds(pred, gold, ok):
    assert is_correct(pred, gold, "gsm_hard") is ok


def test_none_prediction_unknown_benchmark_and_bad_gold():
    assert is_correct(None, "18", "gsm8k") is False
    assert is_correct("  ", "18", "svamp") is False
    with pytest.raises(ValueError, match=r"unknown benchmark 'gsm9k'; known: .*gsm8k.*math500"):
        is_correct("1", "1", "gsm9k")
    with pytest.raises(ValueError, match="gold answer 'seven' is not a number"):
        is_correct("7", "seven", "multiarith")
    assert set(KNOWN_BENCHMARKS) >= {"gsm8k", "gsm8k_aug", "gsm_hard", "svamp", "multiarith", "math500"}


def test_real_numeric_golds_score_themselves(data_dir):
    """Every gold of the shipped numeric benchmarks parses, matches itself, and rejects gold + 1."""
    cases = []
    for line in (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines():
        ans = json.loads(line)["answer"]
        cases.append(("gsm8k", ans, ans.split("####")[-1].strip()))
    for line in (data_dir / "gsm8k_aug" / "test.txt").read_text().splitlines():
        rest = line.split("||", 1)[1]
        cases.append(("gsm8k_aug", rest, rest.split("####")[-1].strip()))
    assert len(cases) == 2 * 1319
    for bench, solution, gold in cases:
        assert is_correct(extract_answer(solution), gold, bench), (bench, solution[-60:], gold)
    for line in (data_dir / "gsm_hard" / "gsmhardv2.jsonl").read_text().splitlines():
        gold = repr(json.loads(line)["target"])
        assert is_correct(gold, gold, "gsm_hard") and not is_correct(repr(float(gold) + 1), gold, "gsm_hard")
    for rec in json.loads((data_dir / "svamp" / "SVAMP.json").read_text()):
        assert is_correct(str(rec["Answer"]), str(rec["Answer"]), "svamp")
    for rec in json.loads((data_dir / "multiarith" / "MultiArith.json").read_text()):
        assert is_correct(str(rec["lSolutions"][0]), str(rec["lSolutions"][0]), "multiarith")


# ----------------------------------------------------------------------------------------------- MATH


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("0.5", "\\frac{1}{2}", True),
        ("\\frac12", "\\dfrac{1}{2}", True),
        ("1/2", "\\frac{1}{2}", True),
        ("\\frac{1}{3}", "\\frac{1}{2}", False),
        ("(1,2]", "(1,2]", True),
        ("[1,2]", "(1,2]", False),
        ("(1,2)", "(1,2]", False),
        ("\\boxed{\\frac{14}{3}}", "\\frac{14}{3}", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("1+x^2", "x^2+1", True),
        ("-3", "3", False),
        ("C", "\\text{(C)}", True),
        ("\\text{odd}", "{\\rm odd}", True),  # sympy cannot parse the gold: normalised string match
        ("\\text{even}", "{\\rm odd}", False),
    ],
)
def test_math_is_correct(pred, gold, ok):
    assert is_correct(pred, gold, "math500") is ok


def test_math_works_off_the_main_thread():
    """math-verify's default timeouts use signals; with them off it must work in worker threads."""
    results: dict[str, bool] = {}

    def work():
        results["half"] = is_correct("0.5", "\\frac{1}{2}", "math")
        results["interval"] = is_correct("[2,5)", "x \\in [2,5)", "math")
        results["wrong"] = is_correct("\\frac{1}{3}", "\\frac{1}{2}", "math")

    th = threading.Thread(target=work)
    th.start()
    th.join(timeout=120)
    assert not th.is_alive()
    assert results == {"half": True, "interval": True, "wrong": False}


def test_math500_solutions_score_their_answers(data_dir):
    """extract_answer on the reference solutions (\\boxed{...}) matches the gold answer (first 60)."""
    lines = (data_dir / "math500" / "test.jsonl").read_text().splitlines()[:60]
    for line in lines:
        rec = json.loads(line)
        assert is_correct(extract_answer(rec["solution"]), rec["answer"], "math500"), rec["unique_id"]


def test_answer_reward():
    texts = ["<answer>18</answer>", "<answer>-18</answer>", "#### 1,000", "no idea"]
    r = answer_reward(texts, ["18", "18", "1000", "3"], "gsm8k")
    assert r.dtype == np.float32 and r.tolist() == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 texts but 1 golds"):
        answer_reward(texts[:2], ["1"], "gsm8k")
    with pytest.raises(ValueError, match="unknown benchmark"):
        answer_reward([], [], "nope")
