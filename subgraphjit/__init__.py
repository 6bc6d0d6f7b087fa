"""subgraphjit: ``import subgraphjit as tf`` makes eager TensorFlow lazy.

Every public attribute of ``tensorflow`` is reachable here.  The ops in the
op table (``subgraphjit.ir.table``) record VirtualNodes instead of
computing; everything else is TensorFlow's own object.  Recorded work is
evaluated by ``build``, by leaving a ``batching()`` or ``GradientTape()``
block, or whenever a value is needed (``.numpy()``, ``float()``, printing,
an op outside the table).
"""

import gc as _gc
import sys as _sys

import tensorflow as _tf

from . import api as _api
from .api import (GradientTape, access, batching, build, get_parameter,
                  patterns, reset_patterns, reset_stats, set_parameter, stats)
from .dropin import namespace as _namespace
from .ir.node import VirtualNode

__version__ = "0.1.0"

_namespace.install(_sys.modules[__name__],
                   {_tf.shape: _api.shape, _tf.nn.dropout: _api.dropout})


# TensorFlow's modules are hundreds of thousands of long-lived objects; moving
# them out of the cyclic collector's sight keeps its sweeps, which recording
# many small nodes triggers often, proportional to our objects, not TF's.
_gc.freeze()


def __getattr__(name):
    return getattr(_tf, name)


def __dir__():
    return sorted(set(dir(_tf)) | set(globals()))
