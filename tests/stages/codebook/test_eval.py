"""The codebook stage's held-out report: edit distance and CER against a naive DP, the final number read
back, and the summary line printing only the held-out figures a report has."""

import numpy as np
import pytest

from dlr_jax.stages.codebook.eval import cer, edit_distance, final_number_match, print_summary


def _naive_edit_distance(a, b):
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


def test_edit_distance_and_cer():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == edit_distance("abc", "") == 3
    assert edit_distance("same", "same") == 0
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = "".join(rng.choice(list("ab<=1"), rng.integers(0, 12)))
        b = "".join(rng.choice(list("ab<=1"), rng.integers(0, 12)))
        assert edit_distance(a, b) == _naive_edit_distance(a, b), (a, b)
    assert cer(["abc", "xy"], ["abd", "xyz"]) == pytest.approx(2 / 6)
    assert cer(["", ""], ["ab", "c"]) == 1.0


def test_final_number_match_reads_the_last_number_only():
    refs = ["<<10+9=19>> <<19-3=16>> <<16*6=96>>", "<<5*9=45>>", "<<2+2=4>>", "<<1+1=2>>"]
    # layout kept and digits lost (a fair CER) reads no answer; the right last number is enough
    hyps = ["<<10*2=10>> <<10*2=10>> <<10*10=100>>", "<<7*8=45>>", "<<2+2=4.0>>", ""]
    assert final_number_match(hyps, refs) == 0.5
    assert final_number_match(refs, refs) == 1.0 and final_number_match([], []) == 0.0


def test_summary_line_prints_the_held_out_figures_the_report_has(capsys):
    """A DeepSeek-OCR-2 codebook's report has teacher-forced CE and token accuracy, no CER: the line must not
    print a CER of 0.000 (a perfect score) for the missing keys."""
    base = {"steps": 3, "K": 32, "train_images_per_s": None, "render_images_per_s_one_thread": 5000.0,
            "train_sample": {"perplexity": 9.2}}
    print_summary(base | {"held_out": {"cer_true": 0.5, "cer_shuffled": 0.7, "cer_continuous": 0.4,
                                       "final_number_true": 0.1, "final_number_shuffled": 0.0, "perplexity": 7.0}})
    print_summary(base | {"held_out": {"ce_true": 5.16, "ce_shuffled": 5.2, "token_accuracy_true": 0.0,
                                       "token_accuracy_shuffled": 0.0, "perplexity": 3.0}})
    scratch, ocr2 = capsys.readouterr().out.splitlines()
    assert "held-out CER true=0.500 shuffled=0.700 continuous=0.400" in scratch and "token CE" not in scratch
    assert "held-out token CE true=5.160 shuffled=5.200; token accuracy true=0.000" in ocr2 and "CER" not in ocr2
