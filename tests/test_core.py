"""The drop-in contract: evaluation triggers, scopes, gradients, parameters,
statistics, fallbacks, deep graphs and memory."""

import gc
import os
import subprocess
import sys
import types
import weakref

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import VirtualNode


def random_constant(*shape, seed=0):
    return tensorflow.constant(
        np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_ops_record_nodes_with_known_specs_and_build_evaluates():
    x = random_constant(3, 4)
    y = tf.sigmoid(tf.matmul(x, x, transpose_b=True)) * 2.0
    assert type(y) is VirtualNode and y.result is None
    assert y.shape == (3, 3) and y.dtype == tf.float32
    value = tf.build(y)
    expected = tensorflow.sigmoid(tensorflow.matmul(x, x, transpose_b=True)) * 2.0
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-6)


def test_build_takes_nested_structures_and_keeps_other_leaves():
    x = random_constant(2, 2)
    built = tf.build({"a": [tf.exp(x), 3], "b": (x, tf.tanh(x)), "c": None})
    assert isinstance(built["a"][0], tensorflow.Tensor)
    assert built["a"][1] == 3 and built["c"] is None and built["b"][0] is x
    np.testing.assert_allclose(built["b"][1].numpy(), np.tanh(x.numpy()), rtol=1e-6)


def test_values_are_evaluated_implicitly_when_python_needs_them():
    x = tensorflow.constant([[1.5, -2.0]])
    assert float(tf.reduce_sum(x)) == pytest.approx(-0.5)
    assert int(tf.reduce_max(tf.cast(x, tf.int32))) == 1
    assert bool(tf.reduce_all(x > -3.0)) is True
    np.testing.assert_allclose(tf.abs(x).numpy(), [[1.5, 2.0]])
    np.testing.assert_allclose(np.asarray(tf.negative(x)), [[-1.5, 2.0]])
    assert "1.5" in repr(tf.identity(x)) and "1.5" in str(tf.identity(x))
    assert f"{tf.reduce_sum(x):.2f}" == "-0.50"
    node = tf.identity(x)
    assert len(node) == 1 and node.ndim == 2 and node.result is None  # static
    assert [row.shape for row in tf.identity(x)] == [(2,)]
    assert tf.is_tensor(node)


def test_a_node_in_a_library_message_shows_its_shape_and_dtype_not_its_values():
    tf.reset_stats()
    x = tf.tanh(random_constant(40, 40))
    with pytest.raises(ValueError) as raised:
        tf.nest.assert_same_structure([x, x], [x])   # TensorFlow prints both
    message = str(raised.value)
    assert "shape=(40, 40), dtype=float32, not evaluated" in message
    assert "numpy=" not in message and "array(" not in message
    assert not x.evaluated and tf.stats()["forced_evaluations"] == {}
    # Evaluated, it prints as the tensor it is, wherever it is printed.
    tf.build(x)
    with pytest.raises(ValueError) as raised:
        tf.nest.assert_same_structure([x, x], [x])
    assert "not evaluated" not in str(raised.value)
    assert "<tf.Tensor: shape=(40, 40), dtype=float32, numpy=" in str(raised.value)
    # The user's own printing always shows values, as eagerly.
    y = tf.tanh(random_constant(2, 2))
    assert "not evaluated" not in repr(y) and y.evaluated


def test_batching_scope_evaluates_everything_recorded_inside():
    x = random_constant(2, 3)
    with tf.batching():
        kept = [tf.tanh(x), tf.exp(x)]
        dropped_on_the_floor = tf.sigmoid(x)
    # (Evaluated: a result of its own, or a row of a batched one.)
    assert all(node.evaluated for node in kept)
    assert dropped_on_the_floor.evaluated


def test_batching_scope_does_not_evaluate_when_the_block_raises():
    x = random_constant(2, 3)
    with pytest.raises(RuntimeError):
        with tf.batching():
            node = tf.tanh(x)
            raise RuntimeError("user error")
    assert node.result is None
    assert tf.build(node) is not None  # and the scope stack is closed again


