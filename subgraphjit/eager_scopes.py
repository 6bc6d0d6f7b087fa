"""Scopes with nothing to batch run eagerly.

Recording costs a little per op and an evaluation a little more, which
batching repays many times over where a minibatch's instances share work.
Where they share none (a minibatch of one sequence whose ops all differ,
a loop that reads each instance's values one at a time), the same ops run
op by op in the end (batcher/execute.py, ``little_to_share``), and the
recording was pure cost: 25-30% over eager TensorFlow on this project's
VM for a 12-op attention instance (BENCHMARKS.md).

So each outermost scope (``tf.batching()``, ``tf.GradientTape()``) is
judged by the line that opens it.  After ``WATCHED`` scopes in a row at
that line that evaluated most of their nodes op by op, or batched few
nodes a launch, and compiled and traced nothing, the line's next scopes
take turns eagerly (TensorFlow runs each op at once, nothing is
recorded) and lazily, ``TIMED`` of each (more while too close to
call), each timed until the line's next scope (a training step's
backward and update included; a lazy turn that compiled or traced is
taken again), and the faster is kept; a lazy turn that batched more
ends the turns, lazily.

Lines change (minibatches grow), so no judgement is final.  A line kept
eager is recorded again (a probe) after ``PROBE`` scopes, then after
twice as many, up to ``LONGEST_PROBE``, op by op and compiling nothing
(probing every 32 scopes with the granularity trial's one-off work cost
a minibatch of one a quarter of its speed); a probe that batches puts
the line back on recording, watched afresh.  A line kept lazy takes
turns again after as many scopes, doubling the same way (every eager
turn costs a line that batches a little its gain).

Results are the same either way (eager TensorFlow is the reference every
lazy path is tested against); ``stats()["scopes_run_eagerly"]`` counts
these scopes.  ``set_parameter("eager_scopes", False)`` records every
scope.
"""

import statistics
import time

from . import overlap
from .context import context
from .patterns.search import one_off_work

WATCHED = 3
# A scope had little to batch when this share of the nodes it evaluated
# ran op by op (a plain loop's scope batches only its last evaluation),
# or its launches ran at most this many nodes each on average (a lattice
# LSTM on one sentence ran 0.35x eager TensorFlow's speed; minibatches of
# 25 batch tens of nodes a launch, and are never tried eagerly, which
# would cost seconds).
UNSHARED = 0.5
BATCHED = 4
TIMED = 3
# Each turn is another instance (a minibatch of one tree has 1 to 12
# leaves), so medians of three that differ by less than this are taken
# again, up to MOST_TIMED turns each: tree_lstm_2type's inference at
# batch 1 was once judged eager on 4.25 ms against 4.9 ms, and ran 45% of
# its scopes eagerly at 1.19x eager TensorFlow, against 2.7x recorded.
CLEAR = 1.5
MOST_TIMED = 6
PROBE = 32
LONGEST_PROBE = 512
# Lines remembered (the oldest forgotten first): a program opens scopes at
# a handful.
KEPT = 256


class _Line:
    __slots__ = ("unshared", "times", "turn", "eager", "scopes", "probe")

    def __init__(self):
        self.unshared = 0          # lazy scopes in a row with little to batch
                                   # (negative: waiting since the last turns)
        self.times = None          # while taking turns: {eager?: [seconds]}
        self.turn = None           # the Scope of a turn, timed until the next
        self.eager = False         # kept eager
        self.scopes = 0            # scopes since kept eager or probed
        self.probe = PROBE         # ... after which a scope is recorded (or,
                                   # kept lazy, turns are taken again)


class Scope:
    """One outermost scope being judged: ``eager`` says how it runs."""

    __slots__ = ("line", "eager", "mode", "started", "evaluated", "unshared",
                 "batches", "one_off")

    def __init__(self, line, eager, mode):
        self.line, self.eager, self.mode = line, eager, mode
        self.started = time.perf_counter()
        if not eager:   # (what leave() judges a recorded scope by)
            self.evaluated = context.nodes_evaluated
            self.unshared = context.batching["unshared_nodes"]
            self.batches = context.batching["batches"]
            self.one_off = one_off_work()


_lines = {}
# A probe is running: its evaluations go op by op, compiling nothing
# (evaluate.py), since the granularity trial's one-off work (collecting
# patterns, compiling programs at first sight) cost each probe tens of ms.
probing = False


def reset():
    """Forget every line's judgement (``tf.reset_patterns``)."""
    _lines.clear()


