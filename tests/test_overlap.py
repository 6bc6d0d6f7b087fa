"""The backward and the optimizer update run while the next minibatch
records (subgraphjit/overlap.py): training leaves every variable
where eager TensorFlow leaves it, a variable read in the asynchronous
stretch sees the update, and an error of an op run there is raised at the
next evaluation, saying why."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import overlap
from experiments.example_models import MODELS
from test_programs import compiled  # noqa: F401 (fixture)


def step(module, model, optimizer, examples):
    with module.GradientTape() as tape:
        loss = module.add_n([model.loss(module, example) for example in examples])
    gradients = tape.gradient(loss, model.variables)
    optimizer.apply_gradients(zip(gradients, model.variables))
    return loss


@pytest.fixture(params=[True, False], ids=["overlap", "in place"])
def overlapping(request):
    tf.set_parameter("overlap", request.param)
    yield request.param
    overlap.end()
    tf.set_parameter("overlap", True)


@pytest.mark.parametrize("optimizer", ["Adam", "Adagrad"])
def test_training_equals_eager_and_reads_see_the_update(optimizer, overlapping, compiled):
    """The Tree-LSTM's embedding gradient is an IndexedSlices: the update's
    flat call takes its promised shapes.  Each step's variables are read
    right after ``apply_gradients``, while the update may still be queued."""
    rng = np.random.default_rng(11)
    eager_model = MODELS["tree_lstm"](rng)
    lazy_model = MODELS["tree_lstm"](np.random.default_rng(11))
    minibatches = [eager_model.random_examples(rng, 4) for _ in range(5)]
    eager_optimizer = getattr(tensorflow.keras.optimizers, optimizer)(0.05)
    lazy_optimizer = getattr(tf.keras.optimizers, optimizer)(0.05)
    tf.reset_stats()
    queued = 0
    for examples in minibatches:
        # (From the second step on, eager TensorFlow's ops run in our
        # asynchronous stretch too.)
        expected = float(step(tensorflow, eager_model, eager_optimizer, examples))
        loss = step(tf, lazy_model, lazy_optimizer, examples)
        queued += overlap.active()
        for lazy, eager in zip(lazy_model.variables, eager_model.variables):
            np.testing.assert_allclose(lazy.numpy(), eager.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-6)
    assert tf.stats()["program_runs"] >= 3
    assert queued == (len(minibatches) if overlapping else 0)


def test_the_updates_shape_checks_wait_for_no_queued_gradient(compiled, monkeypatch):
    """``apply_gradients`` checks the gradients' shapes while the backward
    is queued: every tensor it asks is one whose shape was promised (the
    embedding's IndexedSlices' dense shape included), so none waits."""
    asked = []
    shape_of = overlap.shape_of

    def checked_shape_of(tensor):
        promised = getattr(overlap._thread, "promised", None) or {}
        asked.append(not overlap.active() or id(tensor) in promised)
        return shape_of(tensor)

    monkeypatch.setattr(overlap, "shape_of", checked_shape_of)
    rng = np.random.default_rng(19)
    model = MODELS["tree_lstm"](rng)
    optimizer = tf.keras.optimizers.Adagrad(0.05)
    for _ in range(4):
        float(step(tf, model, optimizer, model.random_examples(rng, 3)))
    assert tf.stats()["program_runs"] >= 2
    assert asked and all(asked), asked


def test_an_error_in_the_asynchronous_stretch_is_raised_at_the_next_evaluation(compiled):
    rng = np.random.default_rng(5)
    model = MODELS["tree_lstm"](rng)
    optimizer = tf.keras.optimizers.SGD(0.1)
    for _ in range(3):
        step(tf, model, optimizer, model.random_examples(rng, 3))
    assert overlap.active()
    # An index out of range: TensorFlow finds it when the op runs, queued.
    tensorflow.gather(tensorflow.constant([1.0, 2.0]), [7])
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        tf.build(step(tf, model, optimizer, model.random_examples(rng, 3)))
    assert any("set_parameter('overlap', False)" in note
               for note in raised.value.__notes__)
    assert not overlap.active()
    # And the next minibatch trains as usual.
    before = [variable.numpy() for variable in model.variables]
    float(step(tf, model, optimizer, model.random_examples(rng, 3)))
    assert any(not np.array_equal(variable.numpy(), old)
               for variable, old in zip(model.variables, before))


def test_a_recorded_op_that_fails_in_the_asynchronous_stretch_leaves_the_queue_unharmed():
    """A spec's inference (the first lookup of its shape) fails on an id out
    of range while a backward is queued: the error is raised where the op
    is recorded, naming the user's line, and the thread's later ops, plain
    TensorFlow's included, run as usual (an op failing on the queue would
    poison it until the next evaluation)."""
    table = tensorflow.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    with tf.GradientTape() as tape:
        loss = tf.build(tf.reduce_sum(tf.nn.embedding_lookup(table, [1, 2])))
    tape.gradient(loss, [table])
    assert overlap.active()
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        with tf.GradientTape():
            tf.nn.embedding_lookup(table, [0, 1, 9])   # (a shape not seen before)
    assert any("test_overlap.py" in note for note in raised.value.__notes__)
    assert tensorflow.Variable([1.0, 2.0]).numpy().tolist() == [1.0, 2.0]
    with tf.GradientTape():
        looked_up = tf.build(tf.nn.embedding_lookup(table, [3, 0, 1]))
    np.testing.assert_array_equal(looked_up.numpy(), table.numpy()[[3, 0, 1]])
    overlap.end()


# -- pipelined inference: a scope's first parts run while the rest records --

@pytest.fixture
def pipelined(compiled):
    """Every program compiled at first sight; a part every ~60 nodes (the
    test models' trees hold 10-150)."""
    previous = tf.get_parameter("pipeline")
    tf.set_parameter("pipeline", 60)
    yield
    overlap.end()
    tf.set_parameter("pipeline", previous)


def lazy_losses(model, examples):
    with tf.batching():
        losses = [model.loss(tf, example) for example in examples]
    return [float(loss) for loss in losses]


@pytest.mark.parametrize("name", ["tree_lstm", "tree_gru", "child_sum_tree_lstm"])
def test_pipelined_inference_equals_eager(name, pipelined, monkeypatch):
    rng = np.random.default_rng(3)
    model = MODELS[name](rng)
    held = []   # the parts whose programs were queued
    monkeypatch.setattr(overlap, "hold", lambda *part, hold=overlap.hold: (
        held.append(part), hold(*part)))
    tf.reset_stats()
    for examples in [model.random_examples(rng, 8) for _ in range(4)]:
        expected = [float(model.loss(tensorflow, example)) for example in examples]
        np.testing.assert_allclose(lazy_losses(model, examples), expected,
                                   rtol=1e-5, atol=1e-6)
        assert not overlap.active() and not overlap.holding()
    statistics = tf.stats()
    assert statistics["pipelined_evaluations"] >= 4
    assert len(held) >= 4


def test_no_pipelined_part_where_a_tape_could_record(pipelined):
    """Under a tape, a node evaluated early that nothing reads later would
    add its rows to a gradient: scopes under a tape close whole."""
    rng = np.random.default_rng(4)
    model = MODELS["tree_lstm"](rng)
    examples = model.random_examples(rng, 8)
    tf.reset_stats()
    with tf.GradientTape() as tape:
        loss = tf.add_n([model.loss(tf, example) for example in examples])
    assert tape.gradient(loss, model.variables)[1] is not None
    with tensorflow.GradientTape():
        lazy_losses(model, examples)
    assert tf.stats()["pipelined_evaluations"] == 0
    lazy_losses(model, examples)
    assert tf.stats()["pipelined_evaluations"] >= 1


def test_an_error_in_a_pipelined_part_names_the_users_line(pipelined):
    """The queued program fails; its nodes run again, step by step, and the
    error names the lookup's line, as unqueued, wherever in the scope the
    bad instance is; the next scope works."""
    rng = np.random.default_rng(6)
    model = MODELS["tree_lstm"](rng)
    for _ in range(2):
        lazy_losses(model, model.random_examples(rng, 8))
    tf.reset_stats()
    for position in range(5):
        examples = model.random_examples(rng, 8)
        examples[position] = ((99, 3), 1)   # word 99 of a vocabulary of 30
        with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
            lazy_losses(model, examples)
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert "nn.embedding_lookup, recorded at" in notes and "example_models.py" in notes, \
            (position, notes)
        assert not overlap.active() and not overlap.holding()
    assert tf.stats()["pipelined_evaluations"] >= 5
    examples = model.random_examples(rng, 8)
    expected = [float(model.loss(tensorflow, example)) for example in examples]
    np.testing.assert_allclose(lazy_losses(model, examples), expected, rtol=1e-5, atol=1e-6)


def _recorded_cuts(monkeypatch):
    """The list of the first node id after each pipelined part, as they
    are cut."""
    from subgraphjit import _native, evaluate
    from subgraphjit.context import context
    cuts = []

    def evaluate_so_far(upto, evaluate_so_far=evaluate.evaluate_so_far):
        pending = context.pending
        cuts.append(pending[upto].id if upto < len(pending) else _native.next_node_id())
        evaluate_so_far(upto)

    monkeypatch.setattr(context, "pipeline_callback", evaluate_so_far)
    return cuts


def _losses_in_a_scope(model, examples):
    """The examples' losses in one batching scope, checked against eager's,
    and the id of each example's first node."""
    from subgraphjit import _native
    expected = [float(model.loss(tensorflow, example)) for example in examples]
    starts, losses = set(), []
    with tf.batching():
        for example in examples:
            starts.add(_native.next_node_id())
            losses.append(model.loss(tf, example))
    np.testing.assert_allclose([float(loss) for loss in losses], expected,
                               rtol=1e-5, atol=1e-6)
    return starts


def test_pipelined_parts_end_between_trees(compiled, monkeypatch):
    """A part ends where no later op reads back into it: before a tree's
    first leaf, not before a right subtree's first leaf (whose parent would
    read the left subtree's outputs from the part before, and run its
    cell's ops as kinds of their own, in a program of their own).  The
    limit's window (1/16 of it, 301 nodes) is longer than any of these
    trees (at most 11 leaves, about 280 nodes)."""
    rng = np.random.default_rng(12)
    model = MODELS["tree_lstm"](rng)
    cuts = _recorded_cuts(monkeypatch)
    previous = tf.get_parameter("pipeline")
    tf.set_parameter("pipeline", 4800)
    try:
        for _ in range(3):
            starts = _losses_in_a_scope(model, model.random_examples(rng, 160))
            assert cuts and set(cuts) <= starts, (cuts, sorted(starts))
            cuts.clear()
    finally:
        overlap.end()
        tf.set_parameter("pipeline", previous)
    assert tf.stats()["pipelined_evaluations"] >= 3


def test_one_long_instance_is_still_cut_into_parts(pipelined):
    """One chain of 300 cells: every op reads back into the chain, so no
    cut is clean; a part ends anyway once the scope holds twice the limit,
    and the values equal eager TensorFlow's."""
    rng = np.random.default_rng(13)
    table = rng.normal(size=(20, 4)).astype(np.float32)
    weight = rng.normal(size=(4, 4)).astype(np.float32) / 2
    words = rng.integers(20, size=300).tolist()

    def chain(module):
        h = module.zeros((1, 4))
        states = []
        for word in words:
            h = module.tanh(module.matmul(h, weight)
                            + module.nn.embedding_lookup(table, [word]))
            states.append(h)
        return states

    expected = [state.numpy() for state in chain(tensorflow)]
    for _ in range(3):
        tf.reset_stats()
        with tf.batching():
            states = chain(tf)
        np.testing.assert_allclose(np.concatenate([np.asarray(s) for s in states]),
                                   np.concatenate(expected), rtol=1e-5, atol=1e-6)
    assert tf.stats()["pipelined_evaluations"] >= 2


def test_pipeline_bookkeeping_refuses_bad_input():
    from subgraphjit import _native
    from subgraphjit.context import context
    try:
        with pytest.raises(TypeError):
            _native.set_pending([], 5, "not callable")
        with pytest.raises(ValueError):
            _native.set_pending([], -1)
        with pytest.raises(ValueError):
            _native.set_pending([], 5, lambda position: None, -1)
        with pytest.raises(TypeError):
            _native.set_pending([], 5, lambda position: None, 5, 5)
    finally:
        context.pending = context.pending   # (gives the recorder its own again)
    with pytest.raises(ValueError):
        _native.restore(object())   # not the capsule write_back gives
    overlap.end()   # (a test's tape.gradient before this one queues until then)
    with pytest.raises(RuntimeError):
        overlap.hold([], None)   # nothing is queued


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.bool_])
def test_a_host_tensor_equals_tf_constant_queued_or_not(dtype, monkeypatch):
    """``overlap.host_tensor`` (a program call's index arrays, made with no
    op) gives tf.constant's tensor: values, dtype, shape and device, for
    0-d, 2-d and non-contiguous arrays, also while ops are queued, where
    a function reads it.  Under a ``tf.device`` scope, and where a GPU
    could hold it, it is tf.constant's own."""
    rng = np.random.default_rng(3)
    arrays = [np.asarray(rng.integers(-5, 5), dtype),
              rng.integers(-5, 5, (4, 3)).astype(dtype),
              rng.integers(-5, 5, (6, 4)).astype(dtype)[::2, 1:]]
    double = tensorflow.function(lambda x: tensorflow.concat([x, x], 0)).get_concrete_function(
        tensorflow.TensorSpec(None, tensorflow.as_dtype(dtype)))

    def check(array):
        made, expected = overlap.host_tensor(array), tensorflow.constant(array)
        assert made.dtype == expected.dtype and made.shape == expected.shape
        assert made.device == expected.device
        np.testing.assert_array_equal(made.numpy(), array)
        if array.ndim:
            np.testing.assert_array_equal(overlap.call(double, [made]),
                                          np.concatenate([array, array]))

    tf.set_parameter("overlap", True)
    for array in arrays:
        check(array)
        overlap.begin()   # (queued: the call waits for nothing made here)
        try:
            assert overlap.active()
            check(array)
        finally:
            overlap.end()
        with tensorflow.device("/CPU:0"):
            check(array)
    monkeypatch.setattr(overlap, "_host_device", lambda: None)   # (a GPU's process)
    check(arrays[1])


