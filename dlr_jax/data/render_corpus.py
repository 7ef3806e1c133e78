"""Render a corpus's CoTs once into a TFDS dataset (array_record), and read it back through grain.

    python -m dlr_jax.data.render_corpus --config configs/tiny.yaml --split train --out DIR
        [--num-shards S] [--shard I] [--workers W] [--set key=value ...]

The codebook stage draws every training CoT again each epoch, on the host (`render_pipeline`). At the
paper's scale (GSM8K-Aug, ~385k CoTs, 3 epochs, canvases up to 1024 px, every host of a pod drawing
its own rows) the host's drawing rate can bound the step. This module draws each CoT once, with the
stage's exact settings (`render_pipeline.render_config(codebook)`, one font size per example from
`render_pipeline.sample_font_sizes(n, run.seed)`, as `BatchPlan` draws them), and stores it; the stage
then reads the images (`codebook.render_cache: DIR`) instead of drawing them.

Layout of DIR:
    render_cache.json                     what was rendered: split, examples, shards, render settings
                                          (render config, seed, font file digest), corpus digest
    shards/<split>-<i>-of-<S>/            one TFDS dataset per shard, examples [i*n//S, (i+1)*n//S):
        dlr_render_corpus/1.0.0/...       array_record; features png (bytes, grey PNG), text, side,
                                          font_size (the sampled size), drawn_font_size, id
        ids.npy                           record position -> example id, read back after the build;
                                          a shard counts as done once this file exists

Resuming: a rerun skips done shards (TFDS writes a shard to a temporary folder and renames it when
complete, so a killed run leaves no half shard behind). `--shard I` renders one shard only, so shards
can be drawn by separate processes or hosts into one shared DIR. A rerun whose settings or corpus
differ from render_cache.json is refused, so a cache never mixes two renderings.

Why these choices: `tfds.features.Image` and `store_as_tfds_dataset` need TensorFlow; a
`GeneratorBasedBuilder` with `file_format="array_record"` does not, so the image is stored as PNG bytes
in a scalar `np.object_` tensor (Pillow encodes and decodes it). Records are written unshuffled
(`disable_shuffling`), and every read is still looked up by example id through ids.npy and checked
against the record's own id, so the order never depends on how TFDS laid the records out.
Reading: `tfds.data_source` per shard (random access, no TensorFlow) -> `grain.MapDataset.source`,
concatenated; any process reads any example, so each process takes just its own rows of a batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import io
import json
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

# Both are needed at run time by tensorflow-datasets, which declares the first for Linux only and the
# second for Python < 3.9 only (its builders import it on every Python): pyproject.toml declares them,
# and importing them here fails at import with the missing name, not in the middle of a render.
import array_record  # noqa: F401  (the cache's file format: TFDS writes and reads shards through it)
import grain
import importlib_resources  # noqa: F401
import numpy as np
import tensorflow_datasets as tfds
from PIL import Image
from tqdm import tqdm

from dlr_jax.core.files import write_text_atomic
from dlr_jax.data import render_pipeline as rp
from dlr_jax.text import render

FORMAT = 1
BUILDER = "dlr_render_corpus"
MANIFEST = "render_cache.json"
SPLITS = ("train",)  # held-out and export rendering use the mean font size and stay on the fly


class RenderCacheError(ValueError):
    """A render cache that is missing, unfinished, or rendered with other settings than asked."""


# ---- what a rendering depends on ------------------------------------------------------------


def _sha256_file(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def render_settings(config: render.RenderConfig, seed: int) -> dict[str, Any]:
    """Everything besides the texts that decides the pixels: the render config (the font file by its
    digest, so the same font at another path matches), and the seed of the per-example font sizes."""
    d = dataclasses.asdict(config)
    d["font_path"] = None
    d["font_sha256"] = _sha256_file(config.font_path or render.default_font_path())
    d["seed"] = int(seed)
    return d


def corpus_digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256(str(len(texts)).encode())
    for t in texts:
        h.update(b"\0" + t.encode("utf-8"))
    return h.hexdigest()


def shard_name(split: str, i: int, num_shards: int) -> str:
    return f"{split}-{i:05d}-of-{num_shards:05d}"


def shard_bounds(n: int, i: int, num_shards: int) -> tuple[int, int]:
    return i * n // num_shards, (i + 1) * n // num_shards


# ---- PNG --------------------------------------------------------------------------------------


def encode_png(image: np.ndarray) -> bytes:
    """uint8 [L, L] grey -> PNG bytes (lossless)."""
    buf = io.BytesIO()
    Image.fromarray(image, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("L"))


def render_example(i: int, *, texts: Sequence[str], fonts: np.ndarray, config: render.RenderConfig
                   ) -> dict[str, Any]:
    """Example i drawn as `render_pipeline.render_images` draws it (grey = channel 0 of the RGB image)."""
    r = render.render_cot_ex(texts[i], font_size=int(fonts[i]), config=config)
    return {"png": encode_png(np.asarray(r.image)[..., 0]), "text": texts[i], "side": r.side,
            "font_size": int(fonts[i]), "drawn_font_size": r.font_size, "id": i}


# ---- writing ----------------------------------------------------------------------------------


class DlrRenderCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One shard of a rendered corpus. Not registered by name: readers open the files
    (`tfds.data_source` falls back to the dataset_info.json / features.json written here)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "PNG bytes, text, side, font sizes, example id."}

    def __init__(self, *, examples: Iterable[dict[str, Any]] = (), split: str = "train",
                 metadata: dict[str, Any] | None = None, **kwargs: Any):
        self._examples, self._split, self._metadata = examples, split, metadata or {}
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="CoTs rendered by dlr_jax.text.render (grey PNG) for the codebook stage.",
            features=tfds.features.FeaturesDict({
                "png": tfds.features.Tensor(shape=(), dtype=np.object_),
                "text": tfds.features.Text(),
                "side": tfds.features.Scalar(dtype=np.int32),
                "font_size": tfds.features.Scalar(dtype=np.int32),
                "drawn_font_size": tfds.features.Scalar(dtype=np.int32),
                "id": tfds.features.Scalar(dtype=np.int64),
            }),
            metadata=tfds.core.MetadataDict(self._metadata),
            disable_shuffling=True,  # records in id order (reads still go through ids.npy)
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator]:
        return {self._split: self._generate_examples()}

    def _generate_examples(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for ex in self._examples:
            yield ex["id"], ex


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Writes render_cache.json, or checks that the one there describes the same rendering."""
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        keys = ("format", "split", "examples", "num_shards", "settings", "corpus_sha256")
        diff = {k: (old.get(k), manifest[k]) for k in keys if old.get(k) != manifest[k]}
        if diff:
            raise RenderCacheError(f"{out} holds another rendering (recorded vs now: {_describe(diff)}); "
                                   "render into a new --out, or delete it first")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(manifest, indent=2))  # shards rendered by several processes write it


