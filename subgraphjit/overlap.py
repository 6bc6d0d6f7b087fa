"""A minibatch's backward and update, run while the next minibatch records.

In a training loop the backward (``tape.gradient``) and the optimizer's
update take more than half of TensorFlow's time, and nothing reads their
results before the next minibatch's forward.  So ``begin()`` (called by
``GradientTape.gradient`` under subgraphjit) moves this thread's TensorFlow ops to
an asynchronous executor of its own: the backward, the update and every op
the thread issues after them are queued, in order, and run on another
core while the user's Python records the next minibatch.  Order is kept
as in TensorFlow's own asynchronous mode: an op sees every earlier op's
effects (the next forward reads the updated variables), and reading a
value (``.numpy()``, ``float``) waits for the ops it depends on.  The next
evaluation calls ``end()``, which waits for the queue and returns the
thread to its synchronous executor, so the asynchronous stretch lasts
from a ``tape.gradient`` to the next evaluation.  A compiled training
program begins one too: its forward and the backward speculated for its
loss are queued (batcher/program.py).

Within it, an error of a TensorFlow op the user runs directly (subgraphjit
records most ops, and checks them when recording) is raised where the
queue is next waited for, with a note that says so.
``set_parameter("overlap", False)`` runs everything in place.

A pipelined evaluation (evaluate.py: inference, part of a scope evaluated
while the rest records) queues its compiled program here too, and so does
the scope's last part, which the scope's close waits for.  The operands
its nodes drop are held aside (``hold``) until ``end()`` has seen the
queue finish; if it failed, the nodes get them back, unevaluated, and run
anew, step by step, so that the error names the user's line as it would
have unqueued.  If it ran, they are freed at the next ``end()``, before
it waits, and so are the nodes only the close's list still holds (those
inside patterns, ``drop_later``): a scope's graph is freed while the next
scope's last part runs.

Calls must not ask for a queued tensor's shape, which waits for it: a
``tf.function`` checks its arguments' shapes, so the backward and the
update are called flat (``call``), with the shapes the program's traced
outputs promise (``promise``, ``shape_of``).  A backward that is not a
compiled program's (the tape replaying each batch's ops) queues too, its
ops dispatched by this thread as before but run by the other.

``call`` is also where a compiled program's functions skip TensorFlow's
graph rewrites (``unrewritten``).  A call's NumPy arguments become
tensors with no op (``host_tensor``): a ``tf.constant``'s op would be
queued too.
"""

import contextlib
import functools
import threading
import weakref

import tensorflow as tf

from . import _native
from .context import context

try:   # (private, for _DirectCall: where they move, every call is plain)
    from tensorflow.python import pywrap_tfe as _pywrap_tfe
    from tensorflow.python.eager import cancellation as _cancellation
    from tensorflow.python.eager import execute as _execute
except ImportError:
    _pywrap_tfe = None
try:   # (private, for host_tensor: where it moves, tf.constant)
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:
    _EagerTensor = None

_thread = threading.local()


@functools.cache
def _eager():
    # TensorFlow's executors per thread have no public API.  Where these
    # private modules change, nothing overlaps.  (Imported once: this is
    # on every program call's path.)
    from tensorflow.python.eager import context as eager_context, executor
    return eager_context, executor


def active():
    """Whether this thread's ops are queued (between begin and end)."""
    return getattr(_thread, "synchronous", None) is not None


def begin():
    """Queue this thread's TensorFlow ops from here on (if enabled)."""
    if active() or not context.parameters["overlap"]:
        return
    try:
        eager_context, executor = _eager()
        current = eager_context.context()
        queue = getattr(_thread, "queue", None)
        if queue is None:
            queue = _thread.queue = executor.new_executor(enable_async=True)
        synchronous = current.executor
        if synchronous.is_async():   # the user's own asynchronous mode
            return
        current.executor = queue
    except (ImportError, AttributeError, TypeError):
        return
    _thread.synchronous = synchronous
    _thread.promised = {}


def _wait():
    """Wait for the queued ops and return to synchronous execution: the
    queue's failure (cleared) or None, and the nodes held meanwhile."""
    synchronous = _thread.synchronous
    _thread.synchronous, _thread.promised = None, {}
    held, _thread.held = getattr(_thread, "held", []), []
    try:
        _thread.queue.wait()
    except Exception as error:
        _thread.queue.clear_error()
        return error, held
    finally:
        _eager()[0].context().executor = synchronous
    return None, held