def test_a_function_called_unrewritten_skips_grappler_and_keeps_the_callers_options():
    """Compiled programs are first called without Grappler's rewrites
    (``overlap.unrewritten``): inside the block the thread's call options
    are the caller's with the meta optimizer off; after it, even after an
    error, the caller's own options again."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context as eager_context
    current = eager_context.context()
    saved = current.function_call_options
    config = config_pb2.ConfigProto(allow_soft_placement=True, intra_op_parallelism_threads=1)
    expected = config_pb2.ConfigProto()
    expected.CopyFrom(config)
    expected.graph_options.rewrite_options.disable_meta_optimizer = True
    caller = type(saved)(config_proto=config)
    current.function_call_options = caller
    try:
        square = tensorflow.function(lambda x: x * x).get_concrete_function(
            tensorflow.TensorSpec((2,), tensorflow.float32))
        for _ in range(2):   # (the options are made once, then reused)
            with overlap.unrewritten():
                inside = config_pb2.ConfigProto.FromString(
                    current.function_call_options.config_proto_serialized)
                np.testing.assert_array_equal(
                    overlap.call(square, [tensorflow.constant([2.0, 3.0])]), [4.0, 9.0])
            assert inside == expected
            assert current.function_call_options is caller
        with pytest.raises(ZeroDivisionError):
            with overlap.unrewritten():
                1 / 0
        assert current.function_call_options is caller
        np.testing.assert_array_equal(
            overlap.call(square, [tensorflow.constant([1.0, 5.0])], rewrite=False), [1.0, 25.0])
        assert current.function_call_options is caller
    finally:
        current.function_call_options = saved


def test_a_function_of_listed_results_called_again_gives_them_as_its_plain_call():
    """A function returning a list of tensors (as every program does) is
    given the op's outputs as that list, without TensorFlow's packing; a
    function of any other structure is packed as before."""
    rng = np.random.default_rng(11)

    @tensorflow.function
    def listed(x):
        return [x + 1.0, x * x]

    @tensorflow.function
    def nested(x):
        return [x + 1.0, [x * x]]
    for function, is_listed in ((listed, True), (nested, False)):
        concrete = function.get_concrete_function(tensorflow.TensorSpec((3,), tensorflow.float32))
        for _ in range(3):
            x = tensorflow.constant(rng.normal(size=3).astype(np.float32))
            made = overlap.call(concrete, [x])
            plain = concrete(x)
            assert type(made) is list and len(made) == 2
            np.testing.assert_array_equal(made[0], plain[0])
            if is_listed:
                np.testing.assert_array_equal(made[1], plain[1])
            else:
                assert type(made[1]) is list
                np.testing.assert_array_equal(made[1][0], plain[1][0])
        assert overlap._direct[concrete].listed is is_listed


def test_a_function_called_again_runs_as_its_plain_call_and_records_on_tapes(monkeypatch):
    """After its first call, ``overlap.call`` runs a function as the one op
    its plain call ends in (``_DirectCall``): the same structured results,
    a captured variable read as it is now, call options changed between
    calls taken.  Where a tape records, the plain call runs, and the tape
    gets the gradient."""
    weight = tensorflow.Variable([1.0, 2.0])

    @tensorflow.function
    def product(x, y):
        return x * y * weight, [x + y]
    concrete = product.get_concrete_function(
        tensorflow.TensorSpec((2,), tensorflow.float32),
        tensorflow.TensorSpec((2,), tensorflow.float32))
    plain_calls = []
    call_flat = concrete._call_flat
    monkeypatch.setattr(concrete, "_call_flat",
                        lambda *a: plain_calls.append(1) or call_flat(*a), raising=False)
    rng = np.random.default_rng(5)
    for round in range(4):
        x, y = (tensorflow.constant(rng.normal(size=2).astype(np.float32)) for _ in "xy")
        if round == 2:
            weight.assign([3.0, -1.0])
        made, (total,) = overlap.call(concrete, [x, y])
        np.testing.assert_allclose(made, x * y * weight, rtol=1e-6)
        np.testing.assert_allclose(total, x + y, rtol=1e-6)
    assert len(plain_calls) == 1 and overlap._direct[concrete] is not None

    with tensorflow.GradientTape() as tape:
        tape.watch(x)
        made, _ = overlap.call(concrete, [x, y])
    np.testing.assert_allclose(tape.gradient(made, x), y * weight, rtol=1e-6)
    assert len(plain_calls) == 2
    with tensorflow.GradientTape() as tape:
        tape.watch(x)
        with tape.stop_recording():
            overlap.call(concrete, [x, y])
    assert len(plain_calls) == 2

    from tensorflow.python.eager import context as eager_context
    current = eager_context.context()
    saved = current.function_call_options
    from tensorflow.core.protobuf import config_pb2
    current.function_call_options = type(saved)(config_proto=config_pb2.ConfigProto.FromString(
        saved.config_proto_serialized))
    try:
        made, _ = overlap.call(concrete, [x, y])
        assert overlap._direct[concrete].options is current.function_call_options
    finally:
        current.function_call_options = saved
    np.testing.assert_allclose(made, x * y * weight, rtol=1e-6)
    assert len(plain_calls) == 2


def test_a_direct_call_reads_a_capture_given_at_each_call_anew():
    """A function's captures fixed when it was traced are flattened once
    for its direct calls; one whose value a callable gives at each call
    (a deferred capture) is asked again at every call, as TensorFlow's own
    call asks it."""
    scale = {"value": 2.0}

    @tensorflow.function(autograph=False)
    def scaled(x):
        graph = tensorflow.compat.v1.get_default_graph()
        return x * graph.capture_call_time_value(
            lambda: tensorflow.constant(scale["value"]),
            tensorflow.TensorSpec((), tensorflow.float32))
    concrete = scaled.get_concrete_function(tensorflow.TensorSpec((2,), tensorflow.float32))
    x = tensorflow.constant([1.0, -3.0])
    for value in (2.0, 5.0, -1.0):
        scale["value"] = value
        np.testing.assert_allclose(overlap.call(concrete, [x]), x.numpy() * value)
    assert overlap._direct[concrete] is not None and overlap._direct[concrete].captured is None

    weight = tensorflow.Variable([1.0, 2.0])
    fixed = tensorflow.function(lambda x: x * weight, autograph=False).get_concrete_function(
        tensorflow.TensorSpec((2,), tensorflow.float32))
    for value in ([1.0, 2.0], [4.0, -2.0]):
        weight.assign(value)
        np.testing.assert_allclose(overlap.call(fixed, [x]), x.numpy() * value)
        np.testing.assert_allclose(overlap.call(fixed, [x]), x.numpy() * value)
    assert overlap._direct[fixed].captured is not None


def test_a_scope_under_twice_the_limit_has_one_part_before_its_close(compiled, monkeypatch):
    """Where the last inference scope recorded fewer than twice
    ``pipeline`` nodes, the next evaluates one part of FIRST_SHARE of
    that count (cut between trees, as the parameter's window keeps it)
    while the rest records, and the rest at its close: two evaluations,
    eager's values."""
    from subgraphjit import context as context_module
    from subgraphjit.context import context
    rng = np.random.default_rng(14)
    model = MODELS["tree_lstm"](rng)
    cuts = _recorded_cuts(monkeypatch)
    monkeypatch.setattr(context, "last_inference_nodes", None)   # (no scope before)
    previous = tf.get_parameter("pipeline")
    tf.set_parameter("pipeline", 20_000)   # (these scopes: about 18,000 nodes)
    try:
        for round in range(3):
            last = context.last_inference_nodes
            tf.reset_stats()
            starts = _losses_in_a_scope(model, model.random_examples(rng, 100))
            recorded = context.last_inference_nodes
            assert recorded < 2 * 20_000, recorded   # (else the parameter's parts)
            stats = tf.stats()
            if round == 0:   # no scope before it: the parameter's limit
                assert last is None and not cuts and stats["evaluations"] == 1
                continue
            assert context.pipeline_limit == max(context_module.MIN_PART,
                                                 int(last * context_module.FIRST_SHARE))
            assert len(cuts) == 1 and set(cuts) <= starts, (cuts, sorted(starts))
            assert stats["pipelined_evaluations"] == 1 and stats["evaluations"] == 2
            cuts.clear()
    finally:
        overlap.end()
        tf.set_parameter("pipeline", previous)


def test_a_scopes_last_part_is_queued_and_its_graph_freed_by_the_next_close(
        compiled, monkeypatch):
    """The close's program is queued behind the pipelined parts and waited
    for at the close: values as eager's, a failure raised there naming the
    user's line; and what the scope recorded is freed by the next close
    (the operands held for the queue, dropped while the next one runs)."""
    rng = np.random.default_rng(8)
    weight = tf.Variable(rng.normal(size=(4, 4)).astype(np.float32))

    def loss(module, row):
        hidden = module.tanh(module.matmul(row, weight))
        return module.reduce_sum(module.tanh(module.matmul(hidden, weight)))

    held = []   # how many nodes each queued program held (not the nodes)
    monkeypatch.setattr(overlap, "hold", lambda nodes, operands, hold=overlap.hold: (
        held.append(len(nodes)), hold(nodes, operands)))
    previous = tf.get_parameter("pipeline")
    tf.set_parameter("pipeline", 0)   # (one part: the close's)
    tf.reset_stats()
    try:
        _last_parts_queued_and_freed(loss, rng)
    finally:
        tf.set_parameter("pipeline", previous)
    assert len(held) >= 3 and tf.stats()["pipelined_evaluations"] == 0

    model = MODELS["tree_lstm"](rng)
    lazy_losses(model, model.random_examples(rng, 8))
    examples = model.random_examples(rng, 8)
    examples[-1] = ((99, 3), 1)   # word 99 of a vocabulary of 30
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        lazy_losses(model, examples)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "nn.embedding_lookup, recorded at" in notes and "example_models.py" in notes
    assert not overlap.active() and not overlap.holding()


def test_the_nodes_inside_a_closes_patterns_are_freed_by_the_next_close(compiled):
    """What only the close's list holds (nodes swallowed by a pattern, read
    by nothing) lives until the next close waits, not after this one's
    wait: values as eager's, and nothing kept longer."""
    rng = np.random.default_rng(9)
    weight = tf.Variable(rng.normal(size=(4, 4)).astype(np.float32))

    def loss(module, row, inside=None):
        hidden = module.tanh(module.matmul(row, weight))
        if inside is not None:
            inside.append(weakref.ref(hidden))
        return module.reduce_sum(module.tanh(module.matmul(hidden, weight)))

    previous = tf.get_parameter("pipeline")
    tf.set_parameter("pipeline", 0)   # (one part: the close's)
    try:
        earlier = []
        for scope in range(4):
            rows = [rng.normal(size=(1, 4)).astype(np.float32) for _ in range(6)]
            inside = []
            with tf.batching():
                losses = [loss(tf, row, inside) for row in rows]
            np.testing.assert_allclose([float(value) for value in losses],
                                       [float(loss(tensorflow, row)) for row in rows],
                                       rtol=1e-5, atol=1e-6)
            assert all(hidden() is None for hidden in earlier)
            if scope:   # (the first collects patterns, op by op)
                assert tf.stats()["pattern_matches"] and all(
                    hidden() is not None and hidden().swallowed for hidden in inside)
            earlier = inside
    finally:
        overlap.end()
        tf.set_parameter("pipeline", previous)


def test_a_scopes_graph_is_not_tracked_by_the_cyclic_collector(compiled):
    """The containers an evaluated scope leaves, one per node (the pair
    of a node's batched value and row), and its lists of nodes are
    untracked: a collection after a scope does not visit each of its
    nodes.  Values stay eager's."""
    rng = np.random.default_rng(10)
    model = MODELS["tree_lstm"](rng)
    lazy_losses(model, model.random_examples(rng, 4))   # (collects patterns)
    examples = model.random_examples(rng, 8)
    with tf.batching():
        losses = [model.loss(tf, example) for example in examples]
    np.testing.assert_allclose([float(loss) for loss in losses],
                               [float(model.loss(tensorflow, example)) for example in examples],
                               rtol=1e-5, atol=1e-6)
    overlap.end()
    batched = {id(loss.batched): loss.batched for loss in losses if loss.batched is not None}
    assert batched   # (rows of a program's buffers, read without a slice)
    tracked = [holder for buffer in batched.values() for holder in gc.get_referrers(buffer)
               if type(holder) is tuple and len(holder) == 2 and type(holder[1]) is int]
    assert not tracked


def _last_parts_queued_and_freed(loss, rng):
    """Scopes of six rows: values as eager's, and each scope's rows (the
    operands its recording holds) freed by the next close."""
    refs = []
    for _ in range(4):
        rows = [rng.normal(size=(1, 4)).astype(np.float32) for _ in range(6)]
        expected = [float(loss(tensorflow, row)) for row in rows]
        with tf.batching():
            losses = [loss(tf, row) for row in rows]
        np.testing.assert_allclose([float(value) for value in losses], expected,
                                   rtol=1e-5, atol=1e-6)
        assert not overlap.active() and not overlap.holding()
        assert all(reference() is None for reference in refs)
        refs = [weakref.ref(row) for row in rows]
        del rows, losses
