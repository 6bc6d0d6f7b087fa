"""Keras optimizers whose update is one compiled call.

Eagerly, a Keras optimizer's ``apply_gradients`` runs each variable's update
op by op: the SST Tree-LSTM's Adagrad update took 4.6 ms per minibatch of
25 trees eagerly and 1.9 ms as a tf.function (a tenth of the whole step).
So ``tf.keras.optimizers.<Name>`` under subgraphjit is a subclass of Keras's
own class (``isinstance`` holds, its variables, configuration and
checkpoints are Keras's) whose ``apply_gradients`` runs Keras's update
inside a tf.function, one concrete function per list of variables and
their gradients' types.  The first call, which
builds the optimizer's own variables, and calls with a ``None`` gradient or
inside the user's own tf.function stay as Keras runs them.

Adagrad's step for an ``IndexedSlices`` gradient (an embedding's looked-up
rows) also touches only those rows (``RowwiseAdagrad``): Keras adds epsilon
to the whole accumulator, takes its square root and searches it for zeros
and NaNs before gathering the rows it divides by, passes over the whole
vocabulary in every step.
"""

import inspect
import weakref

import tensorflow as tf

from .. import overlap

_SUBCLASSES = {}                                   # Keras class -> ours
_UPDATES = weakref.WeakKeyDictionary()   # optimizer -> {(variable ids, specs): concrete function}


class CompiledUpdate:
    """The mixin: ``apply_gradients`` as one compiled call."""

    def apply_gradients(self, grads_and_vars, *arguments, **options):
        pairs = list(grads_and_vars)
        gradients = [gradient for gradient, _ in pairs]
        variables = [variable for _, variable in pairs]
        if (arguments or options or not getattr(self, "built", False)
                or not tf.executing_eagerly()
                or any(gradient is None for gradient in gradients)):
            return super().apply_gradients(pairs, *arguments, **options)
        specs = [_spec(gradient, variable) for gradient, variable in pairs]
        tensors = [part for gradient in gradients for part in _parts(gradient)]
        wanted = tf.nest.flatten(specs, expand_composites=True)
        if any(spec is None for spec in specs) or not all(
                tensor.dtype == spec.dtype
                and spec.shape.is_compatible_with(overlap.shape_of(tensor))
                for tensor, spec in zip(tensors, wanted)):
            # Not a variable's gradient: Keras's own update says why.
            return super().apply_gradients(pairs, *arguments, **options)
        updates = _UPDATES.setdefault(self, {})
        key = (tuple(map(id, variables)), tuple(specs))
        update = updates.get(key)
        if update is None:
            keras_apply = super().apply_gradients

            # The variables are the same objects every call (their ids are
            # part of the key; the closure keeps them alive); gradients are
            # the arguments, an IndexedSlices' number of entries left open.
            def apply(gradients):
                return keras_apply(zip(gradients, variables))
            update = updates[key] = tf.function(
                apply, input_signature=[specs]).get_concrete_function()
        # A flat call: no shape checks (done above), which would wait for
        # gradients still queued (overlap.py).  Without TensorFlow's graph
        # rewrites (Grappler), which turn Keras's ``lr * g / sqrt(a + epsilon)``
        # into a product by ``rsqrt``: the variables get the bits of Keras's
        # eager step.
        return overlap.call(update, tensors, rewrite=False)


class RowwiseAdagrad:
    """Keras's Adagrad step for an ``IndexedSlices`` gradient, computed on
    its rows alone, with the same float operations in the same order on
    each element (so the same bits): the squares added into the
    accumulator, then each entry's ``lr * g`` divided by the square root
    of its accumulator row plus epsilon, read after every entry's square
    is in (duplicate indices as Keras treats them).  Keras searches the
    whole divisor for zeros and NaNs, where 0 / 0 would put NaN in rows no
    entry touches; with epsilon > 0 and an accumulator that starts at or
    above zero the divisor is never zero, and a NaN in it marks a row
    whose variable is NaN already.  Otherwise Keras's own step runs."""

    def update_step(self, gradient, variable, learning_rate):
        if not (isinstance(gradient, tf.IndexedSlices) and self.epsilon > 0
                and self.initial_accumulator_value >= 0):
            return super().update_step(gradient, variable, learning_rate)
        dtype = tf.as_dtype(variable.dtype)
        lr = tf.cast(learning_rate, dtype)
        values, indices = tf.cast(gradient.values, dtype), gradient.indices
        accumulator = self._accumulators[self._get_variable_index(variable)]
        self.assign_add(accumulator, tf.IndexedSlices(tf.square(values), indices,
                                                      gradient.dense_shape))
        # Each row's root, then gathered per entry, as Keras orders them.
        rows, entry_rows = tf.unique(indices)
        roots = tf.sqrt(_tf_variable(accumulator).sparse_read(rows)
                        + tf.constant(self.epsilon, dtype))
        self.assign_sub(variable, tf.IndexedSlices(
            tf.divide(lr * values, tf.gather(roots, entry_rows)), indices,
            gradient.dense_shape))


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable, as Keras's own assign finds it."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _parts(gradient):
    """A gradient's tensors, in its spec's order.  (``tf.nest.flatten``
    would ask an IndexedSlices for its shapes, which waits for them.)"""
    if isinstance(gradient, tf.IndexedSlices):
        parts = [gradient.values, gradient.indices]
        return parts if gradient.dense_shape is None else parts + [gradient.dense_shape]
    return [gradient]


def _spec(gradient, variable):
    """The type of a variable's gradient: dense of its shape, or an
    IndexedSlices of its rows (None: neither)."""
    dtype = tf.as_dtype(variable.dtype)
    if isinstance(gradient, tf.IndexedSlices):
        if not isinstance(gradient.indices, tf.Tensor):
            return None
        dense_shape = gradient.dense_shape
        return tf.IndexedSlicesSpec(
            variable.shape, dtype, gradient.indices.dtype,
            None if dense_shape is None else dense_shape.dtype, [None])
    if isinstance(gradient, tf.Tensor):
        return tf.TensorSpec(variable.shape, dtype)
    return None


def compiled_update_class(keras_class):
    """Our subclass of a Keras optimizer class (made once per class)."""
    ours = _SUBCLASSES.get(keras_class)
    if ours is None:
        from keras.optimizers import Adagrad
        bases = (CompiledUpdate, keras_class)
        if getattr(keras_class, "update_step", None) is Adagrad.update_step:
            bases = (CompiledUpdate, RowwiseAdagrad, keras_class)   # (not overridden)
        ours = _SUBCLASSES[keras_class] = type(
            keras_class.__name__, bases,
            {"__module__": __name__, "__doc__": keras_class.__doc__,
             "__qualname__": keras_class.__qualname__})
    return ours


def is_optimizer_class(value):
    from keras.optimizers import Optimizer
    return inspect.isclass(value) and issubclass(value, Optimizer) and value is not Optimizer
