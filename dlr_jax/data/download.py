"""Download the public benchmark files: `python -m dlr_jax.data.download NAME... --to DIR`.

Files land in `DIR/<dataset>/<file>`, the layout `load_benchmark` expects, so `DLR_DATA_DIR=DIR`
makes them the default. Every file comes from a pinned commit (`SOURCES` below: each file's URL,
hash and record count), is checked against its known sha256 when the source is upstream, and is
parsed with its reader to check the record count; both are printed.

Sources other than GitHub:
- `--mirror URL` or `$DLR_DOWNLOAD_MIRROR`: a base URL laid out like DIR (`file://` works);
- `--from-local PATH`: the same for a local directory (e.g. a copy of shared/data).
A mirror's hashes are reported but not enforced (a copy may legitimately differ, e.g. an added
trailing newline); record counts are always enforced.

NAME is one of the keys of `SOURCES` or `all` (everything except the 88 MB `gsm8k_aug_full`), or `mathx_5m`
(`HUB_SOURCES`): MathX-5M, the third source of the paper's codebook corpus, a folder of parquet files on the
Hugging Face hub (gigabytes; fetched with `huggingface_hub`, never by `all`). Its files have no hashes on record:
the commit that was fetched and the rows counted are written to `DIR/mathx_5m/SOURCE.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from dlr_jax.data.mathx import count_rows
from dlr_jax.data.readers import BENCHMARKS
from dlr_jax.data.records import DataFormatError

MIRROR_ENV = "DLR_DOWNLOAD_MIRROR"
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"


def _raw(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


def _lfs(repo: str, commit: str, path: str) -> str:
    """GitHub serves Git LFS objects from media.githubusercontent.com (raw.* gives the pointer)."""
    return f"https://media.githubusercontent.com/media/{repo}/{commit}/{path}"


@dataclasses.dataclass(frozen=True)
class FileSource:
    """One file: where it goes (subdir/name), where it comes from, and how to check it.

    sha256: full hex digest, or "prefix...suffix" where only the ends are published.
    benchmark/split: the reader used to count records; count: the records expected.
    """

    subdir: str
    name: str
    url: str
    sha256: str
    benchmark: str
    split: str
    count: int

    @property
    def rel(self) -> str:
        return f"{self.subdir}/{self.name}"


_GSM8K = ("openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c")
_ICOT = ("da03/Internalize_CoT_Step_by_Step", "c2e3891d8d577beeaff03fa3b076d1e4db96cfe8")
_COCONUT_ANN = ("tsrigo/annotated-coconut-pytorch", "0273998328e563a5d83ecefebd8e71c17677e82b")
_PAL = ("reasoning-machines/pal", "f81ca2a9777f002f98a6b4d0f10b61bd5c8feb02")
_SVAMP = ("arkilpatel/SVAMP", "689d7ccac74b9983a2ac7cc3b264f441b99e7c53")
_ZSCOT = ("kojima-takeshi188/zero_shot_cot", "5ef330fcdeec0cd26aee27943504f91f8ec1c33c")
_BUDGET = ("MobileLLM/BudgetThinker", "f0466b9d37595f46603387baa5930e312fefb7f5")
_PRM800K = ("openai/prm800k", "7ecc794703b2877f63226f2477a49b34f9b25163")

SOURCES: dict[str, tuple[FileSource, ...]] = {
    "gsm8k": (
        FileSource(
            "gsm8k",
            "train.jsonl",
            _raw(*_GSM8K, "grade_school_math/data/train.jsonl"),
            "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
            "gsm8k",
            "train",
            7473,
        ),
        FileSource(
            "gsm8k",
            "test.jsonl",
            _raw(*_GSM8K, "grade_school_math/data/test.jsonl"),
            "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
            "gsm8k",
            "test",
            1319,
        ),
    ),
    "gsm8k_aug": (
        FileSource(
            "gsm8k_aug",
            "valid.txt",
            _raw(*_ICOT, "data/gsm8k/valid.txt"),
            "04f9bddfe8ac4846571b1e2b612b289c95770b5012fdb34cc36a597b041afb87",
            "gsm8k_aug",
            "valid",
            500,
        ),
        FileSource(
            "gsm8k_aug",
            "test.txt",
            _raw(*_ICOT, "data/gsm8k/test.txt"),
            "e464efa2713fbcf423bdbfb482c543a6a086188c3d97c294b1d19a70c2a515e8",
            "gsm8k_aug",
            "test",
            1319,
        ),
        # The upstream file lacks a final newline (shared/data added one: its hash differs).
        FileSource(
            "gsm8k_aug",
            "train_subset_3000.txt",
            _raw(*_COCONUT_ANN, "data/gsm8k/middletrain.txt"),
            "61b549ae8a564b377f570a01a20c15c72a594604cd6ce51ce54bbc071430c27f",
            "gsm8k_aug",
            "train_subset_3000",
            3000,
        ),
    ),
    "gsm8k_aug_full": (
        # 87,805,358 bytes, a Git LFS object; only the ends of its sha256 are on record.
        FileSource(
            "gsm8k_aug",
            "train.txt",
            _lfs(*_ICOT, "data/gsm8k/train.txt"),
            "0a3909a9...bf8c",
            "gsm8k_aug",
            "train",
            385620,
        ),
    ),
    "gsm_hard": (
        FileSource(
            "gsm_hard",
            "gsmhardv2.jsonl",
            _raw(*_PAL, "datasets/gsmhardv2.jsonl"),
            "2032b0188a49ac0ec38cbe1e695e7d62d6dddc44bbb64f920728aca710e9ddef",
            "gsm_hard",
            "test",
            1319,
        ),
    ),
    "svamp": (
        FileSource(
            "svamp",
            "SVAMP.json",
            _raw(*_SVAMP, "SVAMP.json"),
            "5be77703a6d891ae476d7c082787ad361392aa02453b132516cdd5f4e7934e3e",
            "svamp",
            "test",
            1000,
        ),
    ),
    "multiarith": (
        FileSource(
            "multiarith",
            "MultiArith.json",
            _raw(*_ZSCOT, "dataset/MultiArith/MultiArith.json"),
            "dc9db1b6cc68b1ecc2dec830d15aaf8c9a0932aa31d5ffce88ef3628179d36f4",
            "multiarith",
            "all",
            600,
        ),
    ),
    "math500": (
        # Byte-identical to openai/prm800k prm800k/math_splits/test.jsonl (an LFS object there).
        FileSource(
            "math500",
            "test.jsonl",
            _raw(*_BUDGET, "evaluation/data/math500/test_ori.jsonl"),
            "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
            "math500",
            "test",
            500,
        ),
    ),
    "math_train": (
        # The real PRM800K train split (10,896,985 bytes, LFS). shared/data holds a reconstruction.
        FileSource(
            "math_train",
            "train.jsonl",
            _lfs(*_PRM800K, "prm800k/math_splits/train.jsonl"),
            "90d96dae...fe1e8076",
            "math_train",
            "train",
            12000,
        ),
    ),
}
DEFAULT_ALL = tuple(k for k in SOURCES if k != "gsm8k_aug_full")


@dataclasses.dataclass(frozen=True)
class HubSource:
    """A dataset of the Hugging Face hub fetched as a folder: the files of `repo` at `revision` that match
    `pattern`, into `<to>/<subdir>/`. No hashes are on record: the commit fetched is resolved first and written,
    with the rows counted by `count`, to `<to>/<subdir>/SOURCE.json`."""

    subdir: str
    repo: str
    revision: str
    pattern: str
    benchmark: str
    count: Callable[[Path], int]  # the rows of the fetched folder, counted without reading every record

    @property
    def url(self) -> str:
        return f"https://huggingface.co/datasets/{self.repo}/tree/{self.revision}"


HUB_SOURCES: dict[str, HubSource] = {
    # MathX-5M (MIT): the paper's codebook corpus takes a stratified 603K of it (codebook.corpus entry
    # "mathx_5m:train@603000"). The hub's main was at commit 718166a (a README change) when this was written;
    # its full hash was not at hand, so "main" is resolved at download time and the commit written to SOURCE.json.
    "mathx_5m": HubSource("mathx_5m", "XenArcAI/MathX-5M", "main", "data/*.parquet", "mathx_5m", count_rows),
}
SOURCE_RECORD = "SOURCE.json"


class DownloadError(RuntimeError):
    """A file could not be fetched or failed verification."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_matches(digest: str, expected: str) -> bool:
    if "..." in expected:
        head, tail = expected.split("...")
        return digest.startswith(head) and digest.endswith(tail)
    return digest == expected


