"""The drop-in namespace: patched wrappers where the op table has an entry,
TensorFlow's own objects everywhere else.

``install`` fills ``subgraphjit`` and modules ``subgraphjit.nn``,
``subgraphjit.math`` and ``subgraphjit.linalg`` with the generated wrappers,
under every public name TensorFlow gives the same function (``tf.add``,
``tf.math.add``), and puts the operator overloads on VirtualNode.  Every
other attribute is the real module's, so ``tf.Variable``,
``tf.random.normal``, ``tf.keras.layers``... are TensorFlow's own, except
``tf.keras.optimizers``' classes: subclasses whose update is one compiled
call (``optimizers.py``), and ``tf.function``, whose functions record their
body when given nodes (``functions.py``).
"""

import sys
import types

import tensorflow as tf

from .. import _native
from ..ir.node import VirtualNode
from ..ir.record import build_entry_functions, record
from ..ir.spec import NotLazy
from ..ir.table import ALL_ENTRIES, GETITEM, OPERATOR_ENTRIES, OPERATORS, TF_ENTRIES
from . import dispatch, functions, layers, optimizers
from .fast import FAST

# Submodules that hold patched functions; each gets a module of ours
# (mirror: the rest its TensorFlow module's names).
PATCHED_SUBMODULES = ("math", "nn", "linalg")

WRAPPERS = {entry.name: build_entry_functions(entry, entry.name.rsplit(".", 1)[-1],
                                              FAST.get(entry.name))
            for entry in ALL_ENTRIES}


def mirror(target, real):
    """Put every attribute of the module ``real`` that ``target`` lacks in
    ``target``'s own dict, so that Python looks ``tf.matmul`` up as fast as
    a plain module's attribute.  A module whose dict holds a
    ``__getattr__`` (PEP 562) is never specialized by Python 3.11's
    attribute caches: ``tf.matmul`` took 35 ns against 14, some 300 times
    a Tree-LSTM tree.  So ``target`` forwards the rest only where ``real``
    has a ``__getattr__`` of its own (TensorFlow 2.21's modules have none)."""
    names = vars(target)
    for name, value in vars(real).items():
        names.setdefault(name, value)
    if "__getattr__" in vars(real):
        names["__getattr__"] = lambda name: getattr(real, name)


class ForwardingModule(types.ModuleType):
    """A module whose own attributes are set and the rest forwarded, for a
    module whose attributes cannot be read at import: ``tf.keras`` (a lazy
    loader, which reading would import Keras).  The forwarding is the
    module's own ``__getattr__`` (PEP 562), asked only for a name the
    module lacks."""

    def __init__(self, name, real):
        super().__init__(name, real.__doc__)
        self._real = real
        self.__getattr__ = self._forwarded

    def _forwarded(self, attribute):
        return getattr(self._real, attribute)

    def __dir__(self):
        return sorted(set(dir(self._real)) | (set(self.__dict__) - {"__getattr__"}))


class _KerasOptimizers(ForwardingModule):
    """``tf.keras.optimizers``: each optimizer class our compiled-update
    subclass of it (``optimizers.py``)."""

    def _forwarded(self, attribute):
        value = getattr(self._real, attribute)
        if optimizers.is_optimizer_class(value):
            return optimizers.compiled_update_class(value)
        return value


def _patch_module(target, real, replacements):
    """Set on ``target`` every public name of ``real`` that is replaced."""
    for attribute in dir(real):
        if attribute.startswith("_"):
            continue
        try:
            original = getattr(real, attribute)
        except Exception:  # lazily loaded TensorFlow attributes may fail
            continue
        replacement = replacements.get(id(original))
        if replacement is not None and replacement[0] is original:
            setattr(target, attribute, replacement[1])


def install(package, special_wrappers):
    """Fill ``package`` (the subgraphjit module) and its patched submodules.

    ``special_wrappers`` maps TensorFlow functions that need more than a
    table entry (tf.shape, tf.nn.dropout) to their replacements.
    """
    replacements = {id(entry.fn): (entry.fn, WRAPPERS[entry.name])
                    for entry in TF_ENTRIES}
    for original, replacement in special_wrappers.items():
        replacements[id(original)] = (original, replacement)
    _patch_module(package, tf, replacements)
    for name in PATCHED_SUBMODULES:
        module = types.ModuleType(f"{package.__name__}.{name}", getattr(tf, name).__doc__)
        _patch_module(module, getattr(tf, name), replacements)
        mirror(module, getattr(tf, name))
        sys.modules[module.__name__] = module
        setattr(package, name, module)
    keras = ForwardingModule(f"{package.__name__}.keras", tf.keras)
    keras.optimizers = _KerasOptimizers(f"{keras.__name__}.optimizers", tf.keras.optimizers)
    package.keras = keras
    package.function = functions.function   # a user's tf.function records its body
    mirror(package, tf)   # (last: TensorFlow's objects where ours are not)
    _install_operators()
    dispatch.install(special_wrappers)  # TensorFlow's own functions record too
    layers.install()   # and Keras layers known to be row-wise (dropin/layers.py)


def _install_operators():
    # The arithmetic operators are VirtualNode's C slots (native/_native.c:
    # no Python frame per op); the comparisons are methods here.
    native = {}
    for dunder in OPERATORS:
        entry = OPERATOR_ENTRIES[dunder]
        if dunder in _COMPARISONS:
            setattr(VirtualNode, dunder, _comparison_method(entry))
        else:
            native[dunder] = (entry, _computed_now(entry))
    _native.set_operators(native, NotLazy)
    VirtualNode.__getitem__ = _getitem_method


_COMPARISONS = ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__")


def _computed_now(entry):
    """An operator whose operand the recorder cannot describe runs on the
    node's value, now."""
    function = entry.fn

    def computed_now(*operands):
        return function(*(operand.value() if type(operand) is VirtualNode else operand
                          for operand in operands))
    computed_now.__name__ = entry.fn.__name__
    return computed_now


def _comparison_method(entry):
    function = entry.fn
    if entry.name in ("operator.eq", "operator.ne"):
        def method(self, other):
            if other is None:  # as tf.Tensor: comparing with None is not an op
                return entry.name == "operator.ne"
            try:
                return record(entry, (self, other), ())
            except NotLazy:
                return function(self.value(), other)
    else:
        def method(self, other):
            try:
                return record(entry, (self, other), ())
            except NotLazy:
                return function(self.value(), other)
    method.__name__ = entry.fn.__name__
    return method


def _getitem_method(self, slice_spec):
    try:
        return record(GETITEM, (self,), (slice_spec,))
    except NotLazy:
        return self.value()[slice_spec]