@pytest.mark.parametrize("scope", ["batching", "GradientTape"])
@pytest.mark.parametrize("raises", [False, True])
def test_scopes_pause_the_cyclic_collector_until_their_evaluation_ends(scope, raises):
    """Off while a scope records and its nodes are evaluated (else it
    sweeps the growing graph), back on after, also when the block or the
    evaluation raises; left off if the user had turned it off."""
    x = random_constant(2, 3)
    seen = []

    def evaluated(*arguments, **keywords):
        seen.append(gc.isenabled())
        return evaluate(*arguments, **keywords)

    from subgraphjit import api
    evaluate = api.evaluate
    api.evaluate = evaluated
    try:
        for user_collector in (True, False):
            (gc.enable if user_collector else gc.disable)()
            seen.clear()
            try:
                with getattr(tf, scope)():
                    assert not gc.isenabled()
                    node = tf.tanh(x)
                    if raises:
                        raise RuntimeError("user error")
            except RuntimeError:
                assert raises
            assert gc.isenabled() is user_collector
            assert seen == ([] if raises else [False])
            if not raises:
                assert node.evaluated
    finally:
        api.evaluate = evaluate
        gc.enable()


def test_gradients_flow_through_build_inside_the_callers_tape():
    w_eager = tensorflow.Variable(random_constant(4, 2, seed=1))
    w_lazy = tensorflow.Variable(w_eager)
    x = random_constant(3, 4)
    gradients = []
    for module, w in ((tensorflow, w_eager), (tf, w_lazy)):
        with module.GradientTape() as tape:
            loss = module.reduce_mean(module.tanh(module.matmul(x, w)) ** 2)
            if hasattr(module, "build"):
                loss = module.build(loss)
        gradients.append(tape.gradient(loss, w))
    np.testing.assert_allclose(gradients[1].numpy(), gradients[0].numpy(),
                               rtol=1e-5, atol=1e-7)


def test_tape_evaluates_on_exit_when_the_user_never_calls_build():
    w = tensorflow.Variable(random_constant(4, 2, seed=2))
    x = random_constant(3, 4)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w))
    assert type(loss) is VirtualNode and loss.result is not None
    gradient = tape.gradient(loss, w)
    np.testing.assert_allclose(gradient.numpy(),
                               np.repeat(x.numpy().sum(0)[:, None], 2, 1),
                               rtol=1e-5)


def test_variables_are_read_when_evaluated():
    w = tensorflow.Variable([[1.0]])
    node = tf.matmul([[2.0]], w)
    w.assign([[5.0]])  # between recording and evaluation: the new value is used
    assert float(tf.reduce_sum(node)) == 10.0


def test_deep_chain_evaluates_without_recursion():
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        value = tensorflow.Variable(0.0)
        with tf.GradientTape() as tape:
            node = value
            for _ in range(10_000):
                node = node + 1.0
            total = tf.build(node * 1.0)
        gradient = tape.gradient(total, value)
    finally:
        sys.setrecursionlimit(limit)
    assert float(total) == 10_000.0 and float(gradient) == 1.0


def test_multi_output_ops_return_lists_and_access():
    x = random_constant(4, 6)
    parts = tf.split(x, [1, 2, 3], axis=1)
    assert [p.shape for p in parts] == [(4, 1), (4, 2), (4, 3)]
    np.testing.assert_allclose(tf.access(parts, 2).numpy(), x.numpy()[:, 3:])


def test_errors_at_evaluation_name_the_users_line():
    table = random_constant(3, 2)
    indices = tf.identity([7])  # a node: its value is unknown when recorded
    lookup = tf.gather(table, indices)
    line = sys._getframe().f_lineno - 1
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        tf.build(lookup)
    assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)


def test_bad_concrete_indices_raise_when_recorded():
    with pytest.raises(tensorflow.errors.InvalidArgumentError):
        tf.gather(random_constant(3, 2), [7])


def test_shape_errors_raise_tensorflows_class_at_the_users_line():
    x = random_constant(2, 3)
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        tf.matmul(x, x)
    line = sys._getframe().f_lineno - 1
    assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)


