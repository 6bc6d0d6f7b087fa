"""Schedulers decide which batch runs next; each lives in its own file.

The interface is three calls: ``init(graph)`` with a BatchGraph,
``next_batch()`` returning the graph indices of the next batch (nodes of one
type whose operands are all computed) or None when done, and
``post_process(batch)`` after the batch ran.  Every scheduler must give the
same results; they differ only in how many batches they need.  A scheduler
whose choices need no values may also offer ``whole_schedule(graph)``, all
its batches at once (agenda, critical and depth do, in C:
``native/analysis.c``).
"""

from ... import _native
from .agenda import AgendaScheduler
from .critical import CriticalScheduler
from .depth import DepthScheduler

SCHEDULERS = {scheduler.name: scheduler
              for scheduler in (DepthScheduler, AgendaScheduler, CriticalScheduler)}


def schedule(graph, scheduler):
    """Every batch the scheduler picks for the graph, in order (lists of
    node indices).  Schedules depend only on the graph's structure, so this
    needs no values."""
    whole_schedule = getattr(scheduler, "whole_schedule", None)
    if whole_schedule is not None:
        return whole_schedule(graph)
    return step_by_step(graph, scheduler)


def step_by_step(graph, scheduler):
    """A schedule through the interface's three calls (the FSM's way; for
    agenda and depth, what their native ``whole_schedule`` must equal)."""
    scheduler.init(graph)
    batches = []
    while (batch := scheduler.next_batch()) is not None:
        scheduler.post_process(batch)
        batches.append(batch)
    return batches


def depths(graph):
    """Topological depth of every node: 1 + the deepest operand in the graph
    (nodes that are not scheduled add nothing)."""
    return _native.depths(graph.type_of, graph.sources)
