"""Evaluation: turn recorded VirtualNodes into tf.Tensors.

Evaluation runs in the caller's own TensorFlow context, so an enclosing
GradientTape records every op and gradients reach the tf.Variables, which are
read now (updates made between recording and evaluation are seen).

It never recurses: node ids increase in recording order, which is a
topological order, so the unevaluated ancestors are collected with an explicit
stack and run sorted by id.  A 10,000-op chain is as safe as a 10-op one.
"""

import gc
import sys
import time

import tensorflow as tf

from . import _native, concurrent, eager_scopes, forced, overlap
from .batcher.execute import execute
from .batcher.program import could_record
from .batcher.schedulers import SCHEDULERS, fsm, lower_bound
from .context import context
from .ir.node import VirtualNode, use_evaluator
from .ir.record import annotate
from .patterns import search


# Every unevaluated node the targets depend on, in recording order: a node
# is unevaluated while its ``result`` and ``batched`` are None; operands that
# are not VirtualNodes are skipped.  In C (``native/analysis.c``): this walk
# visits every node of every evaluation.
unevaluated_ancestors = _native.unevaluated_ancestors


def run_node(node):
    """Run one node on its own, setting its ``result`` in place (and
    dropping its inputs)."""
    values = [operand.value() if type(operand) is VirtualNode else operand
              for operand in node.inputs]
    try:
        node.result = node.entry.call(values, node.attrs)
    except Exception as error:
        raise annotate(error, node.entry, node.site) from None
    # Drop the graph behind the node: its value is all anyone needs now, and
    # holding operands would keep whole minibatches alive.
    node.inputs = ()
    node.site = None


def evaluate(targets, required=None, forced_by=None, pipelined=False,
             compile_after=None, queue=False):
    """Evaluate the VirtualNodes in ``targets`` (and what they depend on).

    ``required``: the nodes that must have values afterwards (all targets
    unless told otherwise).  A batching scope names none: its targets are
    everything recorded in it, and subgraph granularity may leave interior
    nodes of a pattern to be computed only if someone asks for them.
    ``forced_by``: the read that asked for a value before its time, as
    ``forced.forced_site`` describes it.  ``pipelined``: part of a scope
    evaluated while the rest records (``evaluate_so_far``).
    ``compile_after``: as the parameter ``compile`` (None: the parameter).
    ``queue``: as for a pipelined part, a compiled program no tape can
    record is queued (overlap.py), for the caller to wait for
    (``overlap.end``): a scope's close.
    """
    targets = targets if type(targets) in (list, tuple) else list(targets)
    if forced_by is None:
        # The program asks for an evaluation (a scope's end, tf.build): from
        # here on, a read that forces a second one splits work (forced.judge).
        context.forced_since_asked.clear()
    if not any(type(target) is VirtualNode and not target.evaluated
               for target in targets):
        return
    # An instance of tf.batching.map waits for its map's next round instead.
    if concurrent.running and concurrent.suspend(targets, required, forced_by):
        return
    if forced_by is concurrent.ROUND:
        context.concurrent_rounds += 1
    elif forced_by is not None:
        context.forced_evaluations[forced_by] += 1
    started = time.perf_counter()
    # Evaluation (the pattern search included) allocates many short-lived
    # objects but frees none of its own cycles; without this, Python's
    # cyclic collector would sweep the whole heap (TensorFlow's included)
    # several times per evaluation.  (A scope's own evaluation, such as
    # tf.batching()'s on exit, runs after the scope turned it back on.)
    collector_was_on = gc.isenabled()
    gc.disable()
    try:
        # (With patterns, the search walks the graph from the targets; the
        # unevaluated ancestors are found only when it needs them.  It
        # rewrites matched nodes in place into pattern nodes.)
        # A probe of a line run eagerly (eager_scopes.py) only asks whether
        # its scope batches: op by op, nothing compiled.
        probing = eager_scopes.probing
        if context.parameters["granularity"] != "op" and not probing:
            nodes = search.optimize(targets, targets if required is None else required)
        else:
            nodes = unevaluated_ancestors(targets)
        context.session += 1
        before = context.stats() if context.parameters["debug"] else None
        if compile_after is None:
            compile_after = (0 if forced_by is concurrent.ROUND or probing
                             else context.parameters["compile"])
        if (compile_after and context.parameters["granularity"] != "op"
                and search.SEARCH.trial_settling):
            compile_after = 1   # (a granularity trial times units as they will run)
        launches = _run(nodes, targets if required is None else required,
                        compile_after=compile_after, queue=pipelined or queue)
    finally:
        if collector_was_on:
            gc.enable()
    context.evaluations += 1
    context.pipelined_evaluations += pipelined
    context.nodes_evaluated += len(nodes)
    context.evaluate_seconds += time.perf_counter() - started
    if forced_by is not None and forced_by is not concurrent.ROUND:
        forced.judge(forced_by, launches)   # may warn: most work forced
    if before is not None:
        print(debug_summary(before, context.stats(), len(nodes), launches,
                            time.perf_counter() - started, forced_by),
              file=sys.stderr)


