"""A GPU read from the inventory file builds its MIG devices only when asked, and is otherwise
indistinguishable from one built eagerly: same equality, hash, repr, JSON form, lookups, and
the same ValueError for a damaged file, raised at read time."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhook.model.inventory import DeviceNode, Gpu, Inventory, MigDevice
from gpuhook.pipeline import devices
from tests import factories as f


def _read(inv: Inventory) -> Inventory:
    return Inventory.from_dict(copy.deepcopy(inv.to_dict()))


def test_read_inventory_equals_the_built_one() -> None:
    built = f.inventory(8, {6: 3, 7: 7})
    read = _read(built)
    assert read == built
    assert hash(read) == hash(built)
    assert repr(read) == repr(built)
    assert read.to_dict() == built.to_dict()
    assert [g.mig_devices for g in read.gpus] == [g.mig_devices for g in built.gpus]


def still_json(gpu: Gpu) -> bool:
    """Whether the GPU's MIG devices are still in their JSON form (none built)."""
    return gpu._mig_json is not None


def test_mig_lookup_builds_only_what_it_finds() -> None:
    built = f.inventory(8, {6: 3, 7: 7})
    read = _read(built)
    gpu7 = read.gpus[7]
    wanted = built.gpus[7].mig_devices[6]
    assert gpu7.mig_by_uuid(wanted.uuid.upper()) == wanted
    assert gpu7.mig_by_uuid("MIG-nope") is None
    assert still_json(gpu7)  # nothing else was built
    refs, errors = devices.resolve((wanted.uuid,), read)
    assert errors == [] and refs[0].uuid == wanted.uuid and refs[0].mig_index == 6
    assert gpu7.mig_devices == built.gpus[7].mig_devices  # reading the field builds them all
    assert not still_json(gpu7)
    assert gpu7.mig_by_uuid(wanted.uuid) == wanted
    assert read.gpus[6].replace(name="x").mig_devices == built.gpus[6].mig_devices


def _damage(d: dict[str, Any], path: tuple[Any, ...], value: object) -> None:
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("mig_devices", 1, "uuid"), 7),
        (("mig_devices", 2, "caps", 0, "major"), "195"),
        (("mig_devices", 0, "index"), True),
        (("mig_devices", 0, "caps"), "x"),
        (("mig_devices", 1), "not an object"),
    ],
)
def test_damaged_mig_device_fails_at_read_time(path: tuple[Any, ...], value: object) -> None:
    data = f.inventory(8, {6: 3}).to_dict()
    _damage(data["gpus"][6], path, value)
    with pytest.raises(ValueError, match=r"field|must hold"):
        Inventory.from_dict(data)


def test_unusual_but_valid_mig_device_is_read_eagerly() -> None:
    data = f.inventory(8, {6: 2}).to_dict()
    data["gpus"][6]["mig_devices"][0]["caps"] = None  # from_dict accepts a null list
    gpu = Gpu.from_dict(data["gpus"][6])
    assert gpu._mig_json is None
    assert gpu.mig_devices[0].caps == ()


_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=3), st.lists(st.none())
)
_node_keys = ("path", "host_path", "major", "minor", "mode", "type")
_mig_keys = ("index", "uuid", "gpu_index", "gpu_instance_id", "compute_instance_id", "name")


@given(st.dictionaries(st.sampled_from(_node_keys), _values))
def test_well_formed_device_node_is_always_readable(d: dict[str, Any]) -> None:
    if DeviceNode.well_formed(d):
        DeviceNode.from_dict(d)


@given(
    st.dictionaries(st.sampled_from((*_mig_keys, "memory_total")), _values),
    st.lists(st.dictionaries(st.sampled_from(_node_keys), _values), max_size=2),
)
def test_well_formed_mig_device_is_always_readable(
    d: dict[str, Any], caps: list[dict[str, Any]]
) -> None:
    d["caps"] = caps
    if MigDevice.well_formed(d):
        MigDevice.from_dict(d)
