"""The run-level sections (run, data, tokenizer) and the `Config` tree that holds every section."""

from __future__ import annotations

import dataclasses

from dlr_jax.config.base import ConfigError
from dlr_jax.config.model import MeshConfig, ModelConfig, SamplingConfig
from dlr_jax.config.stages import CodebookConfig, EvalConfig, LatentConfig, RLConfig, StagesConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    workdir: str = "runs/tiny"
    # true: a rerun in an existing workdir may change safe keys (lr, steps, ...); see dlr_jax/run/workdir.py
    allow_config_change: bool = False


SYNTHETIC_COT_STYLES = ("equations", "natural")  # data/synthetic.py natural_chain; its SyntheticConfig checks these
GSM8K_COTS = ("equations", "raw", "natural")  # data/gsm8k.py CotStyle
ALIGN_PARTS = ("sft", "all")  # data.align_part (dlr_jax/stages/common.py stage_examples)
PAD_TO = ("longest", "max_len")  # data.pad_to (dlr_jax/data/pipeline.py row_width)
PACK_BATCH = ("rows", "examples", "exact")  # data.pack_batch (dlr_jax/data/pipeline.py make_stage_dataset)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"  # any dlr_jax.data.readers.load_benchmark name
    path: str | None = None  # a user copy of the dataset (file or folder); None = shared data
    train_split: str = "train"
    eval_split: str = "test"  # or "name:split" of another benchmark, for a non-synthetic dataset (math500:test)
    max_len: int = 256  # tokens per training row at most; longer examples are dropped and counted
    # Padded (not packed) rows: "longest" = as wide as the stage's longest kept example, rounded up to a multiple of
    # 16 (one shape a stage, so one compile; a row's padding is masked out of attention and loss, so the step computes
    # the same loss on fewer tokens); "max_len" = always data.max_len wide (a planner's worst case, every stage)
    pad_to: str = "longest"
    synthetic_train: int = 20000
    synthetic_eval: int = 500
    # The synthetic task's difficulty (data/synthetic.py SyntheticConfig): equations per problem drawn from
    # [min_steps, max_steps]; operands up to max_operand, every intermediate value up to max_value. Graded
    # variants: more steps (longer CoTs), larger numbers. Evaluation-only benchmarks drawn from these settings
    # (dlr_jax/data/synthetic_variants.py): synthetic_hard (numbers x10, GSM-Hard's analogue) and
    # synthetic_reworded (the test problems reworded, plus an irrelevant sentence: SVAMP's analogue).
    synthetic_min_steps: int = 1
    synthetic_max_steps: int = 4
    synthetic_max_operand: int = 10
    synthetic_max_value: int = 200
    # The task's surface (SVAMP's analogue as a training task): "base" wording, "reworded", or "varied" (each
    # sentence in either wording at random); and the share of problems with one irrelevant sentence.
    synthetic_wording: str = "base"
    synthetic_distractor_rate: float = 0.0
    # The chain every CoT-side stage reads: "equations" (GSM8K-Aug's form, `<<3+4=7>> <<7*2=14>>`) or "natural"
    # (GSM8K-Aug-NL's analogue: a sentence a step with its annotation inline, as GSM8K's own solutions; about 4x the
    # tokens). The problems and answers are the same. Natural chains need room: at 3-6 steps (147 tokens a chain)
    # max_len 320 and eval.max_new_tokens 256 (BENCHMARKS.md "Chains told in sentences"); tiny.yaml's 112 / 96
    # would drop most training rows and cut CoT-SFT's answers off. Generated data only (a data.path file is read
    # as written).
    synthetic_cot_style: str = "equations"
    # data.dataset=gsm8k only: the CoT read from each worked solution (dlr_jax/data/gsm8k.py): "equations" (its
    # annotations joined, GSM8K-Aug's form), "raw" (the solution as written, annotations inline: the form of
    # synthetic_cot_style=natural) or "natural" (the solution with its annotations removed).
    gsm8k_cot: str = "equations"
    num_workers: int = 0  # grain worker processes (0 = in-process)
    # Several examples a row (textsft, align, sft; its dual branch gets one OCR row per segment, data/ocr_rows.py):
    # segment ids keep each example's attention and loss its own, so a row trains what padded rows would
    # (tests/stages/test_packing.py); how many examples a step then holds: pack_batch
    pack: bool = False
    # What a packed step's train.<stage>.batch_size counts (read only with pack=true): "rows" = rows of max_len
    # (grain's first-fit packer), so a step holds examples_per_row times more examples than padded and an epoch is
    # that many times fewer, larger steps; "examples" = the examples a step holds on average, in
    # round(batch_size / examples_per_row) rows, so the optimization (batch in examples, steps an epoch) is the padded
    # recipe's and only the pad tokens go away; "exact" = every step holds exactly the padded step's batch_size
    # examples (each micro-batch's examples packed into as many rows as the run's fullest micro-batch needs,
    # data/exact_rows.py), so packed training is the padded run step for step
    pack_batch: str = "rows"
    # The data protocol (dlr_jax/data/protocol.py), recorded in <workdir>/data_protocol.json.
    # rl_split: part of train_split held out for stage rl; SFT-side stages (textsft, sft; align unless
    # align_part=all) read the rest. A count (>= 1) or a fraction (< 1); 0 = every stage reads the whole
    # split. Chosen by a hash of (split_seed, example id), so it does not depend on file order, process count
    # or the run seed.
    rl_split: float = 0.0
    split_seed: int = 0
    # what stage align reads: "sft" = the SFT part (what textsft and sft read), "all" = the whole split, the RL
    # part too (the paper: "allocating all 385K for latent-text alignment, 300K for SFT, and the remaining 85K
    # for RL"). The two are the same when rl_split = 0. Recorded in data_protocol.json when not "sft".
    align_part: str = "sft"
    # examples whose CoT is longer than this many tokens (the workdir's tokenizer) are left out of every
    # stage, counted; 0 = no filter
    max_cot_tokens: int = 0

    def __post_init__(self) -> None:
        if self.synthetic_cot_style not in SYNTHETIC_COT_STYLES:
            raise ConfigError(f"data.synthetic_cot_style must be {'|'.join(SYNTHETIC_COT_STYLES)}, "
                              f"got {self.synthetic_cot_style!r}")
        if self.pad_to not in PAD_TO:
            raise ConfigError(f"data.pad_to must be {'|'.join(PAD_TO)}, got {self.pad_to!r}")
        if self.pack_batch not in PACK_BATCH:
            raise ConfigError(f"data.pack_batch must be {'|'.join(PACK_BATCH)}, got {self.pack_batch!r}")
        if self.align_part not in ALIGN_PARTS:
            raise ConfigError(f"data.align_part must be {'|'.join(ALIGN_PARTS)}, got {self.align_part!r}")
        if self.gsm8k_cot not in GSM8K_COTS:
            raise ConfigError(f"data.gsm8k_cot must be {'|'.join(GSM8K_COTS)}, got {self.gsm8k_cot!r}")
        if self.synthetic_cot_style != "equations" and self.dataset != "synthetic":
            raise ConfigError(f"data.synthetic_cot_style={self.synthetic_cot_style} applies to data.dataset=synthetic, "
                              f"not {self.dataset!r}")
        if self.gsm8k_cot != "equations" and self.dataset != "gsm8k":
            raise ConfigError(f"data.gsm8k_cot={self.gsm8k_cot} applies to data.dataset=gsm8k, not {self.dataset!r}")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    path: str | None = None  # a HF tokenizer dir; None = train a BPE on the training corpus
    vocab_size: int = 512  # BPE size when training one
    pad_multiple: int = 128  # total vocab padded to a multiple of this (must divide by tensor axis)


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    latent: LatentConfig = dataclasses.field(default_factory=LatentConfig)
    train: StagesConfig = dataclasses.field(default_factory=StagesConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    codebook: CodebookConfig = dataclasses.field(default_factory=CodebookConfig)
    init_from: str | None = None  # HF checkpoint dir of the backbone; None = from scratch
