"""Per-stage sections: optimiser and loop of each stage, the latent vocabulary, GRPO, the codebook
stage, evaluation. Paper values live in configs/paper/*.yaml; the defaults here are CPU-sized
unless a comment says otherwise."""

from __future__ import annotations

import dataclasses

from dlr_jax.config.base import ConfigError, auto_on_off, check_dtype


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser and loop settings of one stage (dlr_jax/training/trainer.py)."""

    learning_rate: float = 1e-4
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    optimizer: str = "adamw"  # adamw | sgd (sgd: linear in the gradient; useful for checks)
    batch_size: int = 32  # sequences per optimizer step, global
    grad_accum: int = 1  # micro-batches per step (batch_size must divide)
    num_steps: int = 100
    # > 0: train this many passes over the stage's examples instead: num_steps becomes
    # ceil(num_epochs * examples / batch_size) (rl: prompts / rl.num_prompts), resolved when the stage
    # starts and recorded in <workdir>/<stage>/schedule.json. The paper trains every stage in epochs.
    num_epochs: float = 0.0
    log_every: int = 10
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    async_checkpointing: bool = True
    profile_steps: str = ""  # "a:b" -> jax.profiler trace of steps [a, b)
    progress: bool = True
    seed: int = 0
    # How the stage's loss is normalised (its loss function; training/trainer.py divides by the matching count).
    # mean: per token (per character in the codebook stage; the VQ terms per element of the B x N x d_c
    # features), the default. sum: the paper's equations, written as sums: each example's CE summed over its
    # tokens (or characters) and, in the codebook stage, lambda_vq * (vq + beta * commit) summed over its N
    # latents' squared norms; then averaged over the examples of the global batch (our reading of the batch
    # reduction: the paper writes one example's loss). The paper's learning rates were tuned for its sums
    # (configs/paper/*.yaml set sum). Logged per-token means stay comparable (ce, lm_ce, ce_q, ...); `loss` is
    # the optimised one: per example under sum.
    loss_reduction: str = "mean"

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"train.<stage>.optimizer must be one of {'|'.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ConfigError(f"train.<stage>.loss_reduction (or codebook.train.loss_reduction) must be one of "
                              f"{'|'.join(LOSS_REDUCTIONS)}, got {self.loss_reduction!r}")


OPTIMIZERS = ("adamw", "sgd")  # what optimizer.make_optimizer builds
LOSS_REDUCTIONS = ("mean", "sum")  # TrainConfig.loss_reduction


@dataclasses.dataclass(frozen=True)
class LatentConfig:
    num_latents: int = 512  # K, codebook size
    latent_dim: int = 64  # d_c
    tie_projectors: bool = False
    train_codebook_in_sft: bool = True
    # codebook: ids from latents/<split>.jsonl written by the export stage;
    # random: fixed pseudo-random ids per example (pipeline checks before a codebook exists);
    # step_results: one code per CoT step <<a+b=c>> holding c, a perfect-codebook control (data/latents.py).
    source: str = "codebook"
    # The LM's codebook C (its latent rows are P_in(c_k), P_out(c_k)) at the start of align: stage = the codebook
    # stage's as it is (the paper); standardized = that codebook z-scored per dimension over its K codes (the codes'
    # geometry kept, the scale of N(0, 1) rows, so SFT's updates can move look-alike codes apart); random = N(0, 1)
    # rows (the ids alone carry the images). Ours; see configs/small/synthetic.yaml for why.
    codebook_init: str = "stage"
    # Stage sft's dual branch (stages/sft.py, models/dual_branch.py): the codebook stage's OCR decoder keeps
    # training to read the CoT back from sg(E_lat(z)) and is saved to <workdir>/sft/decoder (RL's process
    # reward then decodes with it). auto: on iff <workdir>/codebook/final exists and source=codebook;
    # on: required (an error names what is missing); off. data.pack=true: one OCR row per segment. YAML's bare on/off
    # (booleans) are accepted. Loss: LM token-mean CE + dual_branch_weight * OCR char-mean CE. Under
    # codebook.render_unit=step the decoder reads one step's codes back as that step's text, as the codebook
    # trained it: one latent step per row, drawn per example: an unbiased sample of the per-step loss.
    dual_branch: str | bool = "auto"
    dual_branch_weight: float = 1.0
    # Stage sft's latent curriculum (dlr_jax/data/curriculum.py; not the paper's, which trains on whole latent
    # spans: off): rows [x ; <latent> codes of the first k steps </latent> text of the other steps <answer> a ...].
    # stagewise (Coconut): k grows by one every curriculum_stages of the sft steps, the last stage all latent;
    # random (Token Assorted): k uniform in [curriculum_k_min, S] per example and epoch. S: the steps of the
    # latent span (codebook.render_unit=step), 1 for a whole-chain span. YAML's bare off is accepted.
    curriculum: str | bool = "off"
    curriculum_stages: float = 0.25  # stagewise: share of the sft steps one stage lasts
    curriculum_k_min: int = 0  # k is never below min(curriculum_k_min, S)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dual_branch", auto_on_off(self.dual_branch, "latent.dual_branch"))
        if self.dual_branch_weight < 0:
            raise ConfigError(f"latent.dual_branch_weight must be >= 0, got {self.dual_branch_weight}")
        if self.codebook_init not in CODEBOOK_INITS:
            raise ConfigError(f"latent.codebook_init must be one of {'|'.join(CODEBOOK_INITS)}, "
                              f"got {self.codebook_init!r}")
        if self.curriculum is False:
            object.__setattr__(self, "curriculum", "off")
        if self.curriculum not in CURRICULA:
            raise ConfigError(f"latent.curriculum must be one of {'|'.join(CURRICULA)}, got {self.curriculum!r}")
        if not 0 < self.curriculum_stages <= 1:
            raise ConfigError(f"latent.curriculum_stages must be in (0, 1], got {self.curriculum_stages}")
        if self.curriculum_k_min < 0:
            raise ConfigError(f"latent.curriculum_k_min must be >= 0, got {self.curriculum_k_min}")


CODEBOOK_INITS = ("stage", "standardized", "random")  # latent.codebook_init (dlr_jax/stages/latent_common.py)
CURRICULA = ("off", "stagewise", "random")  # latent.curriculum (dlr_jax/data/curriculum.py)


@dataclasses.dataclass(frozen=True)
class RLTrainConfig(TrainConfig):
    """Optimiser of stage rl. `batch_size` = rollouts per optimizer update (P*G must divide by it);
    `num_steps`, `log_every`, `checkpoint_every` count RL steps (one rollout batch each, i.e.
    rl.inner_epochs * P*G / batch_size optimizer updates)."""

    learning_rate: float = 1e-6
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 64
    num_steps: int = 200
    log_every: int = 1
    checkpoint_every: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss_reduction != "mean":  # GRPO normalises its own way; a second key would contradict it
            raise ConfigError(f"train.rl.loss_reduction must stay mean (got {self.loss_reduction!r}): GRPO's "
                              "aggregation is rl.loss_agg_mode")


@dataclasses.dataclass(frozen=True)
class StagesConfig:
    textsft: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # CoT-SFT
    textsft_direct: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # Direct-SFT
    align: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    sft: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    rl: RLTrainConfig = dataclasses.field(default_factory=RLTrainConfig)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Latent GRPO (stage rl, dlr_jax/stages/rl/stage.py). Defaults follow the paper where it gives a value: G = 32
    rollouts per prompt at T = 1.0, reward R_ans + 0.25 r_proc + 0.1 R_fmt, group-normalised advantages,
    token-level clipped ratio (eps = 0.2), k3 KL to the SFT model (beta = 1e-3), mu = 4 inner epochs; the
    prompts per step and the lengths are ours (configs/paper/gsm8k.yaml sets the recipe's: 2 prompts, 256 tokens).
    `--set rl.process_weight=0` is the process-reward ablation."""

    num_prompts: int = 16  # P prompts per RL step (P * G rollouts)
    # > 0: RL draws its prompts from the first prompt_pool training problems only (epochs over a fixed
    # pool, as RL on a benchmark's train set does); 0 = the whole data.train_split
    prompt_pool: int = 0
    group_size: int = 32  # G
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    # prompts longer than this many tokens are left out of RL (counted); 0 = data.max_len - max_new_tokens
    max_prompt_tokens: int = 0
    max_latents: int = 32  # `</latent>` forced after this many latents (0 = no cap)
    constrain_format: bool = False  # constrained decoding (makes R_fmt ~ 1 by construction)
    answer_weight: float = 1.0
    # r_proc; under codebook.render_unit=step the OCR decoder reads the generated span one step (c codes) at a
    # time, which needs every step's c fixed: codebook.min_side = max_side (dlr_jax/rewards/process.py)
    process_weight: float = 0.25
    format_weight: float = 0.1
    scale_rewards: str = "group"  # group | batch | none (dlr_jax.stages.rl.grpo.group_advantages)
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None = epsilon (DAPO clip-higher: e.g. 0.28)
    beta: float = 1e-3  # k3 KL to the reference (SFT) policy; 0 skips the reference model
    inner_epochs: int = 4  # mu
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-mean | dr_grpo
    # What the field added to GRPO since (dlr_jax/stages/rl/grpo.py); each default is the paper's plain GRPO.
    # importance_sampling_level: token (the paper: one clipped ratio per token) | sequence (GSPO, Zheng et al.
    # 2025: one length-normalised ratio exp(mean_t log(pi / pi_old)) per rollout, clipped; GSPO pairs it with
    # loss_agg_mode=seq-mean-token-mean and epsilon=3e-4, epsilon_high=4e-4, beta=0)
    importance_sampling_level: str = "token"
    # Rollouts come from the sampling copy (rl.sample_dtype, e.g. bf16) while the update computes the trainer's
    # log-probs: their per-token gap is logged every step (logprob_gap/mean, /max, /kl: the k3 estimate of
    # KL(sampler || trainer)). sampler_is_correction: off (the paper) | truncated: the surrogate of each token
    # is weighted by min(pi_old / pi_sampler, sampler_is_cap) (truncated importance sampling, TRL's
    # vllm_importance_sampling_mode=token_truncate; its default cap 3.0). With an old-policy pass
    # (rl.inner_epochs x rollouts > one minibatch) pi_old is the sampling copy's own scoring, so the weight
    # then only covers the decode loop's numerics: the copy/trainer gap is in the PPO ratio itself.
    sampler_is_correction: str = "off"
    sampler_is_cap: float = 3.0
    # Rollouts that hit rl.max_new_tokens without a stop token: keep (the paper: trained on like the others)
    # | mask (DAPO's overlong filtering: no loss on them; TRL's mask_truncated_completions) | soft_penalty
    # (DAPO's soft overlong punishment: a reward of 0 up to max_new_tokens - overlong_buffer tokens, falling
    # linearly to -1 at max_new_tokens; logged as reward/overlong). overlong_buffer: DAPO's L_cache (4096
    # of 20480 tokens there); 0 = a fifth of rl.max_new_tokens, DAPO's proportion
    overlong: str = "keep"
    overlong_buffer: int = 0
    # DAPO's dynamic sampling (off in the paper): groups whose rewards all agree to within
    # dynamic_sampling_tol (max - min; rewards are float sums, equal when printed but not to the bit) have zero
    # advantages and are dropped; the batch is refilled with the groups of further prompts from the prompt
    # stream, at most dynamic_sampling_max_refills extra rollout calls of rl.num_prompts prompts per step (the
    # batch keeps its shape: no recompiles). Surplus groups are discarded (as DAPO's); a batch still short
    # after the last refill is topped up with dropped groups (plain GRPO's batch). Logged: dynamic/*.
    dynamic_sampling: bool = False
    dynamic_sampling_tol: float = 1e-6
    dynamic_sampling_max_refills: int = 4
    # Rollouts decode from a sampling copy of the policy (dlr_jax/generate/sampling_copy.py), refreshed on device
    # after every RL step. sample_mesh: its layout — "auto" = tensor-parallel over one process's devices
    # as far as heads / MLP / vocabulary divide, data-parallel over the rest; "" = the training mesh
    # (FSDP: the decode loop then all-gathers every weight for every token); or "data=2,fsdp=1,tensor=4".
    sample_mesh: str = "auto"
    # its dtype: "auto" = model.dtype (the forward casts weights to it anyway: same tokens, half the
    # bytes under bf16), "keep" = the parameters' dtype, or a dtype name
    sample_dtype: str = "auto"
    # process-reward evaluator LM: "backbone" = the model before alignment (init_from, else textsft_cot),
    # or a workdir stage name / final dir holding a text backbone
    evaluator: str = "backbone"
    process_max_new_tokens: int = 16  # evaluator answer budget after `<answer>`
    process_max_cot_tokens: int = 256  # decoded CoT y_hat is cut to this many tokens
    process_batch_size: int = 64
    # Your own rewards on top of the three above: "name=weight" entries of the reward registry
    # (dlr_jax.rewards.answer_format.register_reward), e.g. ["brevity=0.5"]; reward_modules are imported first so
    # their @register_reward decorators run (e.g. ["my_project.rewards"]).
    extra_rewards: tuple[str, ...] = ()
    reward_modules: tuple[str, ...] = ()
    # Held-out reward curve (dlr_jax/stages/rl/eval.py): the first eval_prompts prompts of data.eval_split,
    # eval_samples rollouts each at rl.temperature with fixed random numbers, scored with the training
    # reward before step 1, every eval_every RL steps and at the end. 0 = off.
    eval_prompts: int = 0
    eval_samples: int = 4
    eval_split: str = ""  # "" = data.eval_split; "pool" = the RL training prompts (rl.prompt_pool); a split
    eval_every: int = 10
    # the held-out rollouts' temperature: None = rl.temperature (the sampling policy GRPO trains); 0 = greedy, the
    # decoding of every Pass@1 table here (needs eval_samples = 1: greedy rollouts of a prompt are all the same)
    eval_temperature: float | None = None
    # pass@k (unbiased, from the eval_samples rollouts of each prompt) and maj@k (majority vote of k) of the
    # held-out evaluation, for each k here (1 <= k <= eval_samples); () = 1 and eval_samples
    eval_k: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sample_dtype", check_dtype(self.sample_dtype, "rl.sample_dtype", ("auto", "keep")))
        for key, allowed in (("importance_sampling_level", IS_LEVELS), ("sampler_is_correction", IS_CORRECTIONS),
                             ("overlong", OVERLONG_MODES)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"rl.{key} must be one of {'|'.join(allowed)}, got {getattr(self, key)!r}")
        if self.sampler_is_cap <= 0:
            raise ConfigError(f"rl.sampler_is_cap must be > 0, got {self.sampler_is_cap}")
        if self.overlong_buffer < 0 or self.overlong_buffer > self.max_new_tokens:
            raise ConfigError(f"rl.overlong_buffer={self.overlong_buffer} must be in 0..rl.max_new_tokens="
                              f"{self.max_new_tokens}")
        if self.dynamic_sampling_tol < 0 or self.dynamic_sampling_max_refills < 0:
            raise ConfigError("rl.dynamic_sampling_tol and rl.dynamic_sampling_max_refills must be >= 0, got "
                              f"{self.dynamic_sampling_tol} and {self.dynamic_sampling_max_refills}")