def enter(frame, mode):
    """A scope of ``mode`` ("training": a tape's; "inference") opens at
    ``frame``'s line: the Scope to ``leave`` with, or None for a nested
    scope or with the parameter off.  An eager scope records nothing until
    it leaves."""
    global probing
    if context.scopes or not context.lazy or not context.parameters["eager_scopes"]:
        return None
    key = (frame.f_code, frame.f_lasti)
    line = _lines.get(key)
    if line is None:
        if len(_lines) >= KEPT:
            del _lines[next(iter(_lines))]
        line = _lines[key] = _Line()
    if line.turn is not None:
        # A turn lasts until the line's next scope: a training step's
        # backward and update come after its scope, and an eager forward
        # leaves the tape a slower backward than a compiled program's.
        # (A lazy turn whose backward traced or compiled is taken again.)
        turn, line.turn = line.turn, None
        if turn.eager or not _grew(turn.one_off):
            line.times[turn.eager].append(time.perf_counter() - turn.started)
            _decide(line)
    if line.eager:
        line.scopes += 1
        eager = line.scopes < line.probe
        probing = not eager
    elif line.times is not None:
        eager = len(line.times[True]) <= len(line.times[False])
    else:
        eager = False
    if eager:
        # Ops now run where they are called (the backward's queue ends).
        overlap.end()
        context.lazy = False
        context.scopes_run_eagerly += 1
    return Scope(line, eager, mode)


def leave(scope, failed=False):
    """The scope has closed (and, if lazy, evaluated what it recorded), or
    ``failed`` with an exception (which tells nothing)."""
    global probing
    if scope is None:
        return
    line = scope.line
    probing = False
    if scope.eager:
        context.lazy = True
    if failed:
        return
    if scope.eager:
        if line.times is not None:
            line.turn = scope
        return
    evaluated = context.nodes_evaluated - scope.evaluated
    unshared = context.batching["unshared_nodes"] - scope.unshared
    batches = context.batching["batches"] - scope.batches
    if not (evaluated > 0 and (unshared >= UNSHARED * evaluated
                               or batches * BATCHED >= evaluated)):
        # It batched (or evaluated nothing): recorded from now on.
        if line.eager:   # a probe: minibatches grew, say; watched afresh
            line.unshared, line.eager, line.probe = 0, False, PROBE
        elif line.times is not None:   # a lazy turn: the turns end, lazily
            _keep_lazy(line)
        else:   # a line waiting since its turns keeps waiting
            line.unshared = min(line.unshared, 0)
        return
    if line.eager:   # a probe that found nothing to batch either
        line.scopes = 0
        _back_off(line)
        return
    if line.times is not None:
        # (A turn that traced, compiled or inferred shapes is taken again:
        # it timed work done once.)
        if not _grew(scope.one_off):
            line.turn = scope
        return
    choosing = (context.parameters["granularity"] == "auto"
                and scope.mode not in context.granularity_chosen)
    if choosing or _grew(scope.one_off, shapes=False):
        # The lazy way is still settling (the unit being chosen, programs
        # compiling): judged once it runs as it will.
        line.unshared = 0
        return
    line.unshared += 1
    if line.unshared >= WATCHED:
        line.times = {True: [], False: []}


def _grew(one_off, shapes=True):
    """Whether one-off work was done since ``one_off_work()`` was
    ``one_off`` (counters that ``reset_stats`` may have set back); with
    ``shapes`` False, a new shape inferred (cheap, and with sentences of
    many lengths frequent for long) does not count."""
    now = one_off_work()
    return (now.traces > one_off.traces or now.compile_seconds > one_off.compile_seconds
            or (shapes and now.shapes > one_off.shapes))


def _decide(line):
    if min(map(len, line.times.values())) < TIMED:
        return
    verdict = faster(line.times[True], line.times[False])
    if verdict:
        line.eager, line.times, line.scopes = True, None, 0
    elif verdict is not None:
        _keep_lazy(line)


def _keep_lazy(line):
    # Turns again only after as many scopes as a probe waits, and twice as
    # many the time after: each turn taken eagerly costs a line that
    # batches a little (a minibatch of one tree) its batching's gain.
    line.times, line.unshared = None, -line.probe
    _back_off(line)


def _back_off(line):
    """The next probe (or turns) waits twice as long, up to LONGEST_PROBE."""
    line.probe = min(2 * line.probe, LONGEST_PROBE)


def faster(eager_seconds, lazy_seconds):
    """Whether the eager turns were faster, by their medians (one slow
    turn, a collector's sweep, decides nothing); None, for more turns,
    while the medians are within ``CLEAR`` of each other and fewer than
    ``MOST_TIMED`` of each were taken."""
    eager, lazy = statistics.median(eager_seconds), statistics.median(lazy_seconds)
    if (max(eager, lazy) < CLEAR * min(eager, lazy)
            and min(len(eager_seconds), len(lazy_seconds)) < MOST_TIMED):
        return None
    return eager < lazy
