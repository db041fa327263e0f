"""The ``images_large`` workload's side of ``compare.py``: rows, output checks, report, goals.

``compare.py`` times the rows (:func:`contenders`) like every workload's; this
module adds what only this workload has: the limit (``images_large.measure_limit``),
the baseline (the hand-written DataLoader at its best setting), a pixel check
pass on a small shard where every implementation crops with the key's crop
(so the pixels must agree wherever the decoders do), the datapipes
``Loader.stats()`` table of one pass, and the report section with the goals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import images_large as data
import images_large_peers as peers
import torch

import datapipes as dp

HAND = "hand-written IterableDataset in DataLoader"
TITLE = (
    "tar shards -> shuffle files -> JPEG decode -> random resized crop 224 + flip -> "
    "batch({batch}) uint8 -> normalize in the main process, {{n:,}} ImageNet-like photos"
)
CHECK_SAMPLES = 24  # photos in the pixel-check shard
PEER_GOAL = 1.5  # datapipes' best against the best peer's best


@dataclass
class Timed:
    """What the report needs of one timed row (``compare.Row`` without the callable)."""

    name: str
    best: float
    cpu: float
    skipped: str | None


def library(name: str) -> str:
    """``"webdataset (2 workers)"`` -> ``"webdataset"``."""
    return name.rsplit(" (", 1)[0]


def contenders(quick: bool) -> list[tuple[str, Callable[..., Iterator[Any]], int]]:
    """(row name, ``make(paths, setting, batch)``, setting) for every implementation and
    setting tried: worker processes 0-3, threads 1/2/4 (fewer with ``quick``)."""
    workers = (0, 2) if quick else (0, 1, 2, 3)
    threads = (2,) if quick else (1, 2, 4)
    rows: list[tuple[str, Callable[..., Iterator[Any]], int]] = []
    rows += [(f"{HAND} ({w} workers)", peers.hand_written, w) for w in workers]
    rows += [(f"webdataset ({w} workers)", peers.webdataset, w) for w in workers]
    if peers.spdl_unavailable() is None:
        rows += [(f"SPDL thread pipeline ({t} threads)", peers.spdl_pipeline, t) for t in threads]
    else:  # one row, skipped once with the reason (its pass raises it at once)
        rows.append(("SPDL thread pipeline", peers.spdl_pipeline, threads[0]))
    rows += [(f"Grain ({t} threads)", peers.grain_threads, t) for t in threads]
    rows += [(f"Grain mp_prefetch ({w} workers)", peers.grain_processes, w) for w in (2,)]
    ours = (0, 2) if quick else (0, 2, 3)
    rows += [(f"datapipes ({w} workers)", peers.datapipes, w) for w in ours]
    if not peers.has_fast_path() or peers.thread_keyword():  # a way to decode on threads
        counts = (2,) if quick else (2, 3)
        rows += [(f"datapipes, threads ({t} threads)", peers.datapipes_threads, t) for t in counts]
    if peers.has_fast_path() and peers.thread_keyword():  # threads inside worker processes
        name = "datapipes, threads (2 workers x 2 threads)"
        rows.append((name, peers.datapipes_workers_threads, 2))
    return rows


def keep(batch: peers.Batch) -> tuple[int, int, list[str]]:
    """The main process's share of every implementation: the batch "on the device"
    (normalized), checked for shape and type; its count, label sum and keys."""
    images, labels, keys = batch
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, data.SIZE, data.SIZE), (
        images.dtype,
        images.shape,
    )
    normalized = data.on_device(images)
    assert normalized.dtype == torch.float32 and len(keys) == len(labels) == len(images)
    return len(keys), int(labels.sum()), keys


def digest(kept: list[tuple[int, int, list[str]]]) -> tuple[int, int, str]:
    """(samples, label sum, digest of the sorted keys): the same for every library."""
    keys = [key for k in kept for key in k[2]]
    return sum(k[0] for k in kept), sum(k[1] for k in kept), data.keys_digest(keys)


def expected(manifest: dict[str, Any]) -> tuple[int, int, str]:
    return manifest["samples"], manifest["label_sum"], manifest["keys_digest"]


# ----- pixel checks ---------------------------------------------------------------------------
def collect(batches: Iterator[peers.Batch]) -> dict[str, torch.Tensor]:
    return {key: image for images, _, keys in batches for key, image in zip(keys, images)}


def datapipes_decoded(paths: list[str], backend: str | None, batch: int) -> Iterator[peers.Batch]:
    """The library's ``decode`` (``image_backend=backend``) + the key's crop (HWC pixels)."""
    extra = {} if backend is None else {"image_backend": backend}
    pipe = dp.files(paths).read_tar().decode(image="hwc", **extra).map(hwc_example).batch(batch)
    return (peers.as_batch(b) for b in dp.Loader(pipe, seed=peers.SEED))


def hwc_example(sample: dict[str, Any]) -> peers.Example:
    pixels, key = sample["jpg"].numpy(), sample["__key__"]
    crop = data.key_crop(key, pixels.shape[1], pixels.shape[0])
    return data.resized_crop(pixels, crop), sample["cls"], key


def datapipes_crops(paths: list[str], batch: int, fused: bool) -> dict[str, torch.Tensor]:
    """The fast path's own crops (its seeded boxes) of the check shard, fused or not."""
    pipe = dp.files(paths).read_tar().decode(image_backend="auto")
    pipe = pipe.random_resized_crop(data.SIZE, seed=peers.SEED, fused=fused).batch(batch)
    return collect(peers.as_batch(b) for b in dp.Loader(pipe, seed=peers.SEED))