def debug_summary(before, after, nodes, launches, seconds, forced_by=None):
    """One screen about one evaluation (``SUBGRAPHJIT_DEBUG=1``)."""
    def grew(key):
        return after[key] - before[key]

    def counter_growth(key):
        return {name: count - before[key].get(name, 0)
                for name, count in after[key].items()
                if count - before[key].get(name, 0)}

    sizes = counter_growth("batch_sizes")
    unbatched = counter_growth("unbatched")
    lines = [
        f"subgraphjit evaluation {context.session}: {nodes} nodes, {launches} "
        f"launches (scheduler {context.parameters['scheduler']}), "
        f"{seconds * 1e3:.1f} ms",
        f"  analysis {grew('analysis_seconds') * 1e3:.1f} ms (row layout "
        f"{grew('layout_seconds') * 1e3:.1f} ms), execution "
        f"{grew('execute_seconds') * 1e3:.1f} ms, duplicates skipped "
        f"{grew('duplicates_skipped')}",
    ]
    if forced_by is not None:
        lines.append(f"  forced by {forced_by}")
    if grew("search_seconds"):
        lines.append(f"  patterns: {grew('pattern_matches')} nodes replaced by "
                     f"{after['patterns']} patterns, {grew('pattern_fusions')} "
                     f"pairs joined, search {grew('search_seconds') * 1e3:.1f} ms")
    if grew("fsm_training_seconds") or grew("scheduler_fallbacks"):
        lines.append(f"  fsm: learned for {grew('fsm_training_seconds') * 1e3:.0f} ms "
                     f"({grew('fsm_training_iterations')} episodes), "
                     f"{grew('scheduler_fallbacks')} unseen states left to agenda")
    if after["lower_bound"] is not None:
        lines.append(f"  lower bound {grew('lower_bound')} launches")
    if sizes:
        total = sum(sizes.values())
        lines.append(
            f"  batch sizes: mean {sum(k * v for k, v in sizes.items()) / total:.1f}, "
            f"largest {max(sizes)}, {sizes.get(1, 0)} of {total} of size 1")
    lines.append(f"  operands: {grew('slices')} slices, {grew('gathers')} gathers "
                 f"({grew('bytes_gathered') / 1e6:.2f} MB), {grew('stacks')} stacks")
    for reason, count in sorted(unbatched.items(), key=lambda item: -item[1])[:5]:
        lines.append(f"  unbatched: {count} x {reason}")
    return "\n".join(lines)


