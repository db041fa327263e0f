"""dp.write under SIGKILL and SIGSTOP: real processes, the output byte for byte that of one
uninterrupted process.

Each trial starts a job of ``tests/write_job.py`` ranks (no process group: they share
only the destination), kills something at a seeded random point, and checks:

* nothing partial or foreign is ever visible: a monitor thread reads every file that
  appears or changes under the destination while the job runs, and each shard, unit
  record, plan and manifest must be the very bytes of the uninterrupted run's file of
  that name (right after the kill, every shard is also parsed whole in its format);
  a visible manifest or unit record has all its shards there;
* the job finishes: scenario ``rank`` (one rank's main process killed: the others
  write its units in their help phase, then the killed rank, started again, writes
  nothing), ``worker`` (a DataLoader worker of a rank killed: the rank goes on in its
  own process), ``job`` (every process killed, the job started again on a random world
  size 1..4), ``stop`` (a rank stopped: the others write its units once its markers are
  ``STALE`` seconds old; continued, it ends cleanly and changes no byte);
* the destination then holds exactly the uninterrupted run's files (``_datapipes/``
  included), no temporary, no marker.

Kill points: a random time (once a random number of shards are visible), or a hook in
the rank (``WRITE_JOB_KILL``, see write_job.py): half-way through a shard's temporary,
between a shard's complete temporary and its rename, in the manifest likewise.

``WRITE_KILL_TRIALS`` (default 6) trials, seeded from ``WRITE_KILL_SEED`` (default 26):
every trial prints its seed, its kill point and its verdict.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from subprocess_helpers import ROOT, children_of

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[1] / "write_job.py"
TRIALS = int(os.environ.get("WRITE_KILL_TRIALS", "6"))
SEED = int(os.environ.get("WRITE_KILL_SEED", "26"))
SIZES = [40, 13, 55, 27, 8, 33]  # records per input file: 12 units, 29 shards of <= 7
RECORDS = sum(SIZES)
DELAY = 0.01  # seconds per record: about 2 s of writing for one process
STALE = 3.0  # stale_seconds: a stopped rank's units are taken over after this
JOB_TIMEOUT = 120  # a job that hangs fails the trial (a loaded 2-core machine is slow)

#: (scenario, kill point) of trial i: KINDS[i % len(KINDS)]; the rest is drawn from its seed.
KINDS = [
    ("rank", "time"),
    ("job", "shard_rename"),
    ("stop", "time"),
    ("worker", "time"),
    ("job", "manifest_mid"),
    ("job", "time"),
    ("rank", "shard_mid"),
    ("rank", "manifest_rename"),
    ("job", "shard_mid"),
    ("worker", "shard_rename"),
]


def make_inputs(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    for number, size in enumerate(SIZES):
        with open(folder / f"docs-{number:02d}.jsonl", "w") as out:
            for _ in range(size):
                text = f"document {i}: " + "lorem ipsum " * (i % 9)
                out.write(json.dumps({"id": i, "text": text}) + "\n")
                i += 1
    return str(folder / "*.jsonl")


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(folder))] = path.read_bytes()
    return found


def leftovers(folder: Path) -> list[str]:
    """Temporaries and markers under ``folder``."""
    return [
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and (p.name.startswith(".") or p.parent.name == "writing")
    ]


def parses_whole(name: str, data: bytes) -> int:
    """The records in shard ``name``, read to its end in its format (raises if cut)."""
    if name.endswith(".tar"):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = [m for m in tar if tar.extractfile(m).read() is not None]  # type: ignore[union-attr]
        keys = {m.name.split(".", 1)[0] for m in members}
        assert len(members) == 2 * len(keys), name  # .jpg and .txt of every sample
        return len(keys)
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data)).num_rows


# ----- a job of write_job.py ranks -------------------------------------------------------------


@dataclass
class Job:
    """One launch of write_job.py: a process that forks one process per rank."""

    process: subprocess.Popen[bytes]
    out: Path
    log: Path
    pids: dict[int, int] = field(default_factory=dict)

    @classmethod
    def start(cls, config: dict[str, Any], kill: dict[str, Any] | None = None) -> Job:
        out = Path(config["out"])
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WRITE_JOB_DELAY": str(DELAY)}
        env.pop("WRITE_JOB_KILL", None)
        if kill is not None:
            env["WRITE_JOB_KILL"] = json.dumps(kill)
        log = out / f"log.{time.monotonic_ns()}"
        with open(log, "wb") as sink:
            process = subprocess.Popen(
                [sys.executable, str(JOB), json.dumps(config)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
                start_new_session=True,  # its own process group: the whole job killed at once
            )
        job = cls(process, out, log)
        deadline = time.monotonic() + JOB_TIMEOUT
        pids_file = out / f"pids.{process.pid}.json"
        while not pids_file.exists():
            assert process.poll() is None, job.output()
            assert time.monotonic() < deadline, "the job did not start its ranks"
            time.sleep(0.02)
        job.pids = {int(r): pid for r, pid in json.loads(pids_file.read_text()).items()}
        return job

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def ended(self) -> dict[int, int]:
        """Wait for the job; every rank's exit code (-9: killed)."""
        try:
            self.process.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"the job hung:\n{self.output()}") from None
        ended = self.out / f"ended.{self.process.pid}.json"
        if not ended.exists():  # the launcher itself was killed
            return {}
        return {int(r): code for r, code in json.loads(ended.read_text()).items()}

    def kill_all(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended already
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def result(self, rank: int) -> dict[str, Any]:
        pid = self.pids[rank]
        return json.loads((self.out / f"result.{rank}.{pid}.json").read_text())

    def returned(self, rank: int) -> bool:
        return (self.out / f"result.{rank}.{self.pids[rank]}.json").exists()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] in "ZX"
    except OSError:
        return True


