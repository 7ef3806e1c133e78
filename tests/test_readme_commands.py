"""README's CLI overview runs as written: every `python -m dlr_jax.train` line of it, in order, passes the
workdir's config check (what the first stage records, later stages read; a changed value needs the flag)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from dlr_jax.config import save_config
from dlr_jax.run.workdir import check_config_change, recordable
from dlr_jax.train import resolve_config

ROOT = Path(__file__).resolve().parents[1]


def _section_commands(title: str) -> list[list[str]]:
    """The train commands of the first bash block after `## title`, continuations joined: `python -m dlr_jax.train`
    lines as they are, `launch/gpu_single_host.sh STAGE CONFIG W ...` as the train command it runs."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(f"## {title}"):].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    out = []
    for ln in lines:
        if ln.startswith("python -m dlr_jax.train ") and "--print-config" not in ln:
            out.append(shlex.split(ln, comments=True))
        elif ln.startswith("launch/gpu_single_host.sh "):
            _, stage, config, workdir, *rest = shlex.split(ln, comments=True)
            out.append(["--stage", stage, *(["--config", config] if config != "-" else []), "--workdir", workdir,
                        *rest])
    return out


def _options(argv: list[str]) -> tuple[str | None, str, list[str]]:
    config, workdir, sets = None, "", []
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--config":
            config = str(ROOT / value)
        elif flag == "--workdir":
            workdir = value
        elif flag == "--set":
            sets.append(value)
    return config, workdir, sets


def test_cli_overview_train_commands_pass_the_workdir_check_in_order(tmp_path):
    commands = _section_commands("CLI overview")
    assert len(commands) >= 8 and {"textsft", "codebook", "export", "align", "sft", "rl"} <= {
        c[c.index("--stage") + 1] for c in commands}
    dirs: dict[str, Path] = {}
    for argv in commands:
        config, workdir, sets = _options(argv)
        w = dirs.setdefault(workdir, tmp_path / f"w{len(dirs)}")
        w.mkdir(exist_ok=True)
        assert config is not None or (w / "config.yaml").is_file(), f"{shlex.join(argv)}: a new workdir needs --config"
        cfg = resolve_config(config, str(w), sets)
        check_config_change(cfg, w)  # raises ConfigChangeRefused, naming the keys, where a user would be refused
        save_config(recordable(cfg), w / "config.yaml")  # what prepare_workdir records for the next stage
        (w / "tokenizer").mkdir(exist_ok=True)  # and what the stage makes: the recorded config now binds the workdir


def test_full_scale_stages_pass_the_workdir_check_in_order(tmp_path):
    commands = _section_commands("Full-scale run")
    assert [c[c.index("--stage") + 1] for c in commands] == ["codebook", "export", "textsft", "align", "sft", "rl"]
    w = tmp_path / "w"
    w.mkdir()
    for argv in commands:
        config, _, sets = _options(argv)
        cfg = resolve_config(config, str(w), sets)
        check_config_change(cfg, w)
        save_config(recordable(cfg), w / "config.yaml")
        (w / "tokenizer").mkdir(exist_ok=True)
        assert cfg.init_from == "weights/qwen3-4b" and cfg.model.model_type == "qwen3"  # the backbone throughout
