"""stats()["forced_evaluations"]: every evaluation a read forces, named by
the user's line (in this file) and what read the value, in the user's terms;
and the ForcedEvaluationWarning given when such reads split most of the work."""

import logging
import os
import pathlib
import warnings

import keras
import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import forced as forced_module
from subgraphjit.ir import node as node_module

LINES = pathlib.Path(__file__).read_text().splitlines()
SHOWN = os.path.relpath(__file__)
SHOWN = __file__ if SHOWN.startswith(os.pardir) else SHOWN


def line_of(marker):
    """The number of the line of this file ending in ``# forced: <marker>``."""
    (line,) = [number for number, text in enumerate(LINES, 1)
               if text.endswith(f"# forced: {marker}")]
    return line


def site(what, marker):
    """The key for ``what`` read on the line ending in ``# forced: <marker>``."""
    return f"{what} ({SHOWN}:{line_of(marker)})"


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


# -- ForcedEvaluationWarning ------------------------------------------------

WEIGHTS = tensorflow.Variable(np.full((2, 2), 0.3, np.float32))


@pytest.fixture
def op_granularity():
    """Batches counted op by op: no patterns, whatever other tests found;
    every scope recorded (a plain loop's scope, whose reads evaluate op by
    op, would run eagerly after a few: eager_scopes.py)."""
    previous = tf.get_parameter("granularity")
    tf.set_parameter("granularity", "op")
    tf.set_parameter("eager_scopes", False)
    tf.reset_stats()
    yield
    tf.set_parameter("granularity", previous)
    tf.set_parameter("eager_scopes", True)


def instance(k, layers=4):
    """One instance's work: two recorded ops per layer."""
    h = tf.constant([[0.1 * k, 0.2]])
    for _ in range(layers):
        h = tf.tanh(tf.matmul(h, WEIGHTS))
    return h


def read_in_each_instance(minibatches=2):
    """A read in per-instance code: each instance's work evaluates on its
    own.  (The share is judged once a scope has ended: in the second
    minibatch, here.)"""
    for _ in range(minibatches):
        with tf.batching():
            outputs = []
            for k in range(25):
                h = instance(k)
                if float(tf.reduce_max(h)) > 2.0:  # forced: per instance
                    h = -h
                outputs.append(h * 2.0)


def forced_warnings(run):
    """subgraphjit's warnings while ``run()`` runs; every warning is shown
    (``always``), so any repeat would be seen."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [warning for warning in caught
            if str(warning.message).startswith("subgraphjit:")]


def test_a_read_that_splits_most_work_is_warned_about_at_its_line(op_granularity):
    (warning,) = forced_warnings(read_in_each_instance)
    assert warning.category is tf.ForcedEvaluationWarning
    assert issubclass(tf.ForcedEvaluationWarning, UserWarning)
    read = site("float()", "per instance")
    assert (warning.filename, warning.lineno) == (__file__, line_of("per instance"))
    assert f"by {read}:" in str(warning.message)
    assert "tf.batching.map" in str(warning.message)
    stats = tf.stats()
    assert stats["forced_evaluations"] == {read: 50}
    assert 2 * stats["forced_batches"] > stats["batches"]


def read_before_little_work(minibatches=2):
    """A read in each instance, of one op; the rest, 48 ops an instance, is
    batched at the end.  (Judged inside the first scope, before its end
    evaluates the rest, the reads' share would seem all of it.)"""
    for _ in range(minibatches):
        with tf.batching():
            outputs = []
            for k in range(25):
                if float(tf.reduce_max(tf.constant([0.1 * k]))) > 2.0:  # forced: small
                    continue
                outputs.append(instance(k, layers=24))


def read_once_per_scope(minibatches=25):
    """``float(loss)`` at the end of each scope: forced, but it evaluates the
    whole minibatch, batched."""
    for _ in range(minibatches):
        with tf.batching():
            loss = tf.add_n([tf.reduce_sum(instance(k)) for k in range(4)])
            float(loss)  # forced: loss


def test_no_warning_when_forced_reads_split_little_work(op_granularity):
    assert forced_warnings(read_before_little_work) == []
    stats = tf.stats()
    assert stats["forced_evaluations"] == {site("float()", "small"): 50}
    assert 2 * stats["forced_batches"] < stats["batches"]   # split, a small share
    tf.reset_stats()
    assert forced_warnings(read_once_per_scope) == []
    stats = tf.stats()
    assert stats["forced_evaluations"] == {site("float()", "loss"): 25}
    assert stats["forced_batches"] == stats["batches"]   # all forced, none split


def test_the_warning_can_be_silenced(op_granularity):
    def silenced():
        warnings.simplefilter("ignore", tf.ForcedEvaluationWarning)
        read_in_each_instance()

    assert forced_warnings(silenced) == []
    assert tf.ForcedEvaluationWarning is forced_module.ForcedEvaluationWarning


def test_the_warning_is_given_once_per_reset_stats(op_granularity):
    assert len(forced_warnings(read_in_each_instance)) == 1
    assert forced_warnings(read_in_each_instance) == []
    tf.reset_stats()
    assert len(forced_warnings(read_in_each_instance)) == 1