IS_LEVELS = ("token", "sequence")  # rl.importance_sampling_level (dlr_jax.stages.rl.grpo.IS_LEVELS)
IS_CORRECTIONS = ("off", "truncated")  # rl.sampler_is_correction
OVERLONG_MODES = ("keep", "mask", "soft_penalty")  # rl.overlong


RENDER_VIEWS = ("cot", "results", "result_lines")  # codebook.render_view (dlr_jax/data/cot_view.py)
RENDER_UNITS = ("chain", "step")  # codebook.render_unit (dlr_jax/text/steps.py)
ENCODERS = ("deepencoder", "qwen3_vl")  # codebook.encoder (dlr_jax/models/codebook_model.py)


@dataclasses.dataclass(frozen=True)
class CodebookConfig:
    """Stage codebook (dlr_jax/stages/codebook/stage.py): CoT image -> SAM ViT + compressor + causal
    flow -> stochastic VQ -> OCR decoder, then stage export writes every example's latent ids.
    K = latent.num_latents and d_c = latent.latent_dim (the flow width). Defaults are the paper's
    (DeepEncoder V2 sizes, lambda_vq = 0.25, beta = 0.1, alpha over one epoch) except sigma, which the
    paper does not give; configs/tiny.yaml shrinks the networks for a CPU."""

    # Training CoTs as "name:split" load_benchmark entries (e.g. "gsm8k_aug:train_subset_3000",
    # "gsm8k:train"), or "name:split@N": a stratified sample of N of them drawn with data.split_seed (the
    # paper's "mathx_5m:train@603000"; dlr_jax/data/sources.py); () = data.dataset's train split. What was
    # read is recorded in <workdir>/codebook/corpus.json. eval_corpus: held-out CoTs for the CER check;
    # () = data.dataset's eval split. eval_examples caps it (0 = all).
    corpus: tuple[str, ...] = ()
    eval_corpus: tuple[str, ...] = ()
    eval_examples: int = 256
    export_splits: tuple[str, ...] = ()  # besides data.train_split / data.eval_split
    # rendering (dlr_jax.text.render.RenderConfig); training draws one font size per example
    font_mean: float = 17.5
    font_std: float = 1.5
    font_min: int = 15
    font_max: int = 20
    min_side: int = 64
    max_side: int = 1024
    overflow: str = "shrink"  # shrink | truncate (beyond max_side)
    max_text_len: int = 512  # decoder targets in characters incl. EOS; longer CoTs are cut (counted)
    # what of each CoT is rendered and read back (dlr_jax/data/cot_view.py): cot (the paper) | results
    # (each calculator step's result, "19 16 96"; the visual counterpart of latent.source=step_results)
    # | result_lines (the same, one result a line)
    render_view: str = "cot"
    # what one canvas holds: chain (the whole CoT, the paper) | step (each step of `text.steps.split_steps` on its
    # own canvas: the codebook trains and reads back single steps; export writes an example's latents as its
    # steps' codes in order, with the codes per step in the latents file's "steps"). A short step renders on
    # the min_side canvas, so min_side sets the codes of a short step (64 px: 1, 128 px: 4); min_side =
    # max_side fixes the codes per step at (side / 64)^2 (a longer step is drawn smaller, codebook.overflow)
    render_unit: str = "chain"
    # the encoder: deepencoder (DeepEncoder V2, the paper's: SAM ViT + compressor + causal flow, sized by vit_*,
    # neck_channels, compressor_mid, flow_*) | qwen3_vl (Qwen3-VL's vision tower, dlr_jax/models/qwen3_vl_encoder.py:
    # each 64-px cell's 2 x 2 merged tokens concatenated and mapped to d_c, so N = (side / 64)^2 too; from scratch
    # it is sized by vit_hidden, vit_layers, vit_heads, vit_mlp and image_size, patch 16, no flow)
    encoder: str = "deepencoder"
    # a Hugging Face qwen3_vl checkpoint directory: the qwen3_vl encoder's tower takes its vision_config and its
    # model.visual.* weights (the LM half is init_from's business); "" = from scratch
    encoder_from: str = ""
    # vision encoder (dlr_jax.models.vision.VisionConfig)
    image_size: int = 1024  # reference side of the position tables
    vit_hidden: int = 768
    vit_layers: int = 12
    vit_heads: int = 12
    vit_mlp: int = 3072
    vit_global_every: int = 3  # every 3rd block is global: (2, 5, 8, 11) for 12 layers
    vit_window: int = 14
    neck_channels: int = 256
    compressor_mid: int = 512  # compressor channels: neck -> compressor_mid -> latent.latent_dim
    # causal flow (Qwen2-style; DeepEncoder V2's is Qwen2-0.5B: 896 wide, 24 layers, 14 x 64 heads, 2 kv heads)
    flow_hidden: int = 0  # its width; 0 = latent.latent_dim (d_c). Another value adds a linear map to d_c
    flow_layers: int = 24
    flow_heads: int = 14
    flow_kv_heads: int = 2
    flow_head_dim: int = 64
    flow_mlp: int = 4864
    num_queries: int = 256  # query pool; N = (side / 64)^2 must not exceed it
    flow_visual_skip: bool = False  # add visual token i to query i's output (from-scratch tiny encoders)
    # OCR decoder: a dense Llama-style LM over characters, input [P(h_st) ; text]
    dec_hidden: int = 1280
    dec_layers: int = 12
    dec_heads: int = 10
    dec_kv_heads: int = 10
    dec_head_dim: int = 128
    dec_mlp: int = 3584
    dtype: str = "float32"  # activations of all three networks
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots
    # VQ and loss: CE(H_st) + alpha * CE(H) + lambda_vq * (vq + beta * commit)
    # std of the Gaussian noise added to h before the nearest-code search (training). The paper adds the noise
    # but gives no value: 0.1 is ours
    sigma: float = 0.1
    lambda_vq: float = 0.25
    beta: float = 0.1
    alpha_steps: int = -1  # alpha: 1 -> 0 linearly over this many steps, then CE(H) is not computed;
    #                        -1 = one epoch of the corpus (the paper), 0 = never
    warmup_steps: int = 0  # continuous-only (CE(H)) steps before the k-means init; 0 = none
    char_dropout: float = 0.0  # teacher-forced decoder input chars replaced by <drop> with this prob
    # char_dropout of the continuous warm-up (None = char_dropout). 1.0 drops every teacher-forced input
    # char, so the loss only falls if the decoder reads the image: what gets a from-scratch encoder reading
    warmup_char_dropout: float | None = None
    # > 0: the warm-up trains on pieces of each CoT (consecutive whole words, at most this many chars;
    # `render_pipeline.cot_pieces`) instead of whole CoTs: a length curriculum. Short texts sit in a few
    # lines, so a decoder with no text inputs can find character j in the image; whole GSM8K CoTs wrap
    # over 6-9 lines and a from-scratch encoder did not start reading them (BENCHMARKS.md)
    warmup_piece_chars: int = 0
    # continuous warm-up steps on whole CoTs after the `warmup_steps` (pieces or not): what the decoder learnt
    # on pieces covers the first lines of a canvas only; the reading of whole CoTs must be learnt before the
    # features are quantized, because 512 codes cannot pass on reading that is not there yet (BENCHMARKS.md)
    warmup_whole_steps: int = 0
    kmeans_init_batches: int = 16  # batches of encoder features for the k-means warm start; 0 = random
    kmeans_iters: int = 10
    dead_code_every: int = 0  # refresh unused codes every this many steps (0 = never)
    dead_code_batches: int = 4  # batches whose features decide which codes are dead and replace them
    # which of those features a dead code takes: random | farthest (from their nearest live code first: the
    # inputs that share a code get codes of their own; dlr_jax.models.vq.refresh_dead_codes)
    dead_code_pick: str = "random"
    eval_batch_size: int = 64  # greedy CER decoding and export
    train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(learning_rate=1e-4, batch_size=32, num_steps=2000)
    )
    # a corpus rendered once by `python -m dlr_jax.data.render_corpus --split train` (a TFDS array_record
    # dataset): the training plan's images are read from it instead of drawn every epoch; "" = render on
    # the fly. Its recorded render settings, seed and corpus must match this config (else an error).
    render_cache: str = ""
    # Start from a pretrained DeepSeek-OCR-2 (issue 15; stages/codebook_ocr2.py): an HF deepseek_ocr2
    # directory (config.json, safetensors, tokenizer.json). Its encoder, projector and MoE decoder are
    # fine-tuned with the VQ inserted; the vit_*/flow_*/dec_* sizes above are then ignored, the
    # decoder reads the checkpoint's tokens (max_text_len counts tokens) and latent.latent_dim must
    # equal the VQ width. "" = train from scratch (character decoder).
    init_from: str = ""
    # true: this config fine-tunes the pretrained checkpoint (configs/codebook-ocr2.yaml: no warm-up, no char
    # dropout, paper-sized canvases), so the stage and the planner refuse to start without codebook.init_from
    # instead of training the from-scratch encoder under settings that are not its recipe.
    pretrained: bool = False
    quantize_at: str = "flow"  # flow: after the causal flow (d_c, the paper) | projector (released code)
    ocr2_prompt: str = "\nFree OCR."  # tokens between the image and the text (DeepSeek-OCR's plain OCR prompt)
    router_aux_coef: float = 0.0  # x the decoder's MoE load-balancing loss (0 = off)

    def __post_init__(self) -> None:
        for key in ("dtype", "param_dtype"):
            object.__setattr__(self, key, check_dtype(getattr(self, key), f"codebook.{key}"))
        if self.render_view not in RENDER_VIEWS:
            raise ConfigError(f"codebook.render_view must be one of {'|'.join(RENDER_VIEWS)}, got {self.render_view!r}")
        if self.dead_code_pick not in ("random", "farthest"):
            raise ConfigError(f"codebook.dead_code_pick must be random or farthest, got {self.dead_code_pick!r}")
        if self.render_unit not in RENDER_UNITS:
            raise ConfigError(f"codebook.render_unit must be one of {'|'.join(RENDER_UNITS)}, got {self.render_unit!r}")
        if self.encoder not in ENCODERS:
            raise ConfigError(f"codebook.encoder must be one of {'|'.join(ENCODERS)}, got {self.encoder!r}")
        if self.encoder_from and self.encoder != "qwen3_vl":
            raise ConfigError(f"codebook.encoder_from={self.encoder_from!r} is a Qwen3-VL tower: it needs "
                              f"codebook.encoder=qwen3_vl, not {self.encoder}")
        if self.encoder != "deepencoder" and (self.init_from or self.pretrained):
            raise ConfigError(f"codebook.encoder={self.encoder} with codebook.init_from / pretrained: the "
                              "DeepSeek-OCR-2 checkpoint brings its own encoder (DeepEncoder V2)")