def end():
    """Wait for the queued ops and return to synchronous execution.  An
    error of a queued op is raised here: the error of a held node's run
    anew (``rerun``), else the queue's own, with a note."""
    if not active():
        return
    # The operands held for the queued programs that ran (a scope's
    # recorded graph) are dropped at the next end(), before it waits:
    # freeing them after the wait kept the other core idle, 4.7 ms of a
    # 256-tree inference's 71 (BENCHMARKS.md).
    _thread.spent = None
    failed, held = _wait()
    if failed is None:
        _thread.spent = held
        return
    if held:
        for _, operands in held:
            _native.restore(operands)
        rerun([node for nodes, _ in held for node in nodes])   # (raises, as a rule)
    failed.add_note(
        "subgraphjit: this error is from an operation run asynchronously "
        "(since the last tape.gradient, the backward and the optimizer "
        "update overlap the next minibatch's recording; in inference, a "
        "scope's first part runs while the rest records); "
        "set_parameter('overlap', False) runs every operation where it is "
        "called.")
    raise failed


def drop_later(garbage):
    """Keep ``garbage`` (a scope's last nodes, read by nothing once its
    queued program ran) alive until the next ``end()`` drops it with the
    held nodes, before it waits: freed where the close's wait would have
    left the thread idle, not after it.  Only right after an ``end()``
    that saw the queue run: the next one that waits drops it."""
    spent = getattr(_thread, "spent", None)
    if spent is not None:
        spent.append(garbage)


def discard():
    """As ``end()``, but the queue's failure is dropped: for a queue that
    held only the ops of an evaluation about to run anew, step by step,
    where they fail again and name the user's line."""
    if active():
        _wait()


@contextlib.contextmanager
def in_place():
    """Run the block's ops where they are called, not queued, without
    waiting for the queue: for ops that read nothing queued (a spec's
    inference on stand-ins).  An op that fails on the queue poisons it,
    and every later op of the thread with it, until ``end()``."""
    synchronous = getattr(_thread, "synchronous", None)
    if synchronous is None:
        yield
        return
    current = _eager()[0].context()
    current.executor = synchronous
    try:
        yield
    finally:
        current.executor = _thread.queue


def hold(nodes, operands):
    """Keep the ``operands`` ``nodes`` dropped (``_native.write_back`` with
    ``keep``: they were given rows of buffers still queued) until
    ``end()``."""
    if not active():
        raise RuntimeError("overlap.hold: nothing is queued")
    _thread.held = getattr(_thread, "held", [])
    _thread.held.append((nodes, operands))


def holding():
    """Whether nodes with rows of queued buffers wait for ``end()``."""
    return bool(getattr(_thread, "held", None))


# What ``end()`` runs when the queue failed while holding nodes: their
# evaluation anew, synchronously and step by step (evaluate.py installs it).
rerun = None


def promise(tensor, shape):
    """``tensor`` (queued) will have ``shape``: ``shape_of`` answers without
    waiting.  Kept until ``end()`` (the entry holds the tensor, so its id
    is not reused meanwhile)."""
    if active():
        if not isinstance(shape, tf.TensorShape):
            shape = tf.TensorShape(shape)
        _thread.promised[id(tensor)] = (tensor, shape)


def shape_of(tensor):
    """A tensor's shape: promised, else its own (which waits for it)."""
    promised = getattr(_thread, "promised", None)
    if promised:
        entry = promised.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1]
    return tensor.shape


def host_tensor(array):
    """A NumPy array as a tensor in host memory, made without an op.
    ``tf.constant`` runs one (its copy to the default device), which
    while ops are queued is queued too and wakes the queue's thread: the
    first after a while took 100 us, against 2-35 us for this (a program
    call's index arrays, BENCHMARKS.md).  Where a GPU or a ``tf.device``
    scope could place the constant elsewhere, ``tf.constant`` as before."""
    host = _host_device()
    if host is None or _eager()[0].context().device_name:
        return tf.constant(array)
    return _EagerTensor(array, host, _datatype(array.dtype))


@functools.cache
def _datatype(numpy_dtype):
    """TensorFlow's DataType number of a NumPy dtype."""
    return tf.as_dtype(numpy_dtype).as_datatype_enum


@functools.cache
def cpu_only():
    """Whether this process's TensorFlow has no GPU."""
    return not tf.config.list_logical_devices("GPU")


@functools.cache
def _host_device():
    """The CPU's device name, where it is the only device; else None."""
    if _EagerTensor is None or not cpu_only():
        return None
    return tf.config.list_logical_devices("CPU")[0].name


def call(concrete, tensors, rewrite=True):
    """``concrete(*tensors)`` without checking the tensors' shapes, which
    the caller guarantees (a plain call waits for queued ones), and the
    outputs' shapes promised.  ``rewrite=False``: TensorFlow's graph
    rewrites (Grappler) are skipped where the function is first called
    (``unrewritten``).  Called again, the function runs as the one op
    its plain call ends in (``_DirectCall``)."""
    call_flat = getattr(concrete, "_call_flat", None)
    if call_flat is None:
        return concrete(*tensors)
    direct = _direct.get(concrete, _UNSEEN)
    if direct is not None and direct is not _UNSEEN:
        outputs = direct(tensors, rewrite)
        if outputs is not None:
            return outputs
    with contextlib.nullcontext() if rewrite else unrewritten():
        outputs = call_flat(list(tensors), concrete.captured_inputs)
    if active():
        traced = tf.nest.flatten(concrete.structured_outputs, expand_composites=True)
        for tensor, symbolic in zip(tf.nest.flatten(outputs, expand_composites=True), traced):
            promise(tensor, symbolic.shape)
    if direct is _UNSEEN:
        _direct[concrete] = _DirectCall.of(concrete)
    return outputs