def compared(name: str, got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> str:
    """One line: how many crops are identical to the reference's, and the largest difference."""
    if sorted(got) != sorted(reference):
        return f"{name}: DIFFERENT KEYS ({len(got)} vs {len(reference)})"
    diffs = [(got[k].int() - reference[k].int()).abs() for k in reference]
    same = sum(int(d.max()) == 0 for d in diffs)
    worst = max(int(d.max()) for d in diffs)
    mean = sum(float(d.float().mean()) for d in diffs) / len(diffs)
    verdict = "identical" if same == len(diffs) else "differ"
    return (
        f"{name}: {verdict}: {same}/{len(diffs)} crops identical, "
        f"max abs diff {worst}, mean abs diff {mean:.3f}"
    )


def pixel_checks(paths: list[str], batch: int) -> list[str]:
    """Each implementation's crops of the check shard (key crops) against the hand-written
    DataLoader's (Pillow, full scale): identical, or how far off, or why not compared."""
    makers: dict[str, Callable[[], Iterator[peers.Batch]]] = {
        "webdataset (decode pil)": partial(peers.webdataset, paths, 0, batch),
        "SPDL (load_image, FFmpeg)": partial(peers.spdl_pipeline, paths, 1, batch),
        "Grain (Pillow)": partial(peers.grain_threads, paths, 1, batch),
    }
    if peers.has_fast_path():
        region = ("nvimgcodec",) if data.has_region_decoder() else ()
        for backend in ("pillow", "simplejpeg", *region, "auto"):
            makers[f"datapipes decode(image_backend={backend!r})"] = partial(
                datapipes_decoded, paths, backend, batch
            )
    else:
        makers["datapipes decode() (Pillow)"] = partial(datapipes_decoded, paths, None, batch)
    reference = collect(peers.hand_written(paths, 0, batch))
    lines = [f"reference: {HAND}, Pillow full scale, {len(reference)} photos"]
    for name, make in makers.items():
        try:
            got = collect(make())
        except Exception as error:  # a peer that cannot run is reported, not fatal
            lines.append(f"{name}: not checked ({type(error).__name__}: {error})"[:200])
            continue
        lines.append(compared(name, got, reference))
    if peers.has_fast_path():  # its own boxes: fused (reduced DCT scale) against full scale
        try:
            full = datapipes_crops(paths, batch, fused=False)
            fused = datapipes_crops(paths, batch, fused=True)
            name = "datapipes random_resized_crop fused vs fused=False"
            lines.append(compared(name, fused, full))
        except Exception as error:  # reported, not fatal
            lines.append(f"datapipes random_resized_crop: not checked ({error})"[:200])
    return lines


def check_shard(workdir: Path) -> list[str]:
    made = data.generate_shards(workdir / "photos-check", 1, CHECK_SAMPLES, 1)
    return [str(workdir / "photos-check" / name) for name in made["files"]]


def stats_tables(paths: list[str], batch: int) -> dict[str, str]:
    """``Loader.stats()`` of one datapipes pass per variant (0 and 2 workers, and 2 threads
    where the library decodes on threads), as text tables by the variant's name."""
    variants = {"0 workers": (0, 0), "2 workers": (2, 0)}
    if not peers.has_fast_path() or peers.thread_keyword():
        variants["2 threads"] = (0, 2)
    tables = {}
    for name, (workers, threads) in variants.items():
        got: list[Any] = []
        for b in peers.datapipes(paths, workers, batch, stats=got, threads=threads):
            keep(b)
        tables[name] = got[0].table()
    return tables


# ----- the report ----------------------------------------------------------------------------
def baseline_name(rows: list[Timed]) -> str | None:
    """The hand-written DataLoader's fastest setting: every row's baseline."""
    hand = [r for r in rows if library(r.name) == HAND and not r.skipped]
    return min(hand, key=lambda r: r.best).name if hand else None


def best_per_library(rows: list[Timed]) -> dict[str, Timed]:
    """The fastest row of each library (datapipes' variants count as one library)."""
    best: dict[str, Timed] = {}
    for row in rows:
        if row.skipped:
            continue
        lib = "datapipes" if row.name.startswith("datapipes") else library(row.name)
        lib = "Grain" if lib.startswith("Grain") else lib
        if lib not in best or row.best < best[lib].best:
            best[lib] = row
    return best


def section(rows: list[Timed], info: dict[str, Any]) -> list[str]:
    """The markdown section: data, limit, the table, best per library, checks, stats."""
    manifest, limit, items = info["manifest"], info["limit"], info["manifest"]["samples"]
    out = ["", "## images_large", ""]
    out.append(
        f"{items:,} generated photos (about 500x375, quality 90, mean JPEG "
        f"{manifest['mean_jpeg_kb']} KB) in {len(manifest['files'])} tar shards of "
        f"{sum(manifest['sizes']) / len(manifest['sizes']) / 1e6:.0f} MB; batch "
        f"{info['batch']}; the peers' crops are seeded by the sample key, datapipes' by its "
        "own `random_resized_crop` seed."
    )
    out += [
        "",
        "The limits: decode + crop + resize of one photo, single thread, in memory (best of "
        "a measurement before the rows' turns and one after):",
        "",
    ]
    region = limit.get("region")
    out += ["| decoder | images/s (1 thread) |", "| --- | ---: |"]
    out += [f"| {name} | {rate:,.0f} |" for name, rate in limit["rates"].items()]
    if region is not None:
        out += [f"| {name} | {rate:,.0f} |" for name, rate in region["rates"].items()]
    shares = ", ".join(f"{scale}: {share:.0%}" for scale, share in limit["reducible"].items())
    out += [
        "",
        f"Photos whose crop (>= 224 a side after the reduction) allows a reduced DCT scale: "
        f"{shares}.",
        "",
        f"- Today's limit (a whole decode, then the crop): today's limit = "
        f"{limit['rates'][limit['fastest']]:,.0f} ({limit['fastest']}) x "
        f"{limit['cores']} cores = **{limit['limit']:,.0f} images/s** "
        f"({1e3 / limit['rates'][limit['fastest']]:.2f} CPU ms/image; a row's CPU ms/image "
        "includes its tar reading, batching, normalizing and process or thread overheads, "
        "and is less disturbed by other load than its wall time)",
    ]
    if region is None:
        out.append(
            "- The region-decode limit: not measured (nvImageCodec is not installed: "
            "pip install 'datapipes-torch[jpeg-region]')"
        )
    else:
        single = region["rates"][region["fastest"]]
        out.append(
            f"- The region-decode limit (only the crop's box decoded): {region['fastest']}, "
            f"{limit['cores']} processes at once, one per core, measured: "
            f"**{region['limit']:,.0f} images/s** (one thread: {single:,.0f}; "
            f"{limit['cores']} x that would be {single * limit['cores']:,.0f})"
        )
    out += [
        "",
        "Other load on the machine lowers the measured region-decode limit (its processes "
        "share the cores with it) while today's limit assumes every core free; the last "
        "column is the load-resistant view: the region decode + crop's CPU time per image "
        "on one thread over the row's CPU time per image (all its processes, reading, "
        "batching and normalizing included).",
        "",
    ]
    base = next((r for r in rows if r.name == info.get("baseline")), None)
    out += [
        "| implementation | images/s | of today's limit | of the region limit | CPU time "
        "| CPU ms/image | vs baseline | region decode's CPU ms / this row's |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    region_ms = None if region is None else 1e3 / region["rates"][region["fastest"]]
    for row in rows:
        if row.skipped:
            out.append(f"| {row.name} | — | — | — | — | — | skipped: {row.skipped} | — |")
            continue
        rate = items / row.best
        ratio = f"{base.best / row.best:.2f}x" if base else "n/a"
        ms = 1e3 * row.cpu / items
        out.append(
            f"| {row.name} | {rate:,.0f} | {share(rate, limit['limit'])} "
            f"| {share(rate, region_limit(limit))} "
            f"| {row.cpu:.1f} s | {ms:.2f} | {ratio} | {share(region_ms or 0.0, ms)} |"
        )
    out += ["", "Each library at its best setting:", ""]
    out += ["| library | best setting | images/s | of today's limit | of the region limit "]
    out[-1] += "| vs baseline |"
    out += ["| --- | --- | ---: | ---: | ---: | ---: |"]
    for lib, row in best_per_library(rows).items():
        rate = items / row.best
        ratio = f"{base.best / row.best:.2f}x" if base else "n/a"
        out.append(
            f"| {lib} | {row.name} | {rate:,.0f} | {share(rate, limit['limit'])} "
            f"| {share(rate, region_limit(limit))} | {ratio} |"
        )
    out += ["", "Pixel checks (key crops on a small shard, against Pillow full scale):", ""]
    out += [f"- {line}" for line in info.get("pixels", ["not run"])]
    for variant, table in info.get("stats", {}).items():
        out += ["", f"Where the time goes: datapipes ({variant}), `loader.stats()`:", ""]
        out += ["```", table, "```"]
    return out


def region_limit(limit: dict[str, Any]) -> float | None:
    """The region-decode limit in images/s, or None where it was not measured."""
    region = limit.get("region")
    return None if region is None else region["limit"]


def share(rate: float, of: float | None) -> str:
    """``rate`` as a percentage of ``of`` ("n/a" when there is no ``of``)."""
    return "n/a" if not of else f"{100 * rate / of:.0f}%"


def goals(rows: list[Timed], info: dict[str, Any]) -> list[tuple[bool | None, str]]:
    """(ok or None when not measured, text) for the three goals of this workload."""
    items, today, region = (
        info["manifest"]["samples"],
        info["limit"]["limit"],
        region_limit(info["limit"]),
    )
    best = best_per_library(rows)
    ours = best.get("datapipes")
    theirs = [row for lib, row in best.items() if lib != "datapipes"]
    by_name = {row.name: row for row in rows if not row.skipped}
    out: list[tuple[bool | None, str]] = []
    goal = "datapipes >= 85% of the region-decode limit on images_large"
    if ours is None:
        out.append((None, f"{goal}: n/a"))
    elif region is None:
        out.append(
            (
                None,
                f"{goal}: n/a (not measured; {share(items / ours.best, today)} of today's limit)",
            )
        )
    else:
        rate = items / ours.best
        out.append(
            (
                rate >= 0.85 * region,
                f"{goal}: {share(rate, region)} ({share(rate, today)} of today's limit)",
            )
        )
    goal = f"datapipes >= {PEER_GOAL}x the best peer on images_large"
    if ours is None or not theirs:
        out.append((None, f"{goal}: n/a"))
    else:
        peer = min(theirs, key=lambda r: r.best)
        speedup = peer.best / ours.best
        text = f"{goal}: {speedup:.2f}x ({ours.name} vs {peer.name})"
        out.append((speedup >= PEER_GOAL, text))
    zero, two = by_name.get("datapipes (0 workers)"), by_name.get("datapipes (2 workers)")
    if zero and two:
        scale = zero.best / two.best
        out.append(
            (scale >= 1.6, f"datapipes 2 workers >= 1.6x 0 workers on images_large: {scale:.2f}x")
        )
    else:
        out.append((None, "datapipes 2 workers >= 1.6x 0 workers on images_large: n/a"))
    return out
