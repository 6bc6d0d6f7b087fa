"""The drop-in surface: what makes ``import subgraphjit as tf`` behave as
TensorFlow.  It installs the IR's wrappers under TensorFlow's names
(namespace.py), makes TensorFlow's own functions record through its
dispatch (dispatch.py), records calls of row-wise Keras layers
(layers.py), and compiles Keras optimizers' updates (optimizers.py)."""