def count_records(src: FileSource, path: Path) -> int:
    """Parses `path` with the benchmark's reader (raises DataFormatError on a bad record)."""
    return len(BENCHMARKS[src.benchmark].read(path, split=src.split))


def _fetch(url: str, dest: Path, timeout: float) -> None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(dest, "wb") as f:
            shutil.copyfileobj(r, f, length=1 << 20)
    except OSError as e:  # URLError, HTTPError and socket errors are all OSErrors
        raise DownloadError(f"could not fetch {url}: {e}") from None


def download_file(
    src: FileSource,
    to: Path,
    *,
    base_url: str | None = None,
    force: bool = False,
    timeout: float = 60.0,
    log=print,
) -> Path:
    """Fetches one file into `to/<subdir>/<name>` and verifies it; returns the path.

    base_url: a mirror laid out like `to` (hash mismatches are then only reported).
    An existing file with the right record count is kept unless `force`.
    """
    dest = to / src.subdir / src.name
    if dest.is_file() and not force:
        try:
            n = count_records(src, dest)
        except DataFormatError as e:  # a damaged copy (an interrupted edit, another tool's export): fetch anew
            log(f"{src.rel}: present but unreadable ({e}); re-fetching")
        else:
            if n == src.count:
                log(f"{src.rel}: present, {n} records (expected {src.count}); skipped (--force to re-fetch)")
                return dest
            log(f"{src.rel}: present but has {n} records (expected {src.count}); re-fetching")
    url = f"{base_url.rstrip('/')}/{src.rel}" if base_url else src.url
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{src.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _fetch(url, tmp, timeout)
        with open(tmp, "rb") as f:
            if f.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX:
                raise DownloadError(f"{url} returned a Git LFS pointer, not the file")
        digest = sha256_file(tmp)
        if hash_matches(digest, src.sha256):
            hash_note = "sha256 ok"
        elif base_url:
            hash_note = f"sha256 {digest[:12]}… differs from upstream {src.sha256[:12]}… (mirror copy)"
        else:
            raise DownloadError(f"{url}: sha256 {digest} does not match the pinned {src.sha256}")
        try:
            n = count_records(src, tmp)
        except DataFormatError as e:  # name the source: the temporary file is gone when the message is read
            raise DownloadError(e.at(url)) from None
        if n != src.count:
            raise DownloadError(f"{url}: {n} records, expected {src.count}")
        tmp.chmod(0o644)  # mkstemp creates 0600; data files should be readable like any download
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    log(f"{src.rel}: {n} records (expected {src.count}), {hash_note} <- {url}")
    return dest


def download_hub(src: HubSource, to: Path, *, base_url: str | None = None, force: bool = False,
                 log=print) -> Path:
    """Fetches a hub dataset's folder into `to/<subdir>` (skipped when SOURCE.json says it is there, unless
    `force`); a local mirror (`file://`, laid out like `to`) is copied instead. Returns the folder."""
    import json

    dest = to / src.subdir
    if (dest / SOURCE_RECORD).is_file() and not force:
        log(f"{src.subdir}: present ({dest / SOURCE_RECORD}); skipped (--force to re-fetch)")
        return dest
    if base_url:
        if not base_url.startswith("file://"):
            raise DownloadError(f"{src.subdir} comes from the Hugging Face hub ({src.url}); a mirror must be a local "
                                "folder (--from-local) laid out like --to")
        shutil.copytree(Path(urllib.request.url2pathname(base_url[len("file://"):])) / src.subdir, dest,
                        dirs_exist_ok=True)
        sha, origin = "", f"{base_url.rstrip('/')}/{src.subdir}"
    else:
        try:
            from huggingface_hub import HfApi, snapshot_download

            sha = HfApi().dataset_info(src.repo, revision=src.revision).sha
            snapshot_download(repo_id=src.repo, repo_type="dataset", revision=sha, allow_patterns=[src.pattern],
                              local_dir=dest)
        except Exception as e:  # the hub client's HTTP, connection and authentication errors (not all OSErrors)
            raise DownloadError(f"could not fetch {src.url}: {type(e).__name__}: {e}") from None
        origin = src.url
    rows = src.count(dest)
    info = {"repo": src.repo, "revision": src.revision, "commit": sha, "pattern": src.pattern, "rows": rows,
            "from": origin}
    (dest / SOURCE_RECORD).write_text(json.dumps(info, indent=2) + "\n")
    log(f"{src.subdir}: {rows:,} records, commit {sha or '(a local copy)'} <- {origin}")
    return dest


def download(
    names: Sequence[str],
    to: str | os.PathLike,
    *,
    base_url: str | None = None,
    force: bool = False,
    timeout: float = 60.0,
    log=print,
) -> dict[str, Path]:
    """Downloads every file of the named datasets ("all" = DEFAULT_ALL); returns rel path -> file."""
    wanted: list[str] = []
    for name in names:
        if name == "all":
            wanted += DEFAULT_ALL
        elif name in SOURCES or name in HUB_SOURCES:
            wanted.append(name)
        else:
            raise ValueError(f"unknown dataset {name!r}; known: {sorted([*SOURCES, *HUB_SOURCES])} or 'all'")
    out: dict[str, Path] = {}
    for name in dict.fromkeys(wanted):
        if name in HUB_SOURCES:
            hub = HUB_SOURCES[name]
            out[hub.subdir] = download_hub(hub, Path(to), base_url=base_url, force=force, log=log)
            continue
        for src in SOURCES[name]:
            out[src.rel] = download_file(
                src, Path(to), base_url=base_url, force=force, timeout=timeout, log=log
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Download public math-reasoning benchmarks (pinned commits).")
    p.add_argument("names", nargs="+", metavar="NAME",
                   help=f"{', '.join([*SOURCES, *HUB_SOURCES])} or all (every one but gsm8k_aug_full, the 88 MB full "
                   "GSM8K-Aug train set, without which gsm8k_aug:train reads the 3,000-line subset, and mathx_5m, "
                   f"MathX-5M's parquet files from {HUB_SOURCES['mathx_5m'].url}: gigabytes)")
    p.add_argument(
        "--to",
        default=os.environ.get("DLR_DATA_DIR", "data"),
        help="destination root (default: $DLR_DATA_DIR or ./data)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--mirror",
        default=os.environ.get(MIRROR_ENV),
        help=f"base URL laid out like --to (default: ${MIRROR_ENV}); file:// works",
    )
    src.add_argument("--from-local", type=Path, help="a local directory laid out like --to")
    p.add_argument("--force", action="store_true", help="re-fetch files that are already present")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per connection")
    a = p.parse_args(argv)
    base = a.from_local.resolve().as_uri() if a.from_local else a.mirror
    try:
        files = download(a.names, a.to, base_url=base, force=a.force, timeout=a.timeout)
    except (DownloadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{len(files)} file(s) under {Path(a.to).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
