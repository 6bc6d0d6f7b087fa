"""subgraphjit's own public functions, on top of the drop-in namespace."""

import sys

import tensorflow as tf

from . import concurrent, eager_scopes, overlap
from .batcher.program import PROGRAMS, could_record
from .context import context
from .evaluate import build, evaluate
from .forced import ForcedEvaluationWarning
from .ir.node import VirtualNode
from .ir.record import record, user_site
from .ir.table import ENTRIES_BY_NAME
from .patterns.search import SEARCH

__all__ = ["build", "batching", "GradientTape", "set_parameter",
           "get_parameter", "stats", "reset_stats", "access", "patterns",
           "reset_patterns", "ForcedEvaluationWarning"]


def set_parameter(key, value):
    """Set a parameter (``depth``, ``freq``, ``collect``, ``mode``, ...)."""
    context.set_parameter(key, value)


def get_parameter(key):
    return context.get_parameter(key)


def stats():
    """Counters since the last ``reset_stats()``, as a dict."""
    return context.stats()


def reset_stats():
    context.reset_stats()


def patterns():
    """The frequent subgraphs found so far (empty while collecting), then
    the pairs of them joined into one call, each list most matched first;
    ``print(p)`` shows a pattern's signature, counts and code."""
    def most_matched(found):
        return sorted(found, key=lambda pattern: (-pattern.matches, pattern.number))

    return (most_matched((context.patterns or {}).values())
            + most_matched(SEARCH.fused.values()))


def reset_patterns():
    """Forget collected statistics and patterns, compiled programs, and
    which scopes run eagerly: the next ``collect`` evaluations collect
    again, and programs compile anew with a fresh budget (for a new model,
    or new data)."""
    SEARCH.reset()
    PROGRAMS.clear()
    eager_scopes.reset()


def access(outputs, index):
    """The thesis's ``access(x, i)``: output ``index`` of a multi-output op.

    Multi-output ops already return a list of nodes, so this is indexing; it
    exists so code written for the thesis's API runs unchanged.
    """
    return outputs[index]


class batching:  # noqa: N801 (tf.batching(), as the user writes it)
    """Record everything inside the block and evaluate it all on exit.

    This is the batching scope of JIT dynamic batching: the work recorded in
    one scope is evaluated together (and, with the batching layer, batched).
    """

    __slots__ = ("_judged", "_recording")

    # tf.batching.map(fn, items): the instances of a minibatch run
    # concurrently, their value reads served by batched evaluations
    # (concurrent.py).
    map = staticmethod(concurrent.map)

    def __enter__(self):
        # (A class, not a generator: a scope run eagerly costs the user's
        # minibatch of one only this and eager_scopes' judgement.)
        self._judged = eager_scopes.enter(sys._getframe(1), "inference")
        self._recording = self._judged is None or not self._judged.eager
        if self._recording:
            context.open_scope("inference")

    def __exit__(self, kind, error, traceback):
        failed = True
        try:
            if self._recording:
                recorded = context.close_scope()
                if kind is None:
                    # The last part's program is queued behind the
                    # pipelined parts' and waited for here: meanwhile the
                    # previous scope's graph is freed (overlap.end), and a
                    # queued failure is raised naming the user's line.
                    evaluate(recorded, required=(), queue=True)
                    if overlap.holding():
                        overlap.end()
                        # What only this list still holds (the nodes
                        # inside patterns) is freed while the next
                        # close waits: freed here, after the wait, it
                        # took 0.3 ms of a 25-tree minibatch
                        # (BENCHMARKS.md).
                        overlap.drop_later(recorded)
            failed = kind is not None
        finally:
            if self._recording:
                context.resume_collector()
            eager_scopes.leave(self._judged, failed)


