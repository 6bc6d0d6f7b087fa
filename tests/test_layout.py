"""The layout planner against brute force on small random batch sets: its
rows are always a permutation of each batch, every operand it reports as a
run is one, and whenever some row orders make every operand a run, it finds
such orders."""

import doctest
import itertools

from hypothesis import given, settings, strategies as st

from subgraphjit.batcher import layout
from subgraphjit.batcher.layout import plan


def is_run(ordered, source_of, results):
    """Are the sources of a consumer's items (``source_of[item]``), read in
    the consumer's new row order ``ordered``, an in-order run of the rows of
    the batch that holds them?"""
    first = source_of[ordered[0]]
    holder = next(items for items in results if first in items)
    row_in_holder = {item: row for row, item in enumerate(holder)}
    if any(source_of[item] not in row_in_holder for item in ordered):
        return False
    rows = [row_in_holder[source_of[item]] for item in ordered]
    return rows == list(range(rows[0], rows[0] + len(rows)))


@st.composite
def batch_sets(draw):
    """Batches of items 0..n-1, and operands each reading distinct items of
    one other batch.  Half the operands are planted: read off a hidden row
    order, so that orders meeting them all often exist."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    results, start = [], 0
    for size in sizes:
        results.append(list(range(start, start + size)))
        start += size
    hidden = [draw(st.permutations(items)) for items in results]
    operands = []
    for _ in range(draw(st.integers(1, 5))):
        consumer = draw(st.integers(0, len(results) - 1))
        sources = [b for b in range(len(results))
                   if b != consumer and len(results[b]) >= len(results[consumer])]
        if not sources:
            continue
        source = draw(st.sampled_from(sources))
        count = len(results[consumer])
        if draw(st.booleans()):   # planted: a run of the hidden order
            first = draw(st.integers(0, len(results[source]) - count))
            run = hidden[source][first:first + count]
            by_row = dict(zip(hidden[consumer], run))
            operands.append((consumer, [by_row[item] for item in results[consumer]]))
        else:
            operands.append((consumer, draw(st.permutations(results[source]))[:count]))
    return results, operands


def all_runs_possible(results, operands):
    for orders in itertools.product(*(itertools.permutations(r) for r in results)):
        orders = [list(order) for order in orders]
        if all(is_run(orders[consumer], dict(zip(results[consumer], sources)), orders)
               for consumer, sources in operands):
            return True
    return False


@settings(max_examples=500, deadline=None)
@given(batch_sets())
def test_planner_finds_every_ideal_layout(case):
    results, operands = case
    answer = plan(results, operands)
    assert [sorted(items) for items in answer.results] == results
    for number in answer.aligned:
        consumer, sources = operands[number]
        # Operands name the consumer's items in its original row order.
        assert is_run(answer.results[consumer], dict(zip(results[consumer], sources)),
                      answer.results)
    if all_runs_possible(results, operands):
        assert sorted(answer.aligned) == list(range(len(operands)))


def test_an_operand_with_repeated_rows_is_left_to_a_gather():
    answer = plan([["a", "b"], ["x", "y"]], [(1, ["a", "a"]), (1, ["b", "a"])])
    assert answer.aligned == [1]
    assert answer.results == [["b", "a"], ["x", "y"]]


def test_doctests():
    assert doctest.testmod(layout).failed == 0
