"""pin_memory() and to_device(): nested structures kept, the main-process placement rule,
the no-CUDA fallbacks, the CUDA path (where CUDA exists), exact resume with workers, and the
node contract for PinMemoryNode and ToDeviceNode.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from helpers import worker_counts

import datapipes as dp
from nodes import Context, PinMemoryNode, SequenceNode, ToDeviceNode, apply_to_tensors
from nodes.testing import check_node, roundtrip_state, same

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
needs_no_cuda = pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")


# ----- nested samples (module level, so DataLoader workers could pickle them) -----------------

Box = namedtuple("Box", ["coords", "label"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    boxes: list[Box]
    name: str
    extra: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: torch.Tensor
    note: str


def make_sample(i: int) -> dict[str, Any]:
    return {
        "x": torch.arange(i, i + 4, dtype=torch.float16).reshape(2, 2),
        "label": torch.tensor(i, dtype=torch.int64),
        "mask": torch.tensor([i % 2 == 0, True]),
        "pair": (torch.full((3,), i, dtype=torch.uint8), f"id{i}"),
        "box": Box(torch.tensor([i, i + 1], dtype=torch.int32), i),
        "items": [torch.tensor([1.5 * i]), None],
        "meta": OrderedDict(name=f"s{i}", weight=0.5 * i),
    }


SAMPLES = [make_sample(i) for i in range(10)]


def tensor_of(i: int) -> torch.Tensor:
    return torch.tensor([i, 2 * i], dtype=torch.int16)


def plain_item(i: int) -> dict[str, Any]:
    return {"pair": (i, f"id{i}"), "array": np.arange(i), "scalar": np.int64(i)}


def tensors(item: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    apply_to_tensors(item, lambda t: found.append(t) or t)
    return found


def to_cpu(item: Any) -> Any:
    return apply_to_tensors(item, lambda t: t.cpu())


# ----- apply_to_tensors -------------------------------------------------------------------


def test_apply_to_tensors_keeps_structure_and_types():
    sample = Sample(
        image=torch.ones(2, 3, dtype=torch.uint8),
        boxes=[Box(torch.tensor([1.0, 2.0]), "cat"), Box(torch.tensor([3.0, 4.0]), "dog")],
        name="img0",
        extra={"ids": (torch.tensor([7]), 7, "seven"), "frozen": Frozen(torch.zeros(1), "z")},
    )
    item = {"sample": sample, "list": [torch.tensor(1), [torch.tensor(2)]], "n": 3}
    out = apply_to_tensors(item, lambda t: t * 2)

    assert type(out) is dict and list(out) == ["sample", "list", "n"]
    assert type(out["sample"]) is Sample
    assert torch.equal(out["sample"].image, torch.full((2, 3), 2, dtype=torch.uint8))
    assert out["sample"].image.dtype == torch.uint8
    assert type(out["sample"].boxes) is list
    assert all(type(b) is Box for b in out["sample"].boxes)
    assert torch.equal(out["sample"].boxes[1].coords, torch.tensor([6.0, 8.0]))
    assert out["sample"].boxes[0].label == "cat"
    ids = out["sample"].extra["ids"]
    assert (
        type(ids) is tuple and torch.equal(ids[0], torch.tensor([14])) and ids[1:] == (7, "seven")
    )
    assert type(out["sample"].extra["frozen"]) is Frozen
    assert torch.equal(out["sample"].extra["frozen"].value, torch.zeros(1))
    assert out["list"][0].item() == 2 and out["list"][1][0].item() == 4
    assert out["n"] == 3
    # the input is untouched
    assert torch.equal(sample.image, torch.ones(2, 3, dtype=torch.uint8))
    assert torch.equal(item["list"][0], torch.tensor(1))


def test_apply_to_tensors_leaves_everything_else_as_it_is():
    array = np.arange(3)
    blob = b"raw"
    leaves = [array, blob, "text", 3, 2.5, None, np.float32(1.5), {1, 2}]
    out = apply_to_tensors({"leaves": leaves, "t": torch.zeros(1)}, lambda t: t + 1)
    assert all(a is b for a, b in zip(out["leaves"], leaves))
    assert out["t"].item() == 1.0
    assert apply_to_tensors("plain", lambda t: t + 1) == "plain"
    assert torch.equal(apply_to_tensors(torch.ones(2), lambda t: t + 1), torch.full((2,), 2.0))


def test_apply_to_tensors_returns_lists_of_plain_values_themselves():
    texts, ids, mixed = ["a", "b"] * 200, (1, 2.5, None, True), ["a", torch.zeros(1), 3]
    item = {"text": texts, "ids": ids, "mixed": mixed}
    out = apply_to_tensors(item, lambda t: t + 1)
    assert out["text"] is texts and out["ids"] is ids  # nothing inside to change: the same
    assert out["mixed"] is not mixed and out["mixed"][0] == "a" and out["mixed"][2] == 3
    assert out["mixed"][1].item() == 1.0  # a tensor among plain values is still reached


def test_apply_to_tensors_visits_every_tensor_once():
    sample = make_sample(3)
    seen = tensors(sample)
    assert len(seen) == 6
    ids = {id(t) for t in seen}
    expected = {
        id(sample["x"]),
        id(sample["label"]),
        id(sample["mask"]),
        id(sample["pair"][0]),
        id(sample["box"].coords),
        id(sample["items"][0]),
    }
    assert ids == expected


def test_apply_to_tensors_keeps_ordered_dicts_and_named_tuples():
    item = OrderedDict(b=Box(torch.ones(1), 1), a=torch.zeros(1))
    out = apply_to_tensors(item, lambda t: t + 1)
    assert type(out) is OrderedDict and list(out) == ["b", "a"]
    assert type(out["b"]) is Box and out["b"].label == 1


def test_apply_to_tensors_keeps_a_defaultdict():
    from collections import defaultdict

    item = defaultdict(list, {"x": torch.ones(2)})
    out = apply_to_tensors(item, lambda t: t * 3)
    assert type(out) is defaultdict and out.default_factory is list
    assert torch.equal(out["x"], torch.full((2,), 3.0))


# ----- to_device / pin_memory on the CPU ---------------------------------------------------


def test_to_device_cpu_keeps_structure_dtypes_and_values():
    pipe = dp.from_sequence(SAMPLES)
    for loader in (dp.Loader(pipe.to_device("cpu")), dp.Loader(pipe, device="cpu")):
        out = list(loader)
        assert len(out) == len(SAMPLES)
        for got, want in zip(out, SAMPLES):
            assert same(got, want)  # types (tuple, namedtuple, OrderedDict), dtypes, values
            assert all(t.device.type == "cpu" for t in tensors(got))


def test_to_device_cpu_of_collated_batches():
    pipe = dp.range(10).map(make_sample).batch(4)
    expected = list(dp.Loader(pipe))
    out = list(dp.Loader(pipe.to_device("cpu")))
    assert len(out) == len(expected) == 3
    assert all(same(a, b) for a, b in zip(out, expected))


@needs_no_cuda
def test_to_device_none_without_cuda_returns_the_very_same_items():
    out = list(dp.Loader(dp.from_sequence(SAMPLES).to_device()))
    assert len(out) == len(SAMPLES)
    assert all(got is want for got, want in zip(out, SAMPLES))


@needs_no_cuda
@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_to_device_cuda_without_cuda_says_cuda_is_unavailable(num_workers):
    with pytest.raises(RuntimeError, match="CUDA is not available") as info:
        loader = dp.Loader(dp.range(5).map(tensor_of).to_device("cuda"), num_workers=num_workers)
        list(loader)
    assert "to_device()" in str(info.value)  # names the way out
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        list(dp.Loader(dp.range(5).map(tensor_of), device="cuda:0"))


@needs_no_cuda
def test_pin_memory_without_cuda_passes_items_through_unchanged():
    pipe = dp.from_sequence(SAMPLES)
    for loader in (dp.Loader(pipe.pin_memory()), dp.Loader(pipe, pin_memory=True)):
        out = list(loader)
        assert len(out) == len(SAMPLES)
        assert all(got is want for got, want in zip(out, SAMPLES))
        assert not any(t.is_pinned() for item in out for t in tensors(item))


def test_to_device_names_are_checked_when_the_recipe_is_written():
    with pytest.raises(RuntimeError):
        dp.range(3).to_device("no-such-device")


# ----- the CUDA path -------------------------------------------------------------------------


@needs_cuda
def test_pin_memory_with_cuda_pins_every_tensor():
    out = list(dp.Loader(dp.from_sequence(SAMPLES).pin_memory()))
    for got, want in zip(out, SAMPLES):
        assert all(t.is_pinned() for t in tensors(got))
        assert same(got, want)
    batches = list(dp.Loader(dp.range(10).map(make_sample).batch(4), pin_memory=True))
    assert all(t.is_pinned() for b in batches for t in tensors(b))


@needs_cuda
@pytest.mark.parametrize("device", [None, "cuda", "cuda:0"])
def test_to_device_cuda_moves_nested_tensors_and_keeps_values(device):
    out = list(dp.Loader(dp.from_sequence(SAMPLES).to_device(device)))
    assert len(out) == len(SAMPLES)
    for got, want in zip(out, SAMPLES):
        assert all(t.is_cuda for t in tensors(got))
        assert same(to_cpu(got), want)  # types, dtypes, values


@needs_cuda
@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_to_device_cuda_after_pin_memory_in_workers(num_workers):
    pipe = dp.range(30).shuffle().map(make_sample).batch(4)
    expected = list(dp.Loader(pipe, seed=3, num_workers=num_workers))
    loader = dp.Loader(
        pipe.pin_memory().to_device("cuda"), seed=3, num_workers=num_workers, device=None
    )
    out = list(loader)
    torch.cuda.synchronize()
    assert len(out) == len(expected) == 8
    for got, want in zip(out, expected):
        assert all(t.is_cuda for t in tensors(got))
        assert same(to_cpu(got), want)
    loader.close()


@needs_cuda
def test_to_device_cuda_values_survive_later_batches():
    # the side-stream copy must not let the memory of an earlier batch be reused early
    loader = dp.Loader(dp.range(64).map(tensor_of).batch(8).pin_memory().to_device())
    kept = []
    for batch in loader:
        kept.append(batch)
        torch.cuda.current_stream().synchronize()
    assert [b.cpu().tolist() for b in kept] == [
        [[i, 2 * i] for i in range(s, s + 8)] for s in range(0, 64, 8)
    ]


# ----- where pin_memory / to_device may go -------------------------------------------------


def _branch_cases() -> list[Any]:
    cases = []
    for step in ("pin_memory", "to_device"):
        for combinator in ("zip", "concat", "mix"):
            cases.append(pytest.param(step, combinator, id=f"{step}-in-{combinator}"))
    return cases


def _with_step_in_a_branch(step: str, combinator: str) -> dp.DataPipe[Any]:
    branch = dp.range(6).map(tensor_of)
    branch = branch.pin_memory() if step == "pin_memory" else branch.to_device("cpu")
    other = dp.range(6).map(tensor_of)
    if combinator == "zip":
        return dp.zip(branch, other)
    if combinator == "concat":
        return dp.concat(other, branch)
    return dp.mix([other, branch], [1, 1])


def _assert_placement_message(error: BaseException, step: str) -> None:
    message = str(error)
    assert f".{step}(" in message  # names the step
    assert "main process" in message
    assert "Apply it last" in message  # says where it must go


@pytest.mark.parametrize(("step", "combinator"), _branch_cases())
def test_a_main_process_step_inside_a_branch_is_refused_with_workers(step, combinator):
    pipe = _with_step_in_a_branch(step, combinator)
    with pytest.raises(ValueError) as info:
        dp.Loader(pipe, num_workers=2)
    _assert_placement_message(info.value, step)


@pytest.mark.parametrize(
    ("step", "combinator"), [("pin_memory", "zip"), ("to_device", "mix")], ids=["zip", "mix"]
)
def test_a_main_process_step_inside_a_branch_is_refused_without_workers(step, combinator):
    pipe = _with_step_in_a_branch(step, combinator)
    with pytest.raises(ValueError) as info:
        list(dp.Loader(pipe))
    _assert_placement_message(info.value, step)


@pytest.mark.parametrize("step", ["pin_memory", "to_device"])
def test_as_torch_dataset_refuses_main_process_steps(step):
    base = dp.range(8).map(tensor_of)
    last = base.pin_memory() if step == "pin_memory" else base.to_device("cpu")
    for pipe in (last, last.batch(2), dp.zip(last, base)):
        with pytest.raises(ValueError) as info:
            pipe.as_torch_dataset()
        _assert_placement_message(info.value, step)
        assert "as_torch_dataset()" in str(info.value)


@pytest.mark.slow
def test_steps_after_to_device_run_in_the_main_process_with_workers():
    pipe = dp.range(20).map(tensor_of).batch(4).to_device("cpu").map(torch.sum)
    # the batches are made in the workers: worker w batches items w, w + 2, ...
    per_worker = [
        [sum(3 * x for x in range(w, 20, 2)[i : i + 4]) for i in range(0, 10, 4)] for w in (0, 1)
    ]
    expected = [s for pair in zip(*per_worker) for s in pair]  # one item a transfer
    with dp.Loader(pipe, num_workers=2, items_per_transfer=1) as loader:
        assert [int(x) for x in loader] == expected


# ----- with workers: exact and resumable ------------------------------------------------------


def resumable_pipe() -> dp.DataPipe[Any]:
    return dp.range(50).shuffle().map(make_sample).batch(4).pin_memory().to_device("cpu")


@pytest.mark.slow
def test_to_device_with_workers_keeps_items_and_order():
    pipe = dp.range(50).shuffle().map(make_sample).batch(4)
    with dp.Loader(pipe, seed=1, num_workers=2) as plain:
        expected = list(plain)
    with dp.Loader(resumable_pipe(), seed=1, num_workers=2) as loader:
        out = list(loader)
    assert len(out) == len(expected) == 2 * 7  # each worker batches its 25 items
    assert all(same(a, b) for a, b in zip(out, expected))
    labels = sorted(int(x) for b in out for x in b["label"])
    assert labels == list(range(50))


@pytest.mark.slow
@pytest.mark.parametrize("position", [0, 1, 7, 13, 14])
def test_to_device_with_workers_resumes_exactly(position):
    pipe = resumable_pipe()
    with dp.Loader(pipe, seed=1, num_workers=2) as uninterrupted:
        reference = [list(uninterrupted), list(uninterrupted)]
    loader = dp.Loader(pipe, seed=1, num_workers=2)
    head = list(islice(iter(loader), position))
    assert all(same(a, b) for a, b in zip(head, reference[0]))
    state = roundtrip_state(loader.state_dict())
    loader.close()

    resumed = dp.Loader(pipe, seed=1, num_workers=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    following = list(resumed)
    resumed.close()
    assert len(rest) == len(reference[0]) - position
    assert all(same(a, b) for a, b in zip(rest, reference[0][position:]))
    assert len(following) == len(reference[1])
    assert all(same(a, b) for a, b in zip(following, reference[1]))


@pytest.mark.slow
def test_items_keep_their_types_through_worker_processes():
    pipe = dp.range(6).map(plain_item).to_device("cpu")
    expected = list(dp.Loader(pipe))
    with dp.Loader(pipe, num_workers=2, items_per_transfer=1) as loader:  # in the same order
        out = list(loader)
    assert all(same(a, b) for a, b in zip(out, expected)), (out[1], expected[1])


# ----- the node contract ---------------------------------------------------------------------


def test_pin_memory_node_keeps_the_node_contract():
    report = check_node(
        lambda ctx: PinMemoryNode(SequenceNode(range(30), ctx, shuffle_key=[1], fns=(tensor_of,)))
    )
    assert report.items_per_epoch == [30, 30]


@pytest.mark.parametrize("device", ["cpu", None])
def test_to_device_node_keeps_the_node_contract(device):
    report = check_node(
        lambda ctx: ToDeviceNode(
            SequenceNode(range(30), ctx, shuffle_key=[2], fns=(make_sample,)), device
        )
    )
    assert report.items_per_epoch == [30, 30]


def test_to_device_over_pin_memory_keeps_the_node_contract_for_a_sharded_consumer():
    report = check_node(
        lambda ctx: ToDeviceNode(
            PinMemoryNode(SequenceNode(range(30), ctx, fns=(tensor_of,))), "cpu"
        ),
        context=lambda epoch: Context(
            rank=1, world_size=2, worker_id=0, num_workers=2, epoch=epoch
        ),
    )
    assert report.items_per_epoch == [len(range(2, 30, 4))] * 2


@dataclasses.dataclass
class WithDerivedField:
    x: torch.Tensor
    calls: int = dataclasses.field(init=False, default=0)


def test_apply_to_tensors_keeps_fields_that_init_does_not_take():
    item = WithDerivedField(torch.ones(2))
    item.calls = 3
    out = apply_to_tensors(item, lambda t: t * 2)
    assert torch.equal(out.x, torch.full((2,), 2.0)) and out.calls == 3
    assert torch.equal(item.x, torch.ones(2))  # the input is left alone


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_repeat_after_a_main_process_step_is_refused(num_workers):
    with pytest.raises(ValueError, match=r"put repeat\(\) before them"):
        dp.Loader(dp.range(8).shuffle().to_device("cpu").repeat(2), num_workers=num_workers)
    pipe = dp.range(8).shuffle().repeat(2).to_device("cpu")
    rounds = list(dp.Loader(pipe, num_workers=2, items_per_transfer=1))  # round by round
    assert sorted(rounds[:8]) == sorted(rounds[8:]) == list(range(8))


# ----- containers keep their type, extras and keys ------------------------------------------


class AttrDict(dict):
    """A dict subclass with an attribute."""


def test_to_device_keeps_dict_subclasses_and_frozen_dataclasses():
    # Checked and held: the containers the fix names keep type, extras and keys.
    def item(i: int) -> dict[str, Any]:
        extra = AttrDict(x=torch.zeros(2) + i)
        extra.note = "kept"
        default = defaultdict(list, x=torch.zeros(2))
        return {
            "attr": extra,
            "default": default,
            "ordered": OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))]),
            "frozen": Frozen(torch.ones(3), "five"),
        }

    (moved,) = list(dp.Loader(dp.range(1).map(item).to_device("meta")))
    assert type(moved["attr"]) is AttrDict and moved["attr"].note == "kept"
    assert moved["attr"]["x"].is_meta
    assert type(moved["default"]) is defaultdict
    assert moved["default"].default_factory is list and moved["default"]["x"].is_meta
    assert list(moved["ordered"]) == ["b", "a"] and moved["ordered"]["a"].is_meta
    assert type(moved["frozen"]) is Frozen and moved["frozen"].note == "five"
    assert moved["frozen"].value.is_meta