def _run(nodes, required, compile_after, queue=False):
    """Run the nodes, batched unless the scheduler is 'none'; returns the
    number of ops launched.  (A compiled program may leave a node that
    neither a later node nor the caller needs to be computed if asked.)
    A round of ``tf.batching.map`` runs step by step: its key changes with
    the instances still running, and its few small batches ran slower
    compiled (both value-dependent example models, BENCHMARKS.md)."""
    scheduler = context.parameters["scheduler"]
    if scheduler == "none":
        overlap.end()
        for node in nodes:
            run_node(node)
        return len(nodes)
    statistics = context.batching
    before = statistics["batches"]
    graph = execute(nodes, statistics, _scheduler(scheduler),
                    context.parameters["layout"], compile_after, required, queue)
    if context.parameters["lower_bound"]:
        statistics["lower_bound"] += lower_bound(graph)
    return statistics["batches"] - before


def _scheduler(name):
    """A fresh scheduler; the FSM one shares the context's learned policy."""
    if name != "fsm":
        return SCHEDULERS[name]()
    if context.fsm_policy is None:
        context.fsm_policy = fsm.policy_for(context.parameters["fsm_encoding"],
                                            context.parameters["fsm_table"])
    return SCHEDULERS["fsm"](context.fsm_policy, context.batching,
                             on_trained=_save_fsm_policy)


def _save_fsm_policy(policy):
    if context.parameters["fsm_table"]:
        policy.save(context.parameters["fsm_table"])


def evaluate_so_far(upto):
    """The innermost scope holds ``pipeline`` recorded nodes, and its first
    ``upto`` end where a new instance began: no op recorded after them
    read one still unevaluated (``_native.record`` calls this; so no tree
    is cut in two; past twice the limit with no such point, all of them).
    In inference, evaluate them now: their compiled
    program is queued on the asynchronous executor (overlap.py) and runs
    on another core while the user's code records the rest of the scope,
    whose close waits for it.  Only nodes someone still references are
    evaluated, as when a scope closes: that is every node a later op or
    the user can read.  Otherwise (a tape could record: a node read by
    nothing later would add its rows to a gradient; a granularity trial
    timing units; nothing queues), not in this scope."""
    if not (context.parameters["overlap"] and context.parameters["compile"]
            and context.parameters["scheduler"] != "none"
            and not concurrent.running and not could_record()
            and (context.parameters["granularity"] != "auto"
                 or "inference" in context.granularity_chosen)):
        context.pause_pipeline()
        return
    # (Taken out of the scope's list in C: a slice and a del touched each
    # node's count twice more, 2-3% of a 256-tree inference.)
    recorded = _native.scope_leftovers(context.pending, upto)
    # Compiled at first sight: a part is worth pipelining only compiled,
    # and a scope holds several parts of one key (waiting for the key to
    # be ``compile`` of the last 16 cost a 256-tree Tree-LSTM's inference
    # two passes of 2,000 trees; the compile budget bounds the waste).
    evaluate(recorded, required=(), pipelined=True, compile_after=1)
    if not overlap.holding() or context.one_part:
        # It ran where it was called (its program not compiled, or over
        # varying shapes), or the scope is small (context.FIRST_SHARE):
        # the rest of the scope runs as one, batched.
        context.pause_pipeline()


def _rerun(nodes):
    """Pipelined nodes whose queued program failed, run again step by step
    where they are called, so that the error names the user's line.  Each
    one that had a value is asked for: later nodes read them now, so a
    search from the targets that nothing consumes would reach few."""
    evaluate(nodes, required=[node for node in nodes if not node.swallowed],
             compile_after=0)


# Reading a node's value before its evaluation, and a tf.batching.map
# round, evaluate here (node.py and concurrent.py cannot import this
# module, which imports them); so do a scope's pipelined parts, and their
# run anew after a failure (context.py, overlap.py).
use_evaluator(evaluate)
concurrent.use_evaluator(evaluate)
context.pipeline_callback = evaluate_so_far
overlap.rerun = _rerun


def build(structure):
    """Evaluate every VirtualNode in a nested structure; return it with each
    node replaced by its tf.Tensor (other leaves are returned unchanged)."""
    leaves = tf.nest.flatten(structure, expand_composites=False)
    evaluate(leaves)
    return tf.nest.map_structure(
        lambda leaf: leaf.value() if type(leaf) is VirtualNode else leaf,
        structure)
