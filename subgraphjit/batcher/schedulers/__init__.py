"""Schedulers decide which batches run, in which order; each lives in its
own file.

A scheduler is an object with one call, ``schedule(graph)``: given a
BatchGraph, every batch in the order they run, each a list of node indices
(nodes of one type, each after the batches that compute its operands).
Schedules depend only on the graph's structure, so nothing runs while one
is made.  Every scheduler must give the same results; they differ only in
how many batches they need.

``SCHEDULERS`` maps each name the ``scheduler`` parameter takes (but
"none") to its class.  Depth, agenda and critical make their schedules in
C (``native/analysis.c``); the FSM's policy is learned, so its scheduler
takes the policy to share (``FsmScheduler(policy)``; made without one, it
learns one on the first graph it schedules).
"""

from .agenda import AgendaScheduler
from .critical import CriticalScheduler
from .depth import DepthScheduler
from .fsm import FsmScheduler
from .structure import depths, lower_bound

__all__ = ["SCHEDULERS", "AgendaScheduler", "CriticalScheduler", "DepthScheduler",
           "FsmScheduler", "depths", "lower_bound"]

SCHEDULERS = {scheduler.name: scheduler for scheduler in (
    DepthScheduler, AgendaScheduler, CriticalScheduler, FsmScheduler)}