EVAL_DECODINGS = ("dynamic", "constrained")
ANSWER_FALLBACKS = ("off", "last_number")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """`python -m dlr_jax.evaluate` (dlr_jax/eval/evaluate.py). The defaults are our reading of the paper's
    evaluation ([Eval]; the project's design summary of the paper: "greedy 'dynamic' decoding (the model emits
    </latent> itself)"); the other readings stay as named options. configs/paper/gsm8k.yaml states each again."""

    benchmarks: tuple[str, ...] = ("synthetic",)
    seeds: int = 1
    batch_size: int = 64
    max_new_tokens: int = 64
    max_latents: int = 32  # cap for dynamic latent decoding
    limit: int = 0  # evaluate only the first N examples of each benchmark (0 = all)
    # 0 = greedy: the paper names a temperature for its RL rollouts only (T = 1.0), and calls its evaluation
    # greedy. > 0 samples, seed s with PRNG seed s (a spread over sampling, not over training seeds).
    temperature: float = 0.0
    # dynamic (the paper's): the model opens and closes its latent span itself and may write text after it;
    # only the max_latents cap (a guard against runaways) and --force-latents intervene. constrained (ours): a
    # grammar forces <latent> first, only latents or </latent> inside the span, the answer span after it
    # (every finished generation is format-valid); for cot/direct it masks latent ids and boundaries out.
    decoding: str = "dynamic"
    # Where the answer is read. off (the paper's: DLR is trained to answer in <answer> a </answer>): only the
    # last <answer> span; a generation without one has no answer. last_number (the RL answer reward's rule,
    # `rewards.extract_answer`): without a span, a \boxed{}, an "answer is" marker, else the last number;
    # results count how often it fired (answer_fallback_fired). YAML's bare off (a boolean) is accepted.
    answer_fallback: str | bool = "off"

    def __post_init__(self) -> None:
        if self.answer_fallback is False:
            object.__setattr__(self, "answer_fallback", "off")
        if self.decoding not in EVAL_DECODINGS:
            raise ConfigError(f"eval.decoding must be one of {'|'.join(EVAL_DECODINGS)}, got {self.decoding!r}")
        if self.answer_fallback not in ANSWER_FALLBACKS:
            raise ConfigError(f"eval.answer_fallback must be one of {'|'.join(ANSWER_FALLBACKS)}, "
                              f"got {self.answer_fallback!r}")
        if self.temperature < 0:
            raise ConfigError(f"eval.temperature must be >= 0 (0 = greedy), got {self.temperature}")
