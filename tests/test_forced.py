"""stats()["forced_evaluations"]: every evaluation a read forces, named by
the user's line (in this file) and what read the value, in the user's terms."""

import logging
import os
import pathlib

import keras
import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.ir import node as node_module

LINES = pathlib.Path(__file__).read_text().splitlines()
SHOWN = os.path.relpath(__file__)
SHOWN = __file__ if SHOWN.startswith(os.pardir) else SHOWN


def site(what, marker):
    """The key for ``what`` read on the line of this file ending in
    ``# forced: <marker>``."""
    (line,) = [number for number, text in enumerate(LINES, 1)
               if text.endswith(f"# forced: {marker}")]
    return f"{what} ({SHOWN}:{line})"


def fresh():
    """An unevaluated node: tanh(0.5)."""
    return tf.tanh(tf.constant(0.5))


def forced():
    return tf.stats()["forced_evaluations"]


def user_reads():
    """Each read of a fresh node forces an evaluation of its own."""
    if tf.reduce_max(fresh()) > 0.0:  # forced: if
        pass
    while tf.reduce_max(fresh()) < 0.0:  # forced: while
        break
    assert tf.reduce_max(fresh()) > -1.0  # forced: assert
    either = tf.reduce_max(fresh()) > 0.0 and 1  # forced: and
    negated = not tf.reduce_max(fresh())  # forced: not
    explicit = bool(tf.reduce_max(fresh()))  # forced: bool
    number = float(fresh())  # forced: float
    array = fresh().numpy()  # forced: numpy
    print(fresh())  # forced: print
    converted = np.asarray(fresh())  # forced: asarray
    text = f"{tf.reduce_max(fresh()):.3f}"  # forced: f-string
    logging.getLogger(__name__).warning("%s", fresh())  # forced: logging
    return either, negated, explicit, number, array, converted, text


def test_reads_are_named_by_the_users_line_and_words(capsys):
    tf.reset_stats()
    either, negated, explicit, number, array, converted, text = user_reads()
    assert forced() == {
        site("if", "if"): 1, site("while", "while"): 1,
        site("assert", "assert"): 1, site("and", "and"): 1,
        site("not", "not"): 1, site("bool()", "bool"): 1,
        site("float()", "float"): 1, site(".numpy()", "numpy"): 1,
        site("print()", "print"): 1, site("np.asarray()", "asarray"): 1,
        site("f-string", "f-string"): 1,
        site("logging.Logger.warning", "logging"): 1}
    # The values are eager TensorFlow's.
    expected = np.tanh(np.float32(0.5))
    assert either == 1 and negated is False and explicit is True
    assert number == pytest.approx(expected) and text == f"{expected:.3f}"
    np.testing.assert_allclose(array, expected, rtol=1e-6)
    np.testing.assert_allclose(converted, expected, rtol=1e-6)
    assert "0.462" in capsys.readouterr().out


def test_reads_of_evaluated_nodes_are_not_counted():
    tf.reset_stats()
    built = fresh()
    tf.build(built)
    with tf.batching():
        first, second = fresh(), fresh()   # evaluated as rows of one batched result
    for node in (built, first, second):
        float(node), node.numpy(), np.asarray(node), str(node)
        tensorflow.py_function(lambda x: x, [node], tensorflow.float32)
    with tf.GradientTape():
        inside = fresh() * 2.0
    float(inside)
    assert forced() == {}


def test_counts_add_up_per_line():
    tf.reset_stats()
    node = fresh()
    for _ in range(3):
        float(fresh())  # forced: loop
        float(node)  # forced: first pass only
    assert forced() == {site("float()", "loop"): 3,
                        site("float()", "first pass only"): 1}


def test_tensorflow_functions_are_named_by_their_public_names():
    tf.reset_stats()
    variable = tensorflow.Variable(0.0)
    tensorflow.py_function(lambda x: x * 2, [fresh()], tensorflow.float32)  # forced: py_function
    variable.assign(fresh())  # forced: assign
    tf.nn.l2_normalize(tf.stack([fresh()]), axis=0)  # forced: l2_normalize
    keras.ops.convert_to_numpy(fresh())  # forced: keras op
    assert {site("tf.py_function", "py_function"), site("tf.Variable.assign", "assign"),
            site("tf.keras.ops.convert_to_numpy", "keras op")} <= set(forced())
    # l2_normalize may be recorded lazily (TensorFlow's dispatch); if it
    # forces, it is named as the user wrote it, not math.l2_normalize.
    assert set(forced()) <= {site("tf.py_function", "py_function"),
                             site("tf.Variable.assign", "assign"),
                             site("tf.keras.ops.convert_to_numpy", "keras op"),
                             site("tf.nn.l2_normalize", "l2_normalize")}
    np.testing.assert_allclose(variable.numpy(), np.tanh(0.5), rtol=1e-6)


def test_operators_on_real_tensors_are_named_by_the_operator():
    tf.reset_stats()
    tensor = tensorflow.constant(1.0)
    total = tensor + fresh()  # forced: +
    tensor *= fresh()  # forced: *=
    # TensorFlow's dispatch may record these lazily; a forced evaluation,
    # if any, is named by the operator, not TensorFlow's wrapper for it.
    assert set(forced()) <= {site("+", "+"), site("*=", "*=")}
    expected = np.tanh(np.float32(0.5))
    np.testing.assert_allclose(tf.build(total).numpy(), 1 + expected, rtol=1e-6)
    np.testing.assert_allclose(tf.build(tensor).numpy(), expected, rtol=1e-6)


def test_keras_layers_are_named_by_their_public_class():
    tf.reset_stats()
    layer = keras.layers.Dense(2)
    output = layer(tf.tanh(tf.constant([[0.5, 1.0]])))  # forced: dense
    # Dense may record lazily once its TensorFlow ops dispatch to nodes.
    assert set(forced()) <= {site("tf.keras.layers.Dense.__call__", "dense")}
    assert tuple(output.shape) == (1, 2)


GRAPH_INPUTS = None


def converted_by_autograph(x):
    tested, passed = GRAPH_INPUTS
    if tested > 0.0:  # forced: autograph if
        x = x + 1.0
    copy = tensorflow.py_function(tensorflow.identity, [passed], "float32")  # forced: graph call
    return x + copy


def test_autograph_frames_map_to_the_users_lines():
    global GRAPH_INPUTS
    tf.reset_stats()
    GRAPH_INPUTS = fresh(), fresh()
    function = tensorflow.function(converted_by_autograph)
    result = function(tensorflow.constant(1.0))
    assert forced() == {site("if", "autograph if"): 1,
                        site("tf.py_function", "graph call"): 1}
    assert float(result) == pytest.approx(2 + np.tanh(0.5))


def test_the_stack_is_walked_only_for_forced_evaluations(monkeypatch):
    walks = []
    real = node_module.forced_site
    monkeypatch.setattr(node_module, "forced_site",
                        lambda frame: walks.append(frame) or real(frame))
    nodes = [fresh() * 2.0 + 1.0 for _ in range(10)]
    tf.build(nodes)
    with tf.batching():
        more = [tf.exp(node) for node in nodes]
    float(nodes[0]), float(more[0])
    assert walks == []
    float(fresh())
    assert len(walks) == 1


def test_debug_output_names_the_forcing_read(capsys):
    tf.set_parameter("debug", True)
    try:
        float(fresh())  # forced: debug
    finally:
        tf.set_parameter("debug", False)
    assert f"forced by {site('float()', 'debug')}" in capsys.readouterr().err
