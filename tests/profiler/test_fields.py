# SPDX-License-Identifier: Apache-2.0
"""``fields=True``: object arguments also compare by the attributes the function read
from them, so the copies of one step's metadata that vLLM makes per KV-cache group
(``copy()`` on V1, a new object from the same tensors on V2) count as one input."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

import stepcache
from stepcache.profiler import ProfileReport, main
from stepcache.profiler._argprint import FIELDS_PRINT_MAX, fieldprint


@dataclasses.dataclass
class Meta:
    lens: torch.Tensor
    num_reqs: int
    block_table: torch.Tensor


def split(meta: Meta, threshold: int = 1) -> tuple[int, int]:
    """Reads the layout only: the same for every group's copy."""
    decodes = int((meta.lens[: meta.num_reqs] <= threshold).sum())
    return decodes, meta.num_reqs - decodes


def slots_of(meta: Meta) -> torch.Tensor:
    """Reads the group's own block table: different for every group."""
    return meta.block_table[: meta.num_reqs] * 2


GROUPS = 4
STEPS = 3


def _step(groups: list[Meta]) -> None:
    for meta in groups:
        split(meta)
        slots_of(meta)


def _copies(base: Meta) -> list[Meta]:
    """V1: a shallow copy per group, each with its own block table."""
    out = []
    for g in range(GROUPS):
        meta = copy.copy(base)
        meta.block_table = base.block_table + g
        out.append(meta)
    return out


def _rebuilt(base: Meta) -> list[Meta]:
    """V2: a new object per group, from the same layout tensors."""
    return [Meta(base.lens, base.num_reqs, base.block_table + g) for g in range(GROUPS)]


def _base(step: int) -> Meta:
    return Meta(torch.tensor([1, 3, 1, step + 1]), 4, torch.arange(4))


def _profile(groups_of: object, *, fields: bool = True) -> ProfileReport:
    assert callable(groups_of)
    with stepcache.profile([split, slots_of], fields=fields) as report:
        for step in range(STEPS):
            _step(groups_of(_base(step)))
            report.step()
    return report


@pytest.mark.parametrize("groups_of", [_copies, _rebuilt], ids=["copy", "rebuilt"])
def test_the_groups_copies_share_what_reads_only_the_layout(groups_of: object) -> None:
    report = _profile(groups_of)
    row = report["split"]
    assert row.calls == GROUPS * STEPS
    assert row.identical == 0  # another object each time
    assert row.equal_inputs == row.equal_copies == (GROUPS - 1) * STEPS
    assert row.other_result == 0
    assert row.needed == STEPS  # one computation per step
    assert row.equal_inputs_ns > 0
    other = report["slots_of"]  # each group's own block table
    assert (other.equal_inputs, other.needed) == (0, GROUPS * STEPS)


def test_without_fields_objects_compare_by_identity() -> None:
    report = _profile(_copies, fields=False)
    assert report["split"].equal_inputs == 0
    assert report["split"].needed == GROUPS * STEPS
    assert "equal inputs" not in report.table()  # the table is as before
    assert report.to_dict()["fields"] is False


def test_calls_on_one_object_are_equal_inputs_in_both_modes() -> None:
    for fields in (False, True):
        with stepcache.profile(split, fields=fields) as report:
            meta = _base(0)
            for _ in range(3):
                split(meta)
        row = report["split"]
        assert (row.equal_inputs, row.equal_copies, row.needed) == (2, 0, 1)


def test_the_table_and_json_show_the_equal_inputs() -> None:
    report = _profile(_copies)
    header = report.table().splitlines()[2]
    assert header.rstrip().endswith(
        "equal inputs  copies  other result  needed  inside"
    )
    row = next(r for r in report.to_dict()["functions"] if r["name"].endswith("split"))
    assert (row["equal_inputs"], row["needed"]) == ((GROUPS - 1) * STEPS, STEPS)
    assert json.loads(report.to_json())["fields"] is True


def test_a_copy_with_another_tensor_of_equal_values_is_another_input() -> None:
    # the fingerprint is identity (and version): equal contents do not make a copy
    with stepcache.profile(split, fields=True) as report:
        base = _base(0)
        split(base)
        split(Meta(base.lens.clone(), base.num_reqs, base.block_table))
    assert report["split"].equal_inputs == 0


def test_an_attribute_changed_after_the_call_is_not_what_it_read() -> None:
    # fingerprinted at the call: a later change of the copy is not what it read
    with stepcache.profile(split, fields=True) as report:
        base = _base(0)
        other = copy.copy(base)
        other.num_reqs = 2
        split(other)
        other.num_reqs = 4
        split(base)
    assert report["split"].equal_inputs == 0


HIDDEN = [0]


def hidden(meta: Meta) -> int:
    """Reads something its arguments do not show."""
    return int(meta.num_reqs) + HIDDEN[0]


def test_equal_inputs_with_another_result_are_flagged() -> None:
    with stepcache.profile(hidden, fields=True) as report:
        for meta in _copies(_base(0)):
            HIDDEN[0] += 1
            hidden(meta)
    row = report["hidden"]
    assert (row.equal_inputs, row.other_result, row.needed) == (GROUPS - 1,) * 2 + (1,)


def test_inference_tensors_are_matched_by_identity_and_place() -> None:
    with torch.inference_mode():
        base = _base(0)
    with stepcache.profile(split, fields=True) as report, torch.inference_mode():
        for meta in _copies(base):
            split(meta)
    assert report["split"].equal_copies == GROUPS - 1


def test_fieldprint_sees_slots_and_skips_what_has_no_attributes() -> None:
    class Slotted:
        __slots__ = ("__hidden", "n")

        def __init__(self) -> None:
            self.n = 1
            self.__hidden = 2

    keep: dict[int, object] = {}
    prints = fieldprint(Slotted(), keep)
    assert prints is not None and set(prints) == {"n", "_Slotted__hidden"}
    for value in (1, "s", torch.zeros(1), (1, 2), [object()], Meta, split, torch):
        assert fieldprint(value, keep) is None

    class Big:
        pass

    big = Big()
    for i in range(FIELDS_PRINT_MAX + 1):
        setattr(big, f"a{i}", i)
    assert fieldprint(big, keep) is None  # compared by identity only


def workload() -> None:
    """For the command line test: three steps of four copies."""
    for step in range(STEPS):
        _step(_copies(_base(step)))


def test_the_command_line_takes_fields(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            f"{__name__}:workload",
            "-t",
            f"{__name__}:split",
            "--step",
            f"{__name__}:_step",
            "--fields",
            "--json",
            "-",
        ]
    )
    assert status == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fields"] is True
    (row,) = data["functions"]
    assert (row["equal_copies"], row["needed"]) == ((GROUPS - 1) * STEPS, STEPS)
