"""README's CLI overview runs as written: every `python -m dlr_jax.train` line of it, in order, passes the
workdir's config check (what the first stage records, later stages read; a changed value needs the flag)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from dlr_jax.config import save_config
from dlr_jax.train import resolve_config
from dlr_jax.workdir import check_config_change

ROOT = Path(__file__).resolve().parents[1]


def _section_commands(title: str) -> list[list[str]]:
    """The `python -m dlr_jax.train` commands of the first bash block after `## title`, continuations joined."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(f"## {title}"):].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    return [shlex.split(ln, comments=True) for ln in lines if ln.startswith("python -m dlr_jax.train ")]


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
        save_config(cfg, w / "config.yaml")  # what prepare_workdir records for the next stage
