"""One evaluation's nodes batched and run: step by step (executor.py) or
as one compiled program (plan.py, program.py)."""

import time

import tensorflow as tf

from .. import overlap
from . import layout, plan, program, varying
from .executor import Executor
from .graph import BatchGraph, NodeOperand

# An evaluation whose batches are more than this share of its nodes runs
# op by op (little_to_share).
LITTLE_SHARED = 0.75


def execute(nodes, statistics, scheduler, row_layout="none", compile_after=0,
            required=(), queue=False):
    """Batch and run the nodes; ``scheduler`` is a fresh scheduler object
    (its ``schedule(graph)`` gives the batches, schedulers/__init__.py).
    With ``compile_after`` > 0 the graph is planned as a program, which
    runs as one compiled call once its key has been seen that many times
    (plan.py, program.py); otherwise, and until then, the scheduler's
    batches run one by one.  Every node gets its value in place (a row
    of a batched result, or a result of its own; ``Executor.write_back``,
    ``program.run``); a program's nodes whose outputs it did not keep
    are marked swallowed (computed only if asked for).  ``queue``: a
    compiled program no tape can record is queued, not waited for
    (overlap.py), and the operands its nodes drop are held until it has
    run; step by step, it runs here as always."""
    started = time.perf_counter()
    recording = program.could_record()
    graph = BatchGraph(nodes, own_rows=recording)
    varying.merge_types(graph)
    batches = scheduler.schedule(graph)
    if little_to_share(graph, batches):
        # As eager TensorFlow runs them, one by one in recording order: no
        # program (whose planning and call cost more than a few launches),
        # no stacked operands, results that later reads take whole.
        statistics["unshared_evaluations"] += 1
        statistics["unshared_nodes"] += len(graph)
        batches = [[index] for index, node_type in enumerate(graph.type_of)
                   if node_type >= 0]
        compile_after = 0
    compiled = None
    if compile_after and batches and graph.varying:
        # A program's buffers hold rows of one shape each (plan.py).
        statistics["programs_not_compiled"]["batches over varying lengths"] += 1
    elif compile_after and batches:
        # A graph of a structure planned and compiled before takes its
        # program again, without outline and compiled_for.
        read = plan.read_outputs(graph, required)
        structure = plan.structure(graph, read)
        the_program, compiled = program.PROGRAMS.again(structure, graph, batches,
                                                       statistics, recording)
        if compiled is None:
            the_program = plan.outline(graph, batches, required, program.MAX_KINDS, read)
            if the_program is None:
                statistics["programs_not_compiled"][
                    f"more than {program.MAX_KINDS} node kinds"] += 1
            else:
                compiled = program.PROGRAMS.compiled_for(the_program, compile_after,
                                                         statistics, recording, structure)
        if compiled is not None:
            the_program.fill()
    # The previous minibatch's backward and update ran meanwhile: wait for
    # them here, before any op of this evaluation runs (unless this one
    # queues too).  A training program's forward is then queued, and its
    # backward behind it (program.run).
    queued = queue and compiled is not None and not recording
    if queued:
        overlap.begin()
        queued = overlap.active()
    arguments = None
    # Before ``analysed`` but no analysis: making the call's tensors
    # (execution) and the wait for the other core's work.
    prepared = waited = 0.0
    if not queued:
        if compiled is not None:
            # Its arguments are made while the queue still runs (the
            # previous minibatch's backward, a scope's part before this
            # one's rest), where they are called: a 25-tree inference's
            # second part, 0.2 ms sooner.  (If that fails, the queue
            # failed: end() raises its error, or the call makes them again.)
            preparing = time.perf_counter()
            try:
                with overlap.in_place():
                    arguments = compiled.arguments(the_program)
            except tf.errors.OpError:
                pass
            prepared = time.perf_counter() - preparing
        waiting = time.perf_counter()
        overlap.end()
        waited = time.perf_counter() - waiting
        if compiled is not None and recording:
            overlap.begin()   # (the training forward is queued: program.run)
    analysed = time.perf_counter()
    if compiled is not None:
        try:
            program.run(the_program, compiled, graph, statistics, recording, queued,
                        arguments)
        except tf.errors.OpError:
            if queued:
                # The queue failed earlier (an op refuses a failed queue):
                # end() raises that failure, its nodes run anew.
                overlap.end()
            # (A training program's queue held only its own ops.)
            overlap.discard()
            # A bad value in some instance: run step by step, whose error
            # names the instance's own line.
            compiled = None
    if compiled is None:
        if row_layout == "pq":
            planning = time.perf_counter()
            batches = order_rows(graph, batches)
            statistics["layout_seconds"] += time.perf_counter() - planning
        analysed = time.perf_counter()
        executor = Executor(graph, statistics)
        for batch in batches:
            executor.run(batch)
        executor.write_back()
    finished = time.perf_counter()
    statistics["analysis_seconds"] += analysed - started - prepared - waited
    statistics["queue_wait_seconds"] += waited
    statistics["execute_seconds"] += finished - analysed + prepared
    statistics["duplicates_skipped"] += graph.duplicates
    return graph


def little_to_share(graph, batches):
    """Whether batching saves less than a quarter of the launches
    (LITTLE_SHARED): then stacking operands and taking rows back out of
    batched results costs more than the launches it saves (a minibatch of
    one instance, a plain loop's reads of one instance's values)."""
    return len(batches) > LITTLE_SHARED * sum(len(batch) for batch in batches)


def order_rows(graph, batches):
    """The batches with their rows ordered by the layout planner.  Each
    batch's per-instance operands that read one output of other batched
    nodes are the planner's operands; it keeps those that can never be
    slices out itself (rows of several batches, repeated rows)."""
    operands = []
    for number, batch in enumerate(batches):
        if len(batch) == 1:
            continue
        rows = [graph.operands[index] for index in batch]
        for position in range(len(rows[0])):
            column = [row[position] for row in rows]
            if all(isinstance(operand, NodeOperand) and operand.index >= 0
                   and operand.pick == column[0].pick for operand in column):
                operands.append((number, [operand.index for operand in column]))
    return layout.plan(batches, operands).results
