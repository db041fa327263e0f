"""Ranks of a ``dp.write`` job that share nothing but the destination (no process group).

``python tests/write_job.py CONFIG_JSON``: the config names the JSONL input glob
``data``, the destination ``dest`` (a folder or an ``s3://`` URL, with
``storage_options``), the ``world_size`` and either one ``rank`` (this process is
that rank) or ``ranks``, a list: this process imports datapipes once and forks one
process per rank (cheaper than an interpreter each; the forked ranks are separate
processes with their own pids, markers and DataLoader workers), writes
``<out>/pids.<its pid>.json`` (``{rank: pid}``) and exits once they all ended, with
``<out>/ended.<its pid>.json`` (``{rank: exit code, or -signal}``). ``workers`` is
each rank's ``num_workers``; ``format``, ``records_per_shard``, ``min_units`` and
``stale_seconds`` go to ``dp.write``. A rank whose ``dp.write`` returned writes
``<out>/result.<rank>.<pid>.json``: its stats and the warnings it got.

The recipe reads the input and makes records with a text and a bytes "image" (a
digest of the text, repeated); ``WRITE_JOB_DELAY`` (seconds, environment) is slept per
record, so that kills land mid-write: it is not part of the recipe.

Test instrumentation: ``WRITE_JOB_KILL`` (JSON ``{"rank": r, "at": point, "n": n,
"flag": path}``) makes ``Destination.publish`` SIGKILL a process of rank ``r`` (its main
process or a DataLoader worker: whichever gets there first) at ``point``:
``shard_mid`` (the n-th shard this process publishes, half of its temporary file
written), ``shard_rename`` (that shard's temporary complete, right before
``os.replace``), ``manifest_mid`` or ``manifest_rename`` (the manifest, likewise); with
``"worker_only": true`` only its DataLoader workers count and fire. Only one
process of a job fires: the first to create ``flag`` (it writes its pid there).
On an object store (no temporaries) every point kills before the upload.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any

import datapipes as dp
from datapipes.write import destination as destination_module
from datapipes.write.manifest import MANIFEST

DELAY = float(os.environ.get("WRITE_JOB_DELAY", "0"))


def make_record(line: dict[str, Any]) -> dict[str, Any]:
    """A document with a text and an "image" (bytes), keyed by its id."""
    if DELAY:
        time.sleep(DELAY)
    text = str(line["text"])
    image = hashlib.sha256(text.encode()).digest() * (1 + int(line["id"]) % 5)
    return {"__key__": f"doc{int(line['id']):06d}", "txt": text, "jpg": image}


def recipe(data: str) -> dp.DataPipe[Any]:
    return dp.files(data).read_jsonl().map(make_record)


# ----- the kill hook (test instrumentation) --------------------------------------------------


def arm_kill_hook(hook: dict[str, Any]) -> None:
    """Patch ``Destination.publish`` in this process (and the DataLoader workers it forks)."""
    original = destination_module.Destination.publish
    point, target = hook["at"], int(hook["n"])
    main_pid = os.getpid()  # the rank's main process (a worker is forked from it)
    shards = [0]

    def fire() -> None:
        try:
            claim = os.open(hook["flag"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # another process of the job fired already
        os.write(claim, str(os.getpid()).encode())
        os.close(claim)
        os.kill(os.getpid(), signal.SIGKILL)

    def publish(self: Any, name: str, data: bytes) -> None:
        if hook.get("worker_only") and os.getpid() == main_pid:
            return original(self, name, data)
        if point.startswith("shard_"):
            if not os.path.basename(name).startswith("shard-"):
                return original(self, name, data)
            shards[0] += 1
            due = shards[0] == target
        else:
            due = name == MANIFEST
        if not due:
            return original(self, name, data)
        if not self.renames:  # an object store: one upload, nothing half written to see
            fire()
            return original(self, name, data)
        final = self.path(name)
        folder, base = os.path.split(final)
        temporary = os.path.join(
            folder,
            f".{base}.tmp-{self.host}-{os.getpid()}-{next(destination_module._counter)}",  # noqa: SLF001
        )
        os.makedirs(folder, exist_ok=True)
        with open(temporary, "wb") as out:
            out.write(data if point.endswith("_rename") else data[: len(data) // 2])
        fire()
        os.replace(temporary, final)  # only when another process fired first

    destination_module.Destination.publish = publish  # type: ignore[method-assign]


# ----- one rank, and the launcher ----------------------------------------------------------


def run_rank(config: dict[str, Any], rank: int) -> None:
    hook = os.environ.get("WRITE_JOB_KILL")
    if hook and json.loads(hook)["rank"] == rank:
        arm_kill_hook(json.loads(hook))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = dp.write(
            recipe(config["data"]),
            config["dest"],
            format=config.get("format", "tar"),
            records_per_shard=config.get("records_per_shard", 7),
            min_units=config.get("min_units", 8),
            stale_seconds=config.get("stale_seconds", 3.0),
            storage_options=config.get("storage_options"),
            rank=rank,
            world_size=config["world_size"],
            num_workers=config.get("workers", 0),
        )
    result = {
        "rank": rank,
        "pid": os.getpid(),
        "stats": manifest.stats,
        "records": manifest.records,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }
    write_json(os.path.join(config["out"], f"result.{rank}.{os.getpid()}.json"), result)


def write_json(path: str, value: Any) -> None:
    """``value`` as ``path``, all at once (the test polls for it)."""
    with open(f"{path}.part", "w") as out:
        json.dump(value, out)
    os.replace(f"{path}.part", path)


def launch(config: dict[str, Any]) -> int:
    """Fork one process per rank in ``config["ranks"]``; 0 if they all succeeded."""
    pids: dict[int, int] = {}
    for rank in config["ranks"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_rank(config, rank)
                code = 0
            except BaseException:  # noqa: BLE001 - reported, and the exit code says so
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[rank] = pid
    write_json(os.path.join(config["out"], f"pids.{os.getpid()}.json"), pids)
    ended = {}
    for rank, pid in pids.items():
        _, status = os.waitpid(pid, 0)
        ended[rank] = os.waitstatus_to_exitcode(status)
    write_json(os.path.join(config["out"], f"ended.{os.getpid()}.json"), ended)
    return 0 if all(code == 0 for code in ended.values()) else 1


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    if "ranks" in config:
        return launch(config)
    run_rank(config, int(config["rank"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
