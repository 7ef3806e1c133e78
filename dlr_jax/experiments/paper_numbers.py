"""The paper's own numbers for the tables `python -m dlr_jax.experiments stages|k_sweep|decoding|encoder` prints
in its layout, beside ours when the run's backbone is the paper's.

PAPER_NUMBERS[experiment][backbone][row label][benchmark] = (Acc. in %, #L), where backbone is the config file's
stem (e.g. "qwen3vl-4b": configs/qwen3vl-4b.yaml), the row labels are the experiment's (report.py prints them) and
the benchmarks are dlr_jax's names (gsm8k, gsm_hard, svamp, multiarith, math500). A cell the paper leaves empty
is None.

Only numbers read from the paper belong here. None are on record yet: the issue that asked for these tables (52)
and DESIGN.md quote none of their cells, and numbers are not to be guessed, so every paper column prints "—" and
the table says so until someone copies the cells in from the paper's tables.
"""

from __future__ import annotations

from collections.abc import Mapping

Cell = tuple[float | None, float | None]

PAPER_NUMBERS: dict[str, dict[str, dict[str, dict[str, Cell]]]] = {"stages": {}, "k_sweep": {}, "decoding": {},
                                                                   "encoder": {}}


def paper_rows(experiment: str, backbone: str) -> Mapping[str, Mapping[str, Cell]] | None:
    """{row label: {benchmark: (Acc. %, #L)}} the paper reports for this experiment and backbone, or None."""
    return PAPER_NUMBERS.get(experiment, {}).get(backbone) or None
