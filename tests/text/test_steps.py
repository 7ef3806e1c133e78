"""The step splitter on each data source's chain style: real lines of GSM8K-Aug, GSM8K and MATH, and the
synthetic generator's two cot_styles."""

import pytest

from dlr_jax.data.synthetic import SyntheticConfig, generate
from dlr_jax.text.steps import AUTO, EQUATIONS, MATH, NATURAL, STEP_STYLES, split_steps, step_style

# gsm8k_aug/test.txt line 3 (its CoT field)
GSM8K_AUG = "<<80000+50000=130000>> <<80000*1.5=120000>> <<120000+80000=200000>> <<200000-130000=70000>>"
# gsm8k/train.jsonl line 3's worked solution (without its #### line), annotations inline
GSM8K = ("In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her 15 * 2 = "
         "$<<15*2=30>>30.\nThis means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.")
# math_train/train.jsonl: line 85 (an align block, a sentence after it with no space) and line 113's opening
MATH_ALIGN = ("We proceed as follows: \\begin{align*}\n6a^2 + 5a + 4 &= 3\\\\\n6a^2 + 5a + 1 &= 0\\\\\n"
              "(2a + 1)(3a + 1) &= 0.\n\\end{align*}This gives us $a = -\\frac{1}{2}$ or $a = -\\frac{1}{3}.$ Of "
              "these, $a = -\\frac{1}{2}$ gives the smaller value of $2a + 1 = \\boxed{0}.$")
MATH_DISPLAY = ("Since $f(x)$ is a linear function, we can write $f(x) = ax + b$.  We want to find the inverse "
                "function $g(x)$ defined by $f(g(x))=x$ for every $x$.  If we substitute $g(x)$ into the equation "
                "for $f$ we get  \\[f(g(x))=ag(x)+b.\\]Using that the left side is $f(g(x))=x$ we get "
                "\\[x=ag(x)+b.\\] So finally, $f(2) = 2(2) + 2 = \\boxed{6}$.")


def assert_steps_of(cot: str, steps: list[str]) -> None:
    """The invariant every user of the steps relies on (a blank CoT has no step)."""
    assert bool(steps) == bool(cot.strip()) and all(s and s == s.strip() for s in steps)
    assert " ".join(" ".join(steps).split()) == " ".join(cot.split())


def test_calculator_chains_are_one_step_per_annotation():
    steps = split_steps(GSM8K_AUG)
    assert step_style(GSM8K_AUG) == EQUATIONS
    assert steps == ["<<80000+50000=130000>>", "<<80000*1.5=120000>>", "<<120000+80000=200000>>",
                     "<<200000-130000=70000>>"]
    assert_steps_of(GSM8K_AUG, steps)
    for ex in generate(20, seed=0):  # the synthetic task's default cot_style: equations
        steps = split_steps(ex.cot)
        assert_steps_of(ex.cot, steps)
        assert len(steps) == ex.cot.count("<<") and all(s.startswith("<<") and s.endswith(">>") for s in steps)


def test_natural_chains_are_one_step_per_sentence():
    steps = split_steps(GSM8K)
    assert step_style(GSM8K) == NATURAL
    assert steps == ["In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.",
                     "Betty's grandparents gave her 15 * 2 = $<<15*2=30>>30.",
                     "This means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more."]
    for ex in generate(20, seed=0, config=SyntheticConfig(cot_style="natural")):
        steps = split_steps(ex.cot)
        assert_steps_of(ex.cot, steps)
        # one sentence a calculator step (a decimal point or "=" inside one cuts nothing), then the closing one
        assert len(steps) == ex.cot.count("<<") + 1 and steps[-1].startswith("So ")
        assert all(s.count("<<") == 1 for s in steps[:-1])


def test_math_solutions_are_sentences_and_equation_lines():
    steps = split_steps(MATH_ALIGN)
    assert step_style(MATH_ALIGN) == MATH
    assert steps == ["We proceed as follows: \\begin{align*}", "6a^2 + 5a + 4 &= 3\\\\", "6a^2 + 5a + 1 &= 0\\\\",
                     "(2a + 1)(3a + 1) &= 0.",
                     "\\end{align*}This gives us $a = -\\frac{1}{2}$ or $a = -\\frac{1}{3}.$",
                     "Of these, $a = -\\frac{1}{2}$ gives the smaller value of $2a + 1 = \\boxed{0}.$"]
    steps = split_steps(MATH_DISPLAY)
    assert_steps_of(MATH_DISPLAY, steps)
    # a full stop closing a display formula ends a sentence only where whitespace follows it
    assert steps[2].startswith("If we substitute") and steps[2].endswith("\\[x=ag(x)+b.\\]")
    assert steps[-1] == "So finally, $f(2) = 2(2) + 2 = \\boxed{6}$." and len(steps) == 4


def test_what_no_split_may_cut():
    assert split_steps("Mia has $x. Then y$ apples.", MATH) == ["Mia has $x. Then y$ apples."]  # inside a formula
    figure = "See it: [asy]\ndraw((0,0)--(1,1));\nlabel(\"A. B\", (0,0));\n[/asy]\nDone."
    assert split_steps(figure, MATH) == ["See it: [asy]\ndraw((0,0)--(1,1));\nlabel(\"A. B\", (0,0));\n[/asy]",
                                         "Done."]
    assert split_steps("It costs <<2. 5*2=5>>5. So 5.", NATURAL) == ["It costs <<2. 5*2=5>>5.", "So 5."]
    assert split_steps("She paid 3 dollars. then left.") == ["She paid 3 dollars. then left."]  # lower case: no end
    assert split_steps("We know that \\$5 is the price. So $x=5$.") == ["We know that \\$5 is the price.",
                                                                         "So $x=5$."]


@pytest.mark.parametrize("style", STEP_STYLES)
def test_no_split_point_is_one_step_and_blank_is_none(style):
    assert split_steps("  twelve   then\tninety ", style) == ["twelve   then\tninety"]
    assert split_steps(" \n ", style) == []


def test_an_unknown_style_is_an_error():
    with pytest.raises(ValueError, match="step style must be one of auto|equations|natural|math"):
        split_steps("<<1+1=2>>", "sentences")


@pytest.mark.parametrize("name", ["gsm8k_aug", "gsm8k", "math"])
def test_every_chain_of_the_public_files_keeps_the_invariant(data_dir, name):
    from dlr_jax.data.gsm8k import read_gsm8k
    from dlr_jax.data.gsm8k_aug import read_gsm8k_aug
    from dlr_jax.data.hendrycks_math import read_math

    examples = {"gsm8k_aug": lambda: read_gsm8k_aug(data_dir / "gsm8k_aug" / "valid.txt", split="valid"),
                "gsm8k": lambda: read_gsm8k(data_dir / "gsm8k" / "test.jsonl", cot="raw"),
                "math": lambda: read_math(data_dir / "math_train" / "train.jsonl", split="train")}[name]()[:2000]
    style = {"gsm8k_aug": EQUATIONS, "gsm8k": NATURAL, "math": MATH}[name]
    counts = []
    for ex in examples:
        steps = split_steps(ex.cot, AUTO)
        assert_steps_of(ex.cot, steps)
        assert split_steps(ex.cot, style) == steps or step_style(ex.cot) != style
        counts.append(len(steps))
    assert sum(c > 1 for c in counts) > len(counts) // 2  # most chains have several steps