def _describe(diff: dict[str, tuple[Any, Any]]) -> str:
    parts = []
    for k, (a, b) in diff.items():
        if isinstance(a, dict) and isinstance(b, dict):
            parts += [f"{k}.{kk}: {a.get(kk)!r} vs {b.get(kk)!r}" for kk in sorted(set(a) | set(b))
                      if a.get(kk) != b.get(kk)]
        else:
            parts.append(f"{k}: {a!r} vs {b!r}")
    return "; ".join(parts)


def shard_done(out: Path, name: str) -> bool:
    return (out / "shards" / name / "ids.npy").is_file()


def write_corpus(texts: Sequence[str], config: render.RenderConfig, seed: int, out: str | Path, *,
                 split: str = "train", num_shards: int = 1, shards: Sequence[int] | None = None,
                 num_workers: int = 0, num_threads: int = 1, progress: bool = True) -> dict[str, Any]:
    """Renders `texts` (font sizes as `BatchPlan(texts, seed=seed)` samples them) into `out`; only the
    shards in `shards` (default all) that are not done yet. Returns the manifest."""
    out = Path(out)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 1 <= num_shards <= max(1, len(texts)):
        raise ValueError(f"num_shards must be in [1, {len(texts)}], got {num_shards}")
    manifest = {"format": FORMAT, "builder": BUILDER, "split": split, "examples": len(texts),
                "num_shards": num_shards, "settings": render_settings(config, seed),
                "corpus_sha256": corpus_digest(texts), "pillow": Image.__version__}
    _write_manifest(out, manifest)
    fonts = rp.sample_font_sizes(len(texts), seed, config)
    todo = [i for i in (range(num_shards) if shards is None else shards)
            if not shard_done(out, shard_name(split, i, num_shards))]
    bad = [i for i in todo if not 0 <= i < num_shards]
    if bad:
        raise ValueError(f"shard indices {bad} outside [0, {num_shards})")
    total = sum(np.subtract(*shard_bounds(len(texts), i, num_shards)[::-1]) for i in todo)
    tfds.disable_progress_bar()  # ours counts examples across shards
    bar = tqdm(total=int(total), unit="img", desc=f"render {split}", disable=not progress)
    for i in todo:
        lo, hi = shard_bounds(len(texts), i, num_shards)
        sdir = out / "shards" / shard_name(split, i, num_shards)
        if sdir.exists():  # an interrupted build: TFDS's own temporary folders, never a finished shard
            shutil.rmtree(sdir)
        draw = grain.MapDataset.range(lo, hi).map(
            functools.partial(render_example, texts=texts, fonts=fonts, config=config))
        examples = _counted(rp._finish(draw, num_workers, num_threads), bar)
        builder = DlrRenderCorpus(examples=examples, split=split, metadata=manifest, data_dir=str(sdir),
                                  file_format="array_record")
        builder.download_and_prepare()
        src = tfds.data_source(BUILDER, data_dir=str(sdir), split=split, download=False)
        ids = np.asarray([src[j]["id"] for j in range(len(src))], np.int64)
        if sorted(ids.tolist()) != list(range(lo, hi)):  # written and read back: every example once
            raise RenderCacheError(f"shard {sdir} holds ids {ids[:8]}..., expected {lo}..{hi - 1}")
        np.save(sdir / "ids.npy", ids)
    bar.close()
    return manifest


