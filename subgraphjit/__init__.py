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

__version__ = "0.1.0"

try:
    import tensorflow as _tf
except ImportError as _error:
    # Without TensorFlow only the parts that need none import: the PQ tree
    # and the row layout (subgraphjit.batcher.pqtree, .layout).  Every
    # attribute of the drop-in module says what is missing.
    _tf, _missing = None, _error
else:
    from . import api as _api
    from .api import (ForcedEvaluationWarning, GradientTape, access, batching, build,
                      get_parameter, patterns, reset_patterns, reset_stats,
                      set_parameter, stats)
    from .dropin import namespace as _namespace
    from .ir.node import VirtualNode

    _namespace.install(_sys.modules[__name__],
                       {_tf.shape: _api.shape, _tf.nn.dropout: _api.dropout})

    # TensorFlow's modules are hundreds of thousands of long-lived objects;
    # moving them out of the cyclic collector's sight keeps its sweeps,
    # which recording many small nodes triggers often, proportional to our
    # objects, not TF's.
    _gc.freeze()


if _tf is None:
    def __getattr__(name):
        # (An AttributeError, so that ``from subgraphjit import batcher``
        # still imports the subpackage.)
        raise AttributeError(
            f"module 'subgraphjit' has no attribute {name!r}: TensorFlow "
            f"did not import ({_missing}); pip install tensorflow-cpu") from _missing