def test_ops_outside_the_table_fall_back_visibly():
    tf.reset_stats()
    import keras
    node = tf.tanh(random_constant(2, 3))
    # A layer not known to be row-wise evaluates (Dense records: test_layers.py).
    layer_output = keras.layers.Dropout(0.5)(node, training=True)
    # A random op outside the table evaluates (others record: test_dispatch.py).
    shuffled = tf.random.shuffle(tf.tanh(random_constant(2, 3)))
    assert layer_output.shape == (2, 3) and shuffled.shape == (2, 3)
    forced = tf.stats()["forced_evaluations"]
    assert sum(forced.values()) == 2
    assert any(name.startswith("tf.keras.layers.Dropout.__call__")
               for name in forced), forced
    assert any(name.startswith("tf.random.shuffle") for name in forced), forced


def test_stats_count_recording_and_evaluation():
    tf.reset_stats()
    x = random_constant(2, 2)
    nodes = [tf.exp(x) for _ in range(5)]
    tf.build(nodes)
    stats = tf.stats()
    assert stats["nodes_recorded"] == 5 and stats["nodes_evaluated"] == 5
    assert stats["evaluations"] == 1 and stats["evaluate_seconds"] > 0
    tf.reset_stats()
    assert tf.stats()["nodes_recorded"] == 0


def test_eager_mode_runs_every_op_through_tensorflow():
    tf.set_parameter("mode", "eager")
    try:
        result = tf.matmul(random_constant(2, 3), random_constant(3, 2))
        assert isinstance(result, tensorflow.Tensor)
    finally:
        tf.set_parameter("mode", "lazy")
    assert type(tf.exp(random_constant(1))) is VirtualNode


def test_parameters_are_validated_with_helpful_errors():
    tf.set_parameter("depth", 4)
    assert tf.get_parameter("depth") == 4
    tf.set_parameter("depth", 8)
    with pytest.raises(ValueError, match="(?s)did you mean 'depth'.*'freq'.*'collect'"):
        tf.set_parameter("deepth", 3)
    with pytest.raises(ValueError, match="not a valid value for parameter 'depth'"):
        tf.set_parameter("depth", 0)
    with pytest.raises(ValueError, match="'mode'"):
        tf.get_parameter("nope")


def test_environment_variables_set_parameters():
    code = "import subgraphjit as tf; print(tf.get_parameter('depth'))"
    environment = dict(os.environ, SUBGRAPHJIT_DEPTH="5")
    output = subprocess.run([sys.executable, "-c", code], env=environment,
                            capture_output=True, text=True, check=True)
    assert output.stdout.strip().splitlines()[-1] == "5"
    environment["SUBGRAPHJIT_DEPTH"] = "zero"
    failed = subprocess.run([sys.executable, "-c", code], env=environment,
                            capture_output=True, text=True)
    assert failed.returncode != 0 and "SUBGRAPHJIT_DEPTH" in failed.stderr


def test_everything_in_tensorflow_is_reachable():
    for name in ("Variable", "keras", "random", "GradientTape", "function",
                 "constant", "float32", "nest", "data"):
        assert hasattr(tf, name), name
    assert tf.random is tensorflow.random
    # tf.keras forwards to Keras, except its optimizers (compiled updates)
    assert tf.keras.layers is tensorflow.keras.layers
    assert issubclass(tf.keras.optimizers.Adam, tensorflow.keras.optimizers.Adam)
    assert tf.keras.optimizers.schedules is tensorflow.keras.optimizers.schedules
    assert tf.add is tf.math.add and tf.nn.softmax is tf.math.softmax
    assert tf.nn.l2_normalize is tensorflow.nn.l2_normalize  # not in the table
    from subgraphjit.nn import relu  # the patched submodules are importable
    assert relu is tf.nn.relu
    assert "matmul" in dir(tf) and "relu" in dir(tf.nn)


