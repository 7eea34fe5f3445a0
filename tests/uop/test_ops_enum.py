"""Ops, an Enum read from its own __dict__ (uop/ops.py: _MembersInDictType): it behaves as a plain Enum."""

import copy
import pickle

import pytest

from zeptograd.uop.ops import Ops


def test_members_names_values_and_lookups():
    assert Ops["ADD"] is Ops.ADD and Ops(Ops.ADD.value) is Ops.ADD and Ops.ADD.name == "ADD"
    assert list(Ops)[0] is Ops.BUFFER and len(Ops) == len(Ops.__members__) and Ops.ADD in Ops
    assert all(vars(Ops)[name] is member for name, member in Ops.__members__.items())


def test_inherited_class_attributes_still_resolve():
    assert Ops.__name__ == "Ops" and callable(Ops._missing_) and Ops.mro()[0] is Ops


def test_pickle_and_copy_give_the_same_member():
    assert pickle.loads(pickle.dumps(Ops.MUL)) is Ops.MUL and copy.deepcopy(Ops.MUL) is Ops.MUL


def test_a_missing_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        Ops.NOT_AN_OP  # noqa: B018
    assert not hasattr(Ops, "NOT_AN_OP")