def _counted(it: Iterable[dict[str, Any]], bar: tqdm) -> Iterator[dict[str, Any]]:
    for ex in it:
        bar.update(1)
        yield ex


# ---- reading ----------------------------------------------------------------------------------


class RenderCache:
    """A finished rendered corpus: `images(idx, side)` for a batch plan, `dataset()` for a sweep.
    Picklable for grain workers (the TFDS sources are opened again in each process)."""

    def __init__(self, path: str | Path, split: str = "train"):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not mpath.is_file():
            raise RenderCacheError(f"no render cache at {self.path} ({MANIFEST} missing); render it with "
                                   f"python -m dlr_jax.data.render_corpus --config C --split {split} --out {path}")
        self.manifest = json.loads(mpath.read_text())
        if self.manifest.get("format") != FORMAT or self.manifest.get("split") != split:
            raise RenderCacheError(f"{mpath}: format {self.manifest.get('format')} split "
                                   f"{self.manifest.get('split')!r}, expected format {FORMAT} split {split!r}")
        self.split, self.num_shards, n = split, self.manifest["num_shards"], self.manifest["examples"]
        self.names = [shard_name(split, i, self.num_shards) for i in range(self.num_shards)]
        missing = [i for i, s in enumerate(self.names) if not shard_done(self.path, s)]
        if missing:
            raise RenderCacheError(f"render cache {self.path} is unfinished: shards {missing} of {self.num_shards} "
                                   "are missing; rerun the same render_corpus command to finish them")
        # example id -> position in the concatenated shards
        self.position = np.full(n, -1, np.int64)
        offset = 0
        for s in self.names:
            ids = np.load(self.path / "shards" / s / "ids.npy")
            self.position[ids] = offset + np.arange(len(ids))
            offset += len(ids)
        if offset != n or (self.position < 0).any():
            raise RenderCacheError(f"render cache {self.path}: shards hold {offset} records, not each of {n} once")
        self._records: grain.MapDataset | None = None

    def __len__(self) -> int:
        return len(self.position)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_records": None}

    @property
    def records(self) -> grain.MapDataset:
        """All records, shard after shard, as TFDS stores them (`tfds.data_source` per shard)."""
        if self._records is None:
            self._records = grain.MapDataset.concatenate([
                grain.MapDataset.source(tfds.data_source(BUILDER, data_dir=str(self.path / "shards" / s),
                                                         split=self.split, download=False))
                for s in self.names])
        return self._records

    def check(self, texts: Sequence[str], config: render.RenderConfig, seed: int) -> None:
        """Raises `RenderCacheError` unless this cache is `texts` rendered with `config` and `seed`."""
        now = {"examples": len(texts), "settings": render_settings(config, seed),
               "corpus_sha256": corpus_digest(texts)}
        diff = {k: (self.manifest[k], v) for k, v in now.items() if self.manifest[k] != v}
        if diff:
            raise RenderCacheError(
                f"render cache {self.path} does not match this config (cache vs config: {_describe(diff)}); "
                "re-render it with this config, or set codebook.render_cache='' to render on the fly")

    def record(self, i: int) -> dict[str, Any]:
        rec = self.records[int(self.position[i])]
        if int(rec["id"]) != i:
            raise RenderCacheError(f"render cache {self.path}: record for example {i} holds id {rec['id']}")
        return rec

    def example(self, i: int) -> dict[str, Any]:
        """Example i decoded: image uint8 [L, L], text, side, font_size, id."""
        rec = self.record(i)
        text = rec["text"].decode("utf-8") if isinstance(rec["text"], bytes) else str(rec["text"])
        return {"image": decode_png(rec["png"]), "text": text, "side": int(rec["side"]),
                "font_size": int(rec["font_size"]), "id": i}

    def images(self, idx: Sequence[int], side: int) -> np.ndarray:
        """uint8 [len(idx), side, side]: what `render_pipeline.render_images` draws for these examples."""
        out = np.empty((len(idx), side, side), np.uint8)
        for k, i in enumerate(idx):
            img = decode_png(self.record(int(i))["png"])
            if img.shape != (side, side):
                raise RenderCacheError(f"render cache {self.path}: example {i} is {img.shape}, planned side {side}")
            out[k] = img
        return out

    def dataset(self, shard_index: int = 0, shard_count: int = 1) -> grain.MapDataset:
        """Decoded examples in id order; this process's contiguous part when `shard_count` > 1."""
        lo, hi = shard_bounds(len(self), shard_index, shard_count)
        return grain.MapDataset.range(lo, hi).map(self.example)