# ----- watching the destination --------------------------------------------------------------


class Monitor:
    """Reads every file of ``dest`` that appears or changes, until stopped: each must be
    the reference's file of that name, byte for byte (or a temporary or a marker)."""

    def __init__(self, dest: Path, reference: dict[str, bytes]) -> None:
        self.dest, self.reference = dest, reference
        self.errors: list[str] = []
        self.seen: set[tuple[str, int, int, int]] = set()
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.look()

    def visible_shards(self) -> int:
        try:
            return sum(1 for name in os.listdir(self.dest) if name.startswith("shard-"))
        except FileNotFoundError:
            return 0

    def look(self, parse: bool = False) -> int:
        """Check what is visible now; the number of shards visible."""
        self.looks += 1
        shards = 0
        for path in sorted(self.dest.rglob("*")) if self.dest.exists() else []:
            name = str(path.relative_to(self.dest))
            if path.name.startswith(".") or path.parent.name == "writing":
                continue  # a temporary or a marker: never read as data
            try:
                info = path.stat()
                if not path.is_file():
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            if path.name.startswith("shard-"):
                shards += 1
                if parse:
                    parses_whole(path.name, data)
            key = (name, info.st_ino, info.st_size, info.st_mtime_ns)
            if key in self.seen and not parse:
                continue
            self.seen.add(key)
            if self.reference.get(name) != data:
                self.errors.append(f"{name}: {len(data)} bytes, not the reference's file")
                continue
            if name == "manifest.json" or name.startswith("_datapipes/units/"):
                for shard in json.loads(data)["shards"]:
                    if not (self.dest / shard["name"]).exists():
                        self.errors.append(f"{name} is visible before {shard['name']}")
        return shards


# ----- the reference ---------------------------------------------------------------------------


@dataclass
class Setup:
    data: str
    root: Path
    references: dict[str, dict[str, bytes]]

    def config(self, dest: Path, out: Path, fmt: str, world: int, workers: int) -> dict[str, Any]:
        return {
            "data": self.data, "dest": str(dest), "out": str(out), "format": fmt,
            "world_size": world, "ranks": list(range(world)), "workers": workers,
            "records_per_shard": 7, "min_units": 8, "stale_seconds": STALE,
        }  # fmt: skip

    def reference(self, fmt: str) -> dict[str, bytes]:
        """The output of one uninterrupted process (computed once per format)."""
        if fmt not in self.references:
            dest = self.root / f"reference-{fmt}"
            job = Job.start(self.config(dest, self.root / f"log-{fmt}", fmt, 1, 0))
            assert job.ended() == {0: 0}, job.output()
            self.references[fmt] = tree(dest)
            assert not leftovers(dest)
            shards = [n for n in self.references[fmt] if n.startswith("shard-")]
            assert sum(parses_whole(n, self.references[fmt][n]) for n in shards) == RECORDS
        return self.references[fmt]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    root = tmp_path_factory.mktemp("write-kills")
    return Setup(make_inputs(root / "input"), root, {})


