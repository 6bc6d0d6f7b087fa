"""A user's ``tf.function`` called with VirtualNodes records its body
(issue 16, part 3).

TensorFlow's ``Function.__call__`` converts its arguments to tensors, so a
node given to a user's ``@tf.function`` cell was evaluated at every call (a
forced evaluation per tree node): nothing batched.  Under subgraphjit,
``tf.function`` returns TensorFlow's own ``Function`` whose calls with a
node, while recording lazily and executing eagerly, run the decorated
Python function itself on the nodes.  Its ops record as any other code's
do, so the body is what the pattern search finds as the frequent subgraph
(the framework's unit of work becomes ours without being told), calls
across a minibatch's instances run as one batched launch, and a compiled
program runs them with the rest of the minibatch.

Every other call is TensorFlow's own: no node among the arguments, eager
mode, inside another ``tf.function``'s trace, or arguments that the
function's ``input_signature`` does not accept (TensorFlow's call then
raises its own error).  The object stays TensorFlow's ``Function``
(``get_concrete_function``, saving, ``python_function``, methods), of a
subclass that only changes ``__call__``.

What differs from a traced call, as under
``tf.config.run_functions_eagerly(True)``: the body's Python runs at every
call (a ``print`` prints per call, not per trace), and Python control flow
on a tensor's value reads the value (a counted forced evaluation) where
AutoGraph would have built a ``tf.cond`` or ``tf.while_loop``.
"""

import functools

import tensorflow as tf

from ..context import context
from ..ir.node import VirtualNode

try:   # TensorFlow's class of the objects tf.function returns (no public name)
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import (
        Function as _TFFunction)
except ImportError:   # then tf.function stays TensorFlow's own
    _TFFunction = None


def _holds_node(structure):
    return any(type(item) is VirtualNode for item in tf.nest.flatten(structure))


def _accepted(signature, args, kwargs):
    """Whether ``input_signature`` (None: any arguments) accepts the
    arguments as given, nodes checked by dtype and shape as TensorFlow
    checks tensors."""
    if signature is None:
        return True
    flat_specs, flat_args = tf.nest.flatten(signature), tf.nest.flatten(args)
    if kwargs or len(flat_specs) != len(flat_args):
        return False
    return all(type(value) is not VirtualNode or (
        isinstance(spec, tf.TensorSpec) and spec.dtype == value.dtype
        and spec.shape.is_compatible_with(value.shape))
        for spec, value in zip(flat_specs, flat_args))


if _TFFunction is not None:
    class RecordingFunction(_TFFunction):
        """TensorFlow's ``Function``; called with nodes while recording, the
        decorated Python function runs on them (see the module docstring).
        Bound methods keep this class: TensorFlow makes them with
        ``type(function)(...)``."""

        def __call__(self, *args, **kwargs):
            if (context.lazy and _holds_node((args, kwargs)) and tf.executing_eagerly()
                    and _accepted(self.input_signature, args, kwargs)):
                return self.python_function(*args, **kwargs)
            return super().__call__(*args, **kwargs)


@functools.wraps(tf.function)
def function(func=None, *args, **kwargs):
    if func is None:   # @tf.function(jit_compile=True) and the like
        return lambda inner: function(inner, *args, **kwargs)
    result = tf.function(func, *args, **kwargs)
    if _TFFunction is not None and type(result) is _TFFunction:
        result.__class__ = RecordingFunction
    return result