_direct = weakref.WeakKeyDictionary()   # concrete function -> _DirectCall or None
_UNSEEN = object()   # (not called yet)


class _DirectCall:
    """A concrete function run as the one op TensorFlow's own call of it
    ends in: the same function, by the same op, with the same call
    attributes, where no tape can record (else the plain call records it).
    TensorFlow's Python layers around that op took 0.1-0.2 ms a call.  (Its
    modules are private: where they change, ``of`` gives None and calls
    are plain.)"""

    @classmethod
    def of(cls, concrete):
        if _pywrap_tfe is None:
            return None
        try:
            function = concrete._inference_function
            outputs = function.function_type.flat_outputs
            if any(output.dtype._handle_data for output in outputs):
                return None   # (which the plain call sets on its outputs)
            # Captures fixed at the trace (a variable's handle, a constant)
            # are flattened once, not at each call (about 16 us of a call's
            # 50 around TensorFlow's execute, in a 25-tree inference).  One
            # a callable gives at each call is still asked each time.
            fixed = (None if any(callable(value) for value in concrete._captured_inputs)
                     else concrete.captured_inputs)
            # A function that returns a list of tensors (each program's)
            # returns the op's outputs as they are: TensorFlow's packing
            # of them took 16 us of each call in a 25-tree inference
            # (BENCHMARKS.md).
            structure = concrete.structured_outputs
            listed = (type(structure) is list and len(structure) == len(outputs)
                      and all(isinstance(item, tf.Tensor) for item in structure))
            return cls(concrete, function, [output.shape for output in outputs], fixed,
                       listed)
        except (AttributeError, TypeError):
            return None

    def __init__(self, concrete, function, shapes, captured=None, listed=False):
        self.concrete = weakref.ref(concrete)
        self.function, self.name = function, function.name.decode()
        self.shapes = shapes   # each output's, as traced (``promise``)
        self.captured = captured   # the captured inputs, or None: asked at each call
        self.listed = listed   # the outputs are a list of tensors: given as the op's
        self.options = None   # the thread's call options the attributes are of
        self.attributes = None

    def __call__(self, tensors, rewrite):
        """The outputs, or None where the plain call must run."""
        current = _eager()[0].context()
        if not current.executing_eagerly():
            return None
        captured = self.captured
        arguments = [*tensors, *(self.concrete().captured_inputs if captured is None
                                 else captured)]
        # Where a tape or accumulator could record the call (as the plain
        # call asks), the plain call records it.
        recorded = (not _pywrap_tfe.TFE_Py_TapeSetIsStopped()
                    and _pywrap_tfe.TFE_Py_TapeSetPossibleGradientTypes(arguments))
        if recorded or _cancellation.context() is not None:
            return None
        if current.function_call_options is not self.options:
            self.options = current.function_call_options
            self.attributes = [self._attributes(current, False),
                               self._attributes(current, True)]
        flat = _execute.quick_execute(self.name, len(self.shapes), arguments,
                                      self.attributes[rewrite], current)
        if active():
            for tensor, shape in zip(flat, self.shapes):
                promise(tensor, shape)
        return list(flat) if self.listed else self.function.function_type.pack_output(flat)

    @staticmethod
    def _attributes(current, rewrite):
        with contextlib.nullcontext() if rewrite else unrewritten():
            options = current.function_call_options.as_attrs()
        return tuple(item for pair in options.items() for item in pair)


@contextlib.contextmanager
def unrewritten():
    """Functions first called in the block skip Grappler, TensorFlow's
    graph rewrites, which it runs once per function, at its first call.
    A compiled program's loop gains nothing measurable from them, and they
    took 0.2-0.3 s of each program's first call (BENCHMARKS.md).  The
    thread's other call options stay the caller's.  (The call options have
    no public API; where they change, functions are rewritten as usual.)"""
    try:
        from tensorflow.core.protobuf import config_pb2
        current = _eager()[0].context()
        given = current.function_call_options
        key = (given.executor_type, given.config_proto_serialized)
        options = _unrewritten.get(key)
        if options is None:
            config = config_pb2.ConfigProto.FromString(given.config_proto_serialized)
            config.graph_options.rewrite_options.disable_meta_optimizer = True
            options = _unrewritten[key] = type(given)(given.executor_type, config)
        current.function_call_options = options
    except (ImportError, AttributeError, TypeError):
        yield
        return
    try:
        yield
    finally:
        current.function_call_options = given


# Call options without Grappler, per the caller's (executor type, serialized
# config).
_unrewritten = {}