# ----- the trials ------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], job: Job, what: str) -> bool:
    """Wait until ``condition()``; ``False`` if the job ended first."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not condition():
        if job.process.poll() is not None:
            return condition()
        assert time.monotonic() < deadline, f"waited too long for {what}:\n{job.output()}"
        time.sleep(0.01)
    return True


@dataclass
class Trial:
    number: int
    scenario: str
    point: str
    seed: int
    rng: random.Random
    notes: list[str] = field(default_factory=list)
    #: Whether the kill (or stop) came before the job ended; the rank it stopped.
    landed: bool = False
    stopped: int | None = None
    hook: dict[str, Any] | None = None

    def say(self, text: str) -> None:
        self.notes.append(text)


def draw(number: int) -> Trial:
    scenario, point = KINDS[number % len(KINDS)]
    seed = SEED * 1000 + number
    return Trial(number, scenario, point, seed, random.Random(seed))


@pytest.mark.parametrize("number", range(TRIALS))
def test_killed_anywhere_the_output_is_the_uninterrupted_runs(
    setup: Setup, tmp_path: Path, number: int
) -> None:
    trial = draw(number)
    rng = trial.rng
    started = time.monotonic()
    fmt = "parquet" if rng.random() < 0.25 else "tar"
    reference = setup.reference(fmt)
    total = sum(1 for name in reference if name.startswith("shard-"))
    world = rng.randint(1, 4) if trial.scenario == "job" else rng.randint(2, 3)
    workers = 2 if trial.scenario == "worker" else rng.choice([0, 0, 2] if world <= 2 else [0])
    victim = rng.randrange(world)
    dest, out = tmp_path / "out", tmp_path / "log"
    config = setup.config(dest, out, fmt, world, workers)
    hook = None
    if trial.point != "time":
        flag = str(tmp_path / "fired")
        in_worker = trial.scenario == "worker"  # a worker writes 2 units or more: 2 shards
        n = rng.randint(1, 2 if in_worker else 4) if trial.point.startswith("shard") else 0
        hook = trial.hook = {"rank": victim, "at": trial.point, "n": n, "flag": flag}
        hook["worker_only"] = in_worker
        where = f"shard #{n} of its processes" if n else "the manifest"
        trial.say(f"{trial.point} at {where}")
    threshold = rng.randint(0, int(total * 0.7))
    extra = rng.uniform(0, 0.15)
    trial.say(f"{fmt}, world {world}, workers {workers}, victim rank {victim}")

    with Monitor(dest, reference) as monitor:
        job = Job.start(config, hook)
        if trial.point == "time":
            trial.say(f"after {threshold} shards + {extra:.2f} s")
            landed = wait_for(lambda: monitor.visible_shards() >= threshold, job, "shards")
            time.sleep(extra)
            landed = landed and job.process.poll() is None
        else:
            landed = wait_for(lambda: Path(hook["flag"]).exists(), job, "the hook")
        kill_point(trial, job, victim, landed, rng)
        visible = monitor.look(parse=True)  # right after the kill: nothing partial
        trial.say(f"{visible} shards visible after the kill, each whole")
        finish(trial, setup, job, config, monitor, rng, fmt)
        monitor.look()
    assert not monitor.errors, monitor.errors
    assert tree(dest) == reference, sorted(set(tree(dest)) ^ set(reference))
    assert not leftovers(dest)
    seconds = time.monotonic() - started
    print(
        f"\ntrial {number} (seed {trial.seed}) {trial.scenario}/{trial.point}: "
        + "; ".join(trial.notes)
        + f"; byte-identical, no leftovers, {monitor.looks} looks, {seconds:.1f} s",
        flush=True,
    )
    log = os.environ.get("WRITE_KILL_LOG")
    if log:
        with open(log, "a") as sink:
            sink.write(f"{number} {trial.scenario}/{trial.point} ok {seconds:.1f}s: ")
            sink.write("; ".join(trial.notes) + "\n")


def kill_point(trial: Trial, job: Job, victim: int, landed: bool, rng: random.Random) -> None:
    """Do the trial's kill (or stop), if its moment came before the job ended."""
    trial.landed = landed
    if not landed:
        trial.say("the job ended before the kill")
        return
    if trial.scenario == "job":
        if trial.point != "time":
            time.sleep(rng.uniform(0, 0.1))  # the others go on a little after the hook's kill
        job.kill_all()
        return
    if trial.scenario == "stop":
        if job.returned(victim):
            trial.say(f"rank {victim} had returned before the stop")
            return
        os.kill(job.pids[victim], signal.SIGSTOP)
        trial.stopped = victim
        trial.say(f"rank {victim} stopped")
        return
    if trial.point != "time":
        return  # the hook killed its process
    if trial.scenario == "worker":
        deadline = time.monotonic() + 3
        while not (workers := children_of(job.pids[victim])) and time.monotonic() < deadline:
            time.sleep(0.01)  # not started yet
        if not workers:
            trial.say(f"rank {victim} had no worker alive: its main process killed")
            os.kill(job.pids[victim], signal.SIGKILL)
            return
        pid = rng.choice(workers)
        trial.say(f"worker {pid} of rank {victim} killed")
        os.kill(pid, signal.SIGKILL)
        return
    os.kill(job.pids[victim], signal.SIGKILL)


