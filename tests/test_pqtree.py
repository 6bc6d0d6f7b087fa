"""The PQ tree against brute force: after any sequence of reductions it
admits exactly the orders that keep every accepted subset consecutive, and
it refuses a subset exactly when no such order exists."""

import doctest
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from subgraphjit.batcher import pqtree
from subgraphjit.batcher.pqtree import PQTree


def consecutive(order, subset):
    places = sorted(order.index(item) for item in subset)
    return places[-1] - places[0] == len(places) - 1


@st.composite
def reductions(draw):
    size = draw(st.integers(2, 7))
    subsets = draw(st.lists(
        st.lists(st.integers(0, size - 1), min_size=2, max_size=size, unique=True),
        min_size=1, max_size=7))
    return size, subsets


@settings(max_examples=400, deadline=None)
@given(reductions())
def test_reductions_match_brute_force(case):
    size, subsets = case
    items = list(range(size))
    tree = PQTree(items)
    accepted = []
    for subset in subsets:
        admissible = [order for order in itertools.permutations(items)
                      if all(consecutive(order, s) for s in accepted + [subset])]
        assert tree.reduce(subset) == bool(admissible)
        if admissible:
            accepted.append(subset)
        else:  # refused: the tree is as it was
            admissible = [order for order in itertools.permutations(items)
                          if all(consecutive(order, s) for s in accepted)]
        assert tree.count_orders() == len(admissible)
        frontier = tree.frontier()
        assert sorted(frontier) == items
        assert all(consecutive(frontier, s) for s in accepted)


def test_doctests():
    assert doctest.testmod(pqtree).failed == 0


def test_items_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        PQTree("aba")
