"""The batching layer: run signature-equal work across a minibatch as one op.

``execute(nodes)`` takes the unevaluated nodes of one evaluation (in
recording order), builds their BatchGraph (types, shared operands,
duplicates), lets the chosen scheduler pick batches, orders each batch's rows
with the layout planner (``set_parameter("layout", "pq")``), and runs each
batch as one op through the executor.  ``set_parameter("scheduler", "none")``
turns batching off (each node runs on its own, the reference behaviour).
"""

import time

from .executor import Executor
from .graph import BatchGraph, NodeOperand


def execute(nodes, statistics, scheduler, layout="none"):
    """Batch and run the nodes; ``scheduler`` is a fresh scheduler object.
    The whole schedule is decided first (it depends only on the graph's
    structure), so the layout planner can order every batch's rows before
    anything runs."""
    started = time.perf_counter()
    graph = BatchGraph(nodes)
    batches = schedule(graph, scheduler)
    if layout == "pq":
        batches, plan = arrange_rows(graph, batches)
        statistics["layout_seconds"] += plan.seconds
        statistics["layout_dropped"] += len(plan.dropped)
    statistics["scheduler_fallbacks"] += getattr(scheduler, "fallbacks", 0)
    executor = Executor(graph, statistics)
    analysed = time.perf_counter()
    for batch in batches:
        executor.run(batch)
    executor.write_back()
    finished = time.perf_counter()
    statistics["analysis_seconds"] += analysed - started
    statistics["execute_seconds"] += finished - analysed
    statistics["duplicates_skipped"] += sum(
        1 for index, canonical in enumerate(graph.duplicate_of)
        if canonical != index)
    return graph


def schedule(graph, scheduler):
    """Every batch the scheduler picks, in order (lists of node indices)."""
    scheduler.init(graph)
    batches = []
    while (batch := scheduler.next_batch()) is not None:
        scheduler.post_process(batch)
        batches.append(batch)
    return batches


def arrange_rows(graph, batches):
    """Reorder the rows of each batch (ED-Batch section 3.2) so that the
    operands of later batches are contiguous, aligned runs of earlier
    results -- slices, not gathers -- wherever the constraints allow.

    An operand position takes part when all of its rows come from one earlier
    batched result (one node operand per member, in the graph, the same
    output of a multi-output op); any other operand needs a gather anyway."""
    all_operands = graph.operands
    sequences_of_batches = []
    for batch in batches:
        sequences = [batch]
        shared = graph.shared_operand[graph.type_of[batch[0]]]
        for position, is_shared in enumerate(shared):
            if is_shared:
                continue
            operands = [all_operands[index][position] for index in batch]
            if all(isinstance(operand, NodeOperand) and operand.index >= 0
                   and operand.pick == operands[0].pick for operand in operands):
                sequences.append([operand.index for operand in operands])
        sequences_of_batches.append(sequences)
    from . import layout
    plan = layout.plan([index for batch in batches for index in batch],
                       sequences_of_batches)
    position = {index: place for place, index in enumerate(plan.order)}
    return [sorted(batch, key=position.__getitem__) for batch in batches], plan


def lower_bound(graph):
    """ED-Batch's lower bound (appendix A.3) on the number of batches: for
    each type, the most nodes of that type on one path of the graph, summed
    over types (nodes of one type on one path need separate batches)."""
    total = 0
    for node_type in range(len(graph.signatures)):
        chain = [0] * len(graph)
        longest = 0
        for index, sources in enumerate(graph.sources):
            deepest = max((chain[source] for source in sources), default=0)
            chain[index] = deepest + (graph.type_of[index] == node_type)
            longest = max(longest, chain[index])
        total += longest
    return total