def finish(
    trial: Trial,
    setup: Setup,
    job: Job,
    config: dict[str, Any],
    monitor: Monitor,
    rng: random.Random,
    fmt: str,
) -> None:
    """Let the job finish (or start it again) and check each rank's end."""
    dest = Path(config["dest"])
    world = config["world_size"]
    if trial.stopped is not None:
        stopped = trial.stopped
        assert _is_stopped(job.pids[stopped])
        others = [r for r in job.pids if r != stopped]
        t0 = time.monotonic()
        wait_for(lambda: all(job.returned(r) for r in others), job, "the other ranks")
        trial.say(f"the others finished in {time.monotonic() - t0:.1f} s without it")
        assert json.loads((dest / "manifest.json").read_bytes()) is not None
        before = {n: d for n, d in tree(dest).items() if n in setup.reference(fmt)}
        assert before == setup.reference(fmt)  # complete while it is stopped
        os.kill(job.pids[stopped], signal.SIGCONT)
        ended = job.ended()
        assert ended == dict.fromkeys(range(world), 0), job.output()
        assert job.result(stopped)["records"] == RECORDS
        return
    if trial.scenario == "job" and trial.landed:
        job.ended()
        for pid in job.pids.values():
            deadline = time.monotonic() + 30
            while not gone(pid):  # SIGKILLed: dying
                assert time.monotonic() < deadline, f"rank process {pid} outlived SIGKILL"
                time.sleep(0.01)
        again = rng.randint(1, 4)
        workers = rng.choice([0, 0, 2] if again <= 2 else [0])
        trial.say(f"restarted on {again} rank(s), workers {workers}")
        restart = Job.start({**config, "world_size": again, "ranks": list(range(again)),
                             "workers": workers})  # fmt: skip
        assert restart.ended() == dict.fromkeys(range(again), 0), restart.output()
        for rank in range(again):
            assert restart.result(rank)["records"] == RECORDS
        return
    ended = job.ended()
    killed = [r for r, code in ended.items() if code != 0]
    if trial.point != "time" and trial.landed:
        fired = int(Path(trial.hook["flag"]).read_text())
        main = fired in job.pids.values()
        trial.say(f"the hook fired in {'the main process' if main else 'a worker'} ({fired})")
    if not killed and trial.scenario == "worker":
        went_on = [w for r in range(world) for w in job.result(r)["warnings"]
                   if "without its DataLoader workers" in w]  # fmt: skip
        trial.say("its rank went on in-process" if went_on else "no rank saw a worker die")
        if trial.point != "time" and trial.landed:  # killed mid-publish: mid-epoch
            assert went_on, [job.result(r)["warnings"] for r in range(world)]
    for rank in set(range(world)) - set(killed):
        assert ended[rank] == 0, job.output()
        assert job.result(rank)["records"] == RECORDS  # it returned with the whole output
    if killed:
        assert all(ended[r] == -signal.SIGKILL for r in killed), (ended, job.output())
        assert len(killed) == 1, ended
        (rank,) = killed
        left = leftovers(dest)  # a rank killed after the others' last look leaves its own
        survivors = [str(job.pids[r]) for r in range(world) if r != rank]
        assert not {owner_pid(name) for name in left} & set(survivors), left
        trial.say(f"rank {rank} killed, the others finished ({len(left)} leftovers of it)")
        trial.say("restarted alone, it wrote nothing")
        once_more = Job.start({**config, "ranks": [rank]})
        assert once_more.ended() == {rank: 0}, once_more.output()
        stats = once_more.result(rank)["stats"]
        assert stats["units_written"] == 0 and stats["units_found_done"] > 0, stats


