"""``tf.batching.map``: a minibatch's instances run concurrently, each until
it reads a value, and their reads are served by one batched evaluation
(ACROBAT, section 4.2: fibers).

A per-instance function that reads a value (``if float(gate) > 0.5:``,
``while not halted:``) forces an evaluation, and run one instance after
another, every read evaluates that instance's work alone: nothing batches.
``map(fn, items)`` runs each ``fn(item)`` as a greenlet.  A read that would
evaluate registers what it needs and switches to the coordinator (the
caller of ``map``); once every live instance has suspended or finished,
the coordinator evaluates the union of their requests in ONE evaluation
(batched across instances), then resumes each with its value.  A round::

    coordinator  -> instance 0 runs to its read  -> back
                 -> instance 1 runs to its read  -> back   ...
                 evaluate(reads of 0, 1, ...)     (one batched evaluation)
                 -> resume 0, 1, ... to their next read or their end

Why greenlets: they run in the caller's thread, so TensorFlow's
thread-local state -- the GradientTape stack, the device and name scopes,
the eager context -- is the caller's in every instance.  Threads would
lose it: an op an instance runs eagerly (outside the op table, a Keras
layer's build, a value converted to a tensor) would run on another
thread, unrecorded by the user's tape.  Generators would need every read
in the user's code (and every function between) to be a ``yield``.
A suspend and resume costs 0.9 us with greenlets, 0.05 us with a
generator, 24 us handing over between two threads (semaphores, one
core): per ACT minibatch of 25 (some 235 reads, 130 ms) 0.2 ms, or 6 ms
with threads.

Semantics: results (values, gradients) equal those of
``[fn(item) for item in items]`` for instances that do not talk to each
other; random draws (``tf.nn.dropout``'s mask, ``tf.random``) happen in
the interleaved order, so they differ from the sequential loop's unless
seeded per op.  Each instance sees its own stack of subgraphjit scopes
(``tf.batching()``, ``tf.GradientTape()`` opened inside ``fn``) on top of
the caller's.

Errors: an exception raised in instance ``k`` propagates out of ``map``
with its own traceback (the user's lines); instances after ``k`` are
abandoned (unwound with ``GreenletExit``, so their ``with`` blocks close)
and instances before ``k`` run to their end first, so that when several
instances fail ``map`` raises the error the sequential loop would (the
lowest index).  An evaluation that fails is retried one instance at a
time, in order, and the error is raised in the first instance whose read
fails, at that read, like a forced evaluation's error.  A nested ``map``
inside an instance is a coordinator of its own whose evaluations are reads
of the instance running it, so the outer round serves them too.
"""

import gc

import greenlet

from .context import context

# ``forced_by`` of a round's evaluation (evaluate.py counts it as a round).
ROUND = "a tf.batching.map round"

# Maps whose coordinator is running: evaluate() looks for the instance
# that asks only while one is (the check on every evaluation is this int).
running = 0
# Outermost maps begun so far: a granularity trial times a map's rounds
# together, as one turn of one unit (patterns/search.py).
maps = 0

# What a round calls: ``evaluate(targets, required, forced_by=)`` of
# evaluate.py, which imports this module (every evaluation asks ``suspend``
# first) and so installs itself here (``use_evaluator``).
_evaluator = None


def use_evaluator(evaluate):
    """Make ``evaluate`` what a round's evaluation calls (evaluate.py
    installs its own when imported)."""
    global _evaluator
    _evaluator = evaluate


class _Instance(greenlet.greenlet):
    """One ``fn(item)`` of a map: a greenlet whose parent is the coordinator."""

    def __init__(self, coordinator, fn, item, index):
        super().__init__()
        # TensorFlow and Keras keep no contextvars, but the user's code may:
        # each instance shares the caller's, as code in one thread would.
        self.gr_context = greenlet.getcurrent().gr_context
        self.coordinator = coordinator
        self.fn, self.item, self.index = fn, item, index
        self.request = None     # (targets, required) of a suspended read
        self.error = None       # an evaluation's error, to raise at the read
        # The instance's stack of subgraphjit scopes, on top of the caller's
        # (the caller's pending lists are shared: what an instance records
        # is evaluated by the caller's scope, as in the sequential loop).
        self.scopes = list(context.scopes)
        self.pending = context.pending

    def run(self):
        try:
            return self.fn(self.item)
        finally:
            self.fn = self.item = None


def suspend(targets, required, forced_by):
    """From ``evaluate``: if a map's instance asks, register its request,
    switch to its coordinator, and return True once the coordinator has
    evaluated it (or raise the evaluation's error here); else False, and
    the caller evaluates as usual (reads outside ``map``, or made by a
    coordinator, or while an abandoned instance unwinds)."""
    instance = greenlet.getcurrent()
    if type(instance) is not _Instance or instance.coordinator.closing:
        return False
    if forced_by is not None and forced_by is not ROUND:
        context.concurrent_reads += 1
        context.concurrent_read_sites[forced_by] += 1
    instance.request = (targets, required)
    instance.coordinator.greenlet.switch()
    if instance.error is not None:
        error, instance.error = instance.error, None
        raise error
    return True