class GradientTape(tf.GradientTape):
    """tf.GradientTape that is also a batching scope.

    What is recorded inside the tape is evaluated before the tape stops
    recording, so ``tape.gradient(loss, variables)`` works even when the user
    never calls ``tf.build``; VirtualNodes given to ``watch`` and
    ``gradient`` are evaluated first.
    """

    def __enter__(self):
        self._judged = eager_scopes.enter(sys._getframe(1), "training")
        context.open_scope("training")
        try:
            entered = super().__enter__()
        except BaseException:
            context.close_scope()
            context.resume_collector()
            eager_scopes.leave(self._judged, failed=True)
            raise
        context.tapes.append(self)
        # The gradients computed ahead for results recorded on this tape,
        # by the result's id: (result, Speculation) (batcher/program.py).
        self._speculations = {}
        return entered

    def __exit__(self, kind, error, traceback):
        failed = True
        try:
            recorded = context.close_scope()
            if kind is None:
                evaluate(recorded, required=())
                failed = False
        finally:
            context.resume_collector()
            context.tapes.remove(self)
            eager_scopes.leave(self._judged, failed)
            result = super().__exit__(kind, error, traceback)
        return result

    def watch(self, tensor):
        return super().watch(build(tensor))

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        target, sources = self._built(target), self._built(sources)
        if context.parameters["mode"] == "lazy":
            # The backward and what follows queue, to run while the next
            # minibatch records (overlap.py).
            overlap.begin()
        if output_gradients is None and unconnected_gradients in (
                tf.UnconnectedGradients.NONE, "none"):
            speculated = self._speculated_gradients(target, sources)
            if speculated is not None:
                return speculated
        return super().gradient(target, sources, output_gradients, unconnected_gradients)

    def speculated(self, result, speculation):
        """Keep ``speculation``, the gradients of ``result`` (a tensor)
        with respect to the variables, if this tape saw the op that made
        it (it is recording)."""
        if self._recording:
            self._speculations[id(result)] = (result, speculation)

    def _speculated_gradients(self, target, sources):
        """The gradients of ``target`` computed ahead, if they are what
        TensorFlow's tape gives: the target is the result they were
        computed for, every source a variable of floats, and no tape
        records now (which would record the backward's ops; a tape in
        its block records its own).  A source this tape did not watch, or
        the program did not read, gets None, as from the tape.  Else None:
        TensorFlow's tape differentiates."""
        kept = getattr(self, "_speculations", {}).get(id(target))
        if (kept is None or kept[0] is not target or self._tape is None
                or self._recording or could_record()):
            return None
        flat = tf.nest.flatten(sources)
        if not all(isinstance(source, tf.Variable) and source.dtype.is_floating
                   for source in flat):
            return None
        speculation = kept[1]
        watched_variables = self._tape.watched_variables()
        watched = {id(variable.handle) for variable in watched_variables}
        gradients = [speculation.gradients.get(id(source.handle))
                     if id(source.handle) in watched else None for source in flat]
        if not self._persistent:   # (as TensorFlow's gradient does)
            self._watched_variables = watched_variables
            self._tape = None
        speculation.used = True
        context.batching["speculations_used"] += 1
        return tf.nest.pack_sequence_as(sources, gradients)

    def jacobian(self, target, sources, *args, **kwargs):
        return super().jacobian(self._built(target), self._built(sources),
                                *args, **kwargs)

    def _built(self, structure):
        """``build(structure)``, with every row of a batched result taken
        out under this tape: a node evaluated in the tape's block may still
        be a row of its batched result, and a slice taken after the tape
        stopped would cut the gradient's path (per-instance losses, or a
        tape inside each instance of ``tf.batching.map``).  What was recorded
        after the block is evaluated outside the tape first, as eagerly."""
        evaluate(tf.nest.flatten(structure, expand_composites=False))
        if self._recording or self._tape is None:
            return build(structure)
        self._push_tape()
        try:
            return build(structure)
        finally:
            self._pop_tape()


# -- ops that need more than a table entry -----------------------------------

def shape(input, out_type=None, name=None):  # noqa: A002 (TensorFlow's name)
    """tf.shape: a node's shape is known when it is recorded, so this is a
    constant and needs no evaluation."""
    if type(input) is VirtualNode:
        return tf.constant(input.spec.shape,
                           dtype=out_type if out_type is not None else tf.int32,
                           name=name)
    if out_type is None:
        return tf.shape(input, name=name)
    return tf.shape(input, out_type=out_type, name=name)


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """tf.nn.dropout: the random mask is drawn when the op is recorded, in
    program order, so lazy and eager runs draw the same masks from the same
    seeds; the recorded op is a multiply by that mask."""
    if type(x) is not VirtualNode:
        return tf.nn.dropout(x, rate, noise_shape=noise_shape, seed=seed,
                             name=name)
    mask = tf.nn.dropout(tf.ones(x.spec.shape, x.spec.dtype), rate,
                         noise_shape=noise_shape, seed=seed, name=name)
    return record(ENTRIES_BY_NAME["math.multiply"], (x, mask), (), user_site())