def owner_pid(name: str) -> str:
    """The pid in a temporary's name (``.<name>.tmp-<host>-<pid>-<n>``) or a marker's
    (``<unit>.<host>.<pid>``)."""
    if ".tmp-" in name:
        return name.rsplit(".tmp-", 1)[1].rsplit("-", 2)[1]
    return name.rsplit(".", 1)[1]


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] == "T"
    except OSError:
        return False


# ----- S3 (moto's server) ----------------------------------------------------------------------

BUCKET = "write-kills"


@pytest.mark.parametrize("kill", ["rank", "job"])
def test_s3_killed_mid_write_and_restarted_is_the_local_runs_bytes(
    setup: Setup, tmp_path: Path, kill: str
) -> None:
    """``s3://`` through s3fs and moto's server: 2 ranks, one (or both) SIGKILLed once a
    random number of shards are uploaded, the job finished by the other or restarted on 2;
    every object seen meanwhile and at the end is the local uninterrupted run's file of that
    name (shards, unit records, plan, manifest), and no marker is left."""
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed")
    pytest.importorskip("moto.server", reason="moto's server mode is not installed")
    from s3_server import KEY, REGION, SECRET, moto_server

    reference = setup.reference("tar")
    rng = random.Random(SEED * 1000 + 500 + (kill == "job"))
    threshold, victim = rng.randint(2, 16), rng.randrange(2)
    print(f"\ns3/{kill}: seed {SEED * 1000 + 500 + (kill == 'job')}, after {threshold} shards")
    with moto_server() as endpoint:
        options = {
            "key": KEY, "secret": SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
        }  # fmt: skip
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        fs.mkdir(f"{BUCKET}-{kill}")  # moto keeps buckets from server to server
        root = f"{BUCKET}-{kill}/out"
        config = setup.config(Path("unused"), tmp_path / "log", "tar", 2, 0)
        config.update(dest=f"s3://{root}", storage_options=options)
        seen: set[tuple[str, str]] = set()

        def visible(parse: bool = False) -> int:
            """Check every object there now (markers aside); how many shards."""
            fs.invalidate_cache()
            shards = 0
            for key, info in fs.find(root, detail=True).items():
                name = key.removeprefix(f"{root}/")
                if info.get("type") != "file" or name.startswith("_datapipes/writing/"):
                    continue  # the folder itself (s3fs lists it while it is empty), markers
                shards += name.startswith("shard-")
                if (name, info.get("ETag", "")) in seen and not parse:
                    continue
                try:
                    data = fs.cat_file(key)
                except FileNotFoundError:
                    raise AssertionError(f"{name} was listed, then gone") from None
                assert data == reference.get(name), f"{name}: not the reference's bytes"
                if parse and name.startswith("shard-"):
                    parses_whole(name, data)
                seen.add((name, info.get("ETag", "")))
            return shards

        job = Job.start(config)
        landed = wait_for(lambda: visible() >= threshold, job, "shards on S3")
        if landed and job.process.poll() is None:
            if kill == "job":
                job.kill_all()
            else:
                os.kill(job.pids[victim], signal.SIGKILL)
        print(f"{visible(parse=True)} shards visible after the kill, each whole")
        if kill == "job":
            job.process.wait(JOB_TIMEOUT)
            again = Job.start(config)
            assert again.ended() == {0: 0, 1: 0}, again.output()
        else:
            ended = job.ended()
            assert ended[1 - victim] == 0, job.output()
            assert job.result(1 - victim)["records"] == RECORDS
            once_more = Job.start({**config, "ranks": [victim]})
            assert once_more.ended() == {victim: 0}, once_more.output()
            assert once_more.result(victim)["stats"]["units_written"] == 0
        visible()
        fs.invalidate_cache()
        found = {key.removeprefix(f"{root}/"): fs.cat_file(key) for key in fs.find(root)}
        assert found == reference  # names and bytes; no marker left
        s3fs.S3FileSystem.clear_instance_cache()