# ---- command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m dlr_jax.data.render_corpus", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(__doc__.split("\n\n")[:1] + __doc__.split("\n\n")[2:5]),
        epilog="Then train with --set codebook.render_cache=DIR (the same config: the cache checks it).")
    ap.add_argument("--config", help="YAML config whose codebook section and run.seed set the rendering")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value (repeatable), as in python -m dlr_jax.train")
    ap.add_argument("--split", choices=SPLITS, default="train",
                    help="train: the codebook stage's training corpus (codebook.corpus, else data.train_split)")
    ap.add_argument("--out", required=True, help="cache directory (created; a rerun resumes it)")
    ap.add_argument("--num-shards", type=int, default=1, help="shards of the cache (the unit of resuming)")
    ap.add_argument("--shard", type=int, action="append", default=None,
                    help="render only this shard index (repeatable; default: every shard not yet done)")
    ap.add_argument("--workers", type=int, default=None,
                    help="grain worker processes drawing images (default: data.num_workers)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    from dlr_jax.config import load_config
    from dlr_jax.data.sources import corpus_texts

    cfg = load_config(args.config, args.overrides)
    texts = corpus_texts(cfg)
    workers = cfg.data.num_workers if args.workers is None else args.workers
    manifest = write_corpus(texts, rp.render_config(cfg.codebook), cfg.run.seed, args.out, split=args.split,
                            num_shards=args.num_shards, shards=args.shard, num_workers=workers,
                            progress=not args.no_progress)
    done = sum(shard_done(Path(args.out), shard_name(args.split, i, args.num_shards)) for i in range(args.num_shards))
    print(f"[render_corpus] {manifest['examples']} CoTs, {done}/{args.num_shards} shards done in {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