def test_the_namespaces_hold_tensorflows_names_with_no_module_getattr():
    # A module ``__getattr__`` keeps Python from caching ``tf.matmul``'s
    # lookup: the names are copied instead (namespace.mirror).
    for module, real in ((tf, tensorflow), (tf.nn, tensorflow.nn),
                         (tf.math, tensorflow.math), (tf.linalg, tensorflow.linalg)):
        assert "__getattr__" not in vars(module), module
        missing = [name for name in vars(real) if name not in vars(module)]
        assert not missing, (module, missing)
    assert tf.__version__ != tensorflow.__version__   # ours kept
    assert tf.nn.embedding_lookup is not tensorflow.nn.embedding_lookup  # patched


def test_a_mirrored_module_with_its_own_getattr_forwards():
    from subgraphjit.dropin.namespace import mirror
    real, plain = types.ModuleType("real"), types.ModuleType("plain")
    real.present = 1
    target = types.ModuleType("target")
    target.present = 0
    mirror(target, plain)
    assert "__getattr__" not in vars(target)
    real.__getattr__ = lambda name: f"lazy {name}"
    mirror(target, real)
    assert target.present == 0 and target.anything == "lazy anything"


def test_tf_function_tracing_passes_patched_ops_through():
    traced = []

    @tensorflow.function
    def scaled_sigmoid(x):
        hidden = tf.sigmoid(x)
        traced.append(type(hidden))
        return hidden * 2.0

    x = random_constant(2, 2)
    np.testing.assert_allclose(scaled_sigmoid(x).numpy(),
                               2 / (1 + np.exp(-x.numpy())), rtol=1e-6)
    assert traced and VirtualNode not in traced  # TensorFlow's graph, not ours


def test_recorded_nodes_are_freed_after_evaluation():
    w = tensorflow.Variable(random_constant(3, 3))
    x = random_constant(1, 3)
    with tf.GradientTape() as tape:
        hidden = tf.tanh(tf.matmul(x, w))
        probe = weakref.ref(hidden)
        loss = tf.build(tf.reduce_sum(hidden))
    tape.gradient(loss, w)
    del hidden, tape
    gc.collect()
    assert probe() is None


def resident_megabytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux only")
def test_memory_stays_flat_over_thousands_of_minibatches():
    w = tensorflow.Variable(random_constant(8, 8))
    optimizer = tensorflow.keras.optimizers.SGD(0.01)
    x = random_constant(1, 8)

    def train_steps(count):
        for _ in range(count):
            with tf.GradientTape() as tape:
                h = x
                for _ in range(5):
                    h = tf.tanh(tf.matmul(h, w))
                loss = tf.build(tf.reduce_sum(h * h))
            optimizer.apply_gradients([(tape.gradient(loss, w), w)])

    train_steps(300)  # warm up allocator and caches
    gc.collect()
    before = resident_megabytes()
    train_steps(2000)
    gc.collect()
    grown = resident_megabytes() - before
    assert grown < 5, f"resident memory grew by {grown:.1f} MB"  # flat: ~0.02


def test_keras_variables_are_recorded_lazily_with_gradients():
    import keras
    weight = keras.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    x = random_constant(2, 3)
    tf.reset_stats()
    gradients = []
    for module in (tensorflow, tf):
        with tensorflow.GradientTape() as tape:
            node = module.tanh(module.matmul(module.sigmoid(x), weight))
            if module is tf:
                assert type(node) is VirtualNode
            loss = tf.build(module.reduce_sum(node))
        gradients.append(tape.gradient(loss, weight.value))
    assert tf.stats()["forced_evaluations"] == {}
    np.testing.assert_allclose(gradients[1].numpy(), gradients[0].numpy(), rtol=1e-5)


def test_dropout_records_at_the_users_line():
    """tf.nn.dropout records its multiply at the user's line, called through
    subgraphjit or through TensorFlow's dispatch."""
    x = tf.tanh(tensorflow.constant([[1.0, 2.0]]))
    here = sys._getframe().f_lineno
    through_ours = tf.nn.dropout(x, 0.5, seed=1)
    through_tensorflow = tensorflow.nn.dropout(x, 0.5, seed=1)
    for node, line in ((through_ours, here + 1), (through_tensorflow, here + 2)):
        assert type(node) is tf.VirtualNode
        assert node.site[0].co_filename == __file__ and node.site[1] == line
