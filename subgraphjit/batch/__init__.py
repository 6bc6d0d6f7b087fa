"""The batching layer: run signature-equal work across a minibatch as one op.

``execute(nodes)`` takes the unevaluated nodes of one evaluation (in
recording order), builds their BatchGraph (types, shared operands,
duplicates), lets the chosen scheduler pick batches, and runs each batch as
one op through the executor.  ``set_parameter("scheduler", "none")`` turns
batching off (each node runs on its own, the reference behaviour).
"""

import time

from .executor import Executor
from .graph import BatchGraph
from .schedulers import SCHEDULERS


def execute(nodes, statistics, scheduler_name):
    started = time.perf_counter()
    graph = BatchGraph(nodes)
    scheduler = SCHEDULERS[scheduler_name]()
    scheduler.init(graph)
    executor = Executor(graph, statistics)
    analysed = time.perf_counter()
    scheduling = 0.0
    while True:
        before = time.perf_counter()
        batch = scheduler.next_batch()
        scheduling += time.perf_counter() - before
        if batch is None:
            break
        executor.run(batch)
        before = time.perf_counter()
        scheduler.post_process(batch)
        scheduling += time.perf_counter() - before
    executor.write_back()
    finished = time.perf_counter()
    statistics["analysis_seconds"] += analysed - started + scheduling
    statistics["execute_seconds"] += finished - analysed - scheduling
    statistics["duplicates_skipped"] += sum(
        1 for index, canonical in enumerate(graph.duplicate_of)
        if canonical != index)
    return graph


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