class _Coordinator:
    def __init__(self, fn, items):
        self.greenlet = greenlet.getcurrent()
        self.closing = False   # abandoning instances: their reads evaluate directly
        self.instances = [_Instance(self, fn, item, index)
                          for index, item in enumerate(items)]
        self.results = [None] * len(self.instances)
        self.failure = None    # (index, exception) of the first failed instance

    def run(self):
        runnable = list(self.instances)   # to start or resume, in order
        waiting = []                      # suspended, their requests unserved
        while runnable:
            for instance in runnable:
                if self.failure is not None and instance.index > self.failure[0]:
                    continue   # abandoned below
                try:
                    result = self._switch_into(instance)
                except Exception as error:   # noqa: BLE001 (re-raised by map)
                    self._failed(instance, error)
                    continue
                if instance.dead:
                    self.results[instance.index] = result
                else:
                    waiting.append(instance)
            if self.failure is not None:
                waiting = [instance for instance in waiting
                           if instance.index < self.failure[0]]
            waiting.sort(key=lambda instance: instance.index)
            runnable = self._evaluate(waiting)
            waiting = [instance for instance in waiting if instance.request is not None]
        if self.failure is not None:
            raise self.failure[1]
        return self.results

    def _switch_into(self, instance, *throw):
        """Run ``instance`` until it suspends or ends, with its own scopes."""
        saved = context.scopes, context.pending
        context.scopes, context.pending = instance.scopes, instance.pending
        try:
            return instance.throw(*throw) if throw else instance.switch()
        finally:
            instance.scopes, instance.pending = context.scopes, context.pending
            context.scopes, context.pending = saved

    def _evaluate(self, waiting):
        """One round: evaluate every waiting request at once; returns the
        instances to resume.  If the evaluation fails, each request is
        evaluated alone, in order, until one fails: that instance gets the
        error at its read, those before it their values, and those after it
        wait for the next round."""
        if not waiting:
            return []
        targets, required = [], []
        for instance in waiting:
            wanted, needed = instance.request
            targets.extend(wanted)
            required.extend(wanted if needed is None else needed)
        try:
            _evaluator(targets, required, forced_by=ROUND)
        except Exception:   # noqa: BLE001 (raised again in its instance)
            served = []
            for instance in waiting:
                try:
                    _evaluator(*instance.request, forced_by=ROUND)
                except Exception as error:   # noqa: BLE001
                    instance.error = error
                    served.append(instance)
                    break
                served.append(instance)
            waiting = served
        for instance in waiting:
            instance.request = None
        return waiting

    def _failed(self, instance, error):
        """Instance ``instance`` raised: keep the lowest index's error, and
        abandon every instance after it."""
        if self.failure is None or instance.index < self.failure[0]:
            self.failure = (instance.index, error)
        self.abandon(self.failure[0])

    def abandon(self, after=-1):
        """Unwind every started, unfinished instance with index > ``after``
        (their ``finally`` and ``with`` blocks run; reads there evaluate
        directly); those never started are dropped."""
        self.closing = True
        try:
            for instance in self.instances[after + 1:]:
                if instance:   # a greenlet is true when started, not finished
                    try:
                        self._switch_into(instance, greenlet.GreenletExit)
                    except Exception:   # noqa: BLE001 (the first error wins)
                        pass
                instance.request = None
        finally:
            self.closing = False


def map(fn, items):  # noqa: A001 (tf.batching.map, as the user writes it)
    """``[fn(item) for item in items]``, with the instances run concurrently:
    each runs until it reads a value that is not computed yet, and the reads
    of all instances are served by one batched evaluation (a round), so
    value-dependent control flow (``if float(gate) > 0.5:``, ``while``)
    batches across instances.  Returns the results in order::

        with tf.GradientTape() as tape:
            losses = tf.batching.map(lambda example: model.loss(example), minibatch)
            loss = tf.add_n(losses)

    ``tf.stats()`` counts the rounds (``concurrent_rounds``) and the reads
    they served (``concurrent_reads``)."""
    global running, maps
    items = list(items)
    if not items:
        return []
    if not context.lazy:   # eager mode: nothing is recorded, nothing to batch
        return [fn(item) for item in items]
    coordinator = _Coordinator(fn, items)
    # Like a scope: everything recorded stays alive until the map ends, so
    # the cyclic collector could free nothing; it resumes after the map.
    collector_was_on = gc.isenabled()
    gc.disable()
    maps += not running
    running += 1
    try:
        return coordinator.run()
    finally:
        running -= 1
        try:
            coordinator.abandon()   # after an error in the coordinator itself
        finally:
            if collector_was_on:
                gc.enable()


__all__ = ["map", "ROUND", "suspend"]
