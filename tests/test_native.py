"""The compiled recorder (subgraphjit._native): node storage outside the
cyclic collector, record's key, spec cache, consumers, sites and ids, clean
errors for bad calls, and freeing deep graphs."""

import copy
import gc
import inspect
import math
import operator
import pickle
import re
import sys
import types
import weakref

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import VirtualNode, _native
from subgraphjit.context import context
from subgraphjit.ir.spec import NotLazy, spec, spec_of_foreign
from subgraphjit.ir.table import ACCESS, ALL_ENTRIES, FrozenSlice
from experiments.example_models import MODELS

ENTRIES = {entry.name: entry for entry in ALL_ENTRIES}


def constant(*shape):
    return tensorflow.constant(np.ones(shape, np.float32))


def test_nodes_are_not_tracked_by_the_cyclic_collector():
    node = tf.tanh(constant(2, 3))
    assert type(node) is VirtualNode and not gc.is_tracked(node)
    assert not VirtualNode.__flags__ & (1 << 14)  # Py_TPFLAGS_HAVE_GC
    # A subclass would be tracked again, so VirtualNode takes none.
    with pytest.raises(TypeError):
        type("Sub", (VirtualNode,), {"__slots__": ()})


def test_fields_are_attributes_with_none_defaults():
    entry, site = ENTRIES["math.tanh"], (sys._getframe().f_code, 7)
    node = VirtualNode(41, entry, ("x",), (), spec(tf.float32, (2,)), site)
    assert (node.id, node.entry, node.inputs, node.attrs, node.site) == \
        (41, entry, ("x",), (), site)
    assert node.spec is spec(tf.float32, (2,))
    assert node.result is None and node.batched is None and node.row is None
    assert node.consumers == 0
    node.consumers += 2
    node.result, node.inputs = "r", ()
    assert (node.consumers, node.result, node.batched, node.row,
            node.inputs) == (2, "r", None, None, ())
    # A node holds one value: its own result, or a row of a batched value.
    node.batched, node.row = "b", 3
    assert (node.result, node.batched, node.row) == (None, "b", 3)
    node.result = "r"
    assert (node.result, node.batched, node.row) == ("r", None, None)
    node.batched = None   # (forgets a row, keeps a result)
    assert node.result == "r"
    with pytest.raises(AttributeError):
        node.row = 4   # a row of no batched value
    node.swallowed = 1
    assert node.swallowed is True
    del node.site  # as with __slots__: a deleted field reads as missing
    with pytest.raises(AttributeError):
        node.site
    with pytest.raises(AttributeError):
        node.meta = {}  # no instance dict
    with pytest.raises(TypeError):
        node.consumers = None
    probe = weakref.ref(node)
    del node
    assert probe() is None


def test_record_builds_the_key_counts_consumers_and_names_the_users_line():
    x = constant(2, 3)
    with tf.batching():
        first_id = _native.next_node_id()
        a = tf.tanh(x)
        b, line = tf.reduce_sum(a, axis=1), sys._getframe().f_lineno
        c = a * a
        assert all(map(operator.is_, context.pending, [a, b, c]))
        # (Read before the scope's end evaluates them and drops inputs.)
        assert b.inputs[0] is a and b.spec is spec(tf.float32, (2,))
        assert b.site == (sys._getframe().f_code, line)
        assert c.site[1] == line + 1  # operators name the user's line too
    assert (a.id, b.id, c.id) == (first_id, first_id + 1, first_id + 2)
    assert _native.next_node_id() == first_id + 3
    assert a.consumers == 3 and b.consumers == 0  # c reads a twice
    entry = ENTRIES["math.reduce_sum"]
    key = (b.attrs, tuple(map(type, b.attrs)), a.spec)
    assert entry.cache[key] is b.spec


def test_a_site_is_the_callers_frame_however_it_was_called():
    """The site is the frame ``sys._getframe(1)`` gives from the wrapper
    (read off the interpreter's frames in C where it can be): a function,
    a lambda, a comprehension's and a generator's own frames, a frame of
    many sites, and a call from C (``map``), which names its caller."""
    x = constant(2, 3)

    def here(node, frame):   # (the frame's line now, while it runs it)
        return node.site, (frame.f_code, frame.f_lineno)

    def helper():
        return here(tf.tanh(x), sys._getframe())

    def generator():
        yield here(tf.tanh(x), sys._getframe())

    with tf.batching():
        sites = [helper(), (lambda: here(tf.tanh(x), sys._getframe()))(),
                 [here(tf.tanh(x), sys._getframe()) for _ in range(1)][0],
                 next(generator()), next(here(tf.tanh(x), sys._getframe()) for _ in [0])]
        for _ in range(3):   # (one frame, one line: a cached site)
            sites.append(here(tf.tanh(x), sys._getframe()))
        sites.append(here(list(map(tf.tanh, [x]))[0], sys._getframe()))
    assert len({code for _, (code, _) in sites}) == 6   # (five and the test's)
    assert len({line for _, (_, line) in sites}) >= 3
    for site, expected in sites:
        assert site == expected


def test_cached_specs_skip_inference_and_attribute_types_are_in_the_key():
    x = tensorflow.constant([1, 2])
    tf.one_hot(x, 3, on_value=1)
    inferences = context.shape_inferences
    assert tf.one_hot(x, 3, on_value=1).dtype == tf.int32
    assert context.shape_inferences == inferences  # a cache hit
    assert tf.one_hot(x, 3, on_value=1.0, off_value=0.0).dtype == tf.float32


def test_equal_plain_attributes_are_one_tuple_and_others_keep_their_own():
    x = constant(2, 3)
    first, second = tf.reduce_sum(x, axis=1), tf.reduce_sum(x, axis=1)
    assert first.attrs == (1, False) and first.attrs is second.attrs
    # Equal but of other types (1 == True), or floats (-0.0 == 0.0): the
    # node keeps the attributes it was given.
    as_int, as_bool = (tf.reduce_sum(x, axis=1, keepdims=keepdims) for keepdims in (1, True))
    assert [type(item) for item in as_int.attrs] == [int, int]
    assert [type(item) for item in as_bool.attrs] == [int, bool]
    negative, positive = (tf.nn.leaky_relu(x, alpha=alpha) for alpha in (-0.0, 0.0))
    assert negative.attrs is not positive.attrs
    assert math.copysign(1.0, negative.attrs[0]) == -1.0
    assert math.copysign(1.0, positive.attrs[0]) == 1.0


def test_more_record_keys_than_the_record_cache_holds_keep_their_own_specs():
    """record()'s cache in front of entry.cache is direct-mapped (4096
    entries): record keys that evict each other still get their own spec,
    and its shared attributes, on every later record."""
    x = tensorflow.constant([1, 2])
    depths = range(1, 4500)
    first = [tf.one_hot(x, depth) for depth in depths]
    inferences = context.shape_inferences
    again = [tf.one_hot(x, depth) for depth in reversed(depths)][::-1]
    assert context.shape_inferences == inferences
    for depth, before, after in zip(depths, first, again):
        assert after.shape == (2, depth) and after.dtype == tf.float32
        assert after.attrs == before.attrs
        # (Sharing stops once 4096 attribute tuples are kept.)
        assert after.attrs is before.attrs or depth > 4000


def test_unhashable_attributes_are_frozen():
    node = tf.tanh(constant(2, 3))[:, 1]
    (frozen, index), = node.attrs
    assert type(frozen) is FrozenSlice and index == 1
    assert node.shape == (2,)
    np.testing.assert_allclose(node.numpy(), np.tanh(np.ones(2)), rtol=1e-6)


def test_multi_output_entries_give_accesses():
    gates = tf.tanh(constant(1, 6))
    before = _native.next_node_id()
    outputs, line = tf.split(gates, 3, axis=1), sys._getframe().f_lineno
    assert _native.next_node_id() == before + 4
    split = outputs[0].inputs[0]
    assert split.id == before and split.consumers == 3
    for index, output in enumerate(outputs):
        assert output.entry is ACCESS and output.attrs == (index,)
        assert output.inputs == (split,) and output.spec is split.spec[index]
        assert output.id == before + 1 + index and output.site[1] == line


def test_foreign_operands_that_cannot_be_described_stay_eager():
    node = tf.tanh(constant(2, 1))
    with pytest.raises(NotLazy):
        _native.record(ENTRIES["math.add"], (node, object()), ())
    assert node.consumers == 0  # nothing was recorded
    assert isinstance(tf.add(node, tensorflow.ragged.constant([[1.0], [2.0]])),
                      tensorflow.RaggedTensor)


@pytest.mark.parametrize("arguments", [
    (), (ENTRIES["math.tanh"],), (ENTRIES["math.tanh"], [1.0], ()),
    (ENTRIES["math.tanh"], (1.0,), [None]), (ENTRIES["math.tanh"], (), (), ()),
    (ENTRIES["math.tanh"], (1.0,), (), "line 3"), (ENTRIES["math.tanh"], (1.0,), (), None, 1),
])
def test_bad_calls_raise_type_errors(arguments):
    with pytest.raises(TypeError):
        _native.record(*arguments)


@pytest.mark.parametrize("arguments", [
    (), (ENTRIES["math.tanh"],), (ENTRIES["math.tanh"], [None], 1.0),
    (ENTRIES["math.tanh"], None, 1.0),
])
def test_bad_calls_of_record_operands_raise_type_errors(arguments):
    with pytest.raises(TypeError):
        _native.record_operands(*arguments)


def test_record_operands_records_as_record_does():
    """The wrappers' form (operands as arguments) and record's (a tuple)
    give equal nodes, a cache miss included (a new attribute)."""
    x = constant(2, 3)
    with tf.batching():
        entry = ENTRIES["math.reduce_sum"]
        for axis in (1, 0):   # (the second: a key new to the record cache)
            given = _native.record_operands(entry, (axis, False), x)
            expected = _native.record(entry, (x,), (axis, False))
            assert given.spec is expected.spec and given.attrs == expected.attrs
            assert given.inputs[0] is x and given.entry is expected.entry
    np.testing.assert_allclose(given.numpy(), x.numpy().sum(axis=0), rtol=1e-6)


def test_the_mode_is_the_recorders_eager_mode_records_nothing():
    """``context.lazy`` is kept by the recorder: in eager mode a Recorder
    (tf.matmul) and a generated wrapper (tf.tanh, whose record_operands
    raises NotLazy) both run TensorFlow's op."""
    x = constant(2, 3)
    lazy = context.lazy
    try:
        context.lazy = False
        assert _native.lazy() is False
        with pytest.raises(NotLazy):
            _native.record_operands(ENTRIES["math.tanh"], (), x)
        with pytest.raises(TypeError):   # (a bad call is one in either mode)
            _native.record_operands(ENTRIES["math.tanh"], [None], x)
        for result in (tf.tanh(x), tf.matmul(x, x, transpose_b=True)):
            assert isinstance(result, tensorflow.Tensor), type(result)
        context.lazy = True
        assert _native.lazy() is True
        assert isinstance(tf.tanh(x), VirtualNode)
        assert isinstance(tf.matmul(x, x, transpose_b=True), VirtualNode)
    finally:
        context.lazy = lazy


def test_bad_entries_and_nodes_raise_clean_errors():
    with pytest.raises(AttributeError):
        _native.record(object(), (1.0,), ())
    entry = type("Entry", (), {"cache": [], "multi_output": False})()
    with pytest.raises(TypeError):
        _native.record(entry, (1.0,), ())
    with pytest.raises(TypeError):
        VirtualNode("not an id", None, (), (), None, None)
    with pytest.raises(TypeError):
        VirtualNode(1, None)
    with pytest.raises(TypeError):
        _native.setup(context, None, None, None, ACCESS, {}, set(),
                      type(constant(1)))
    node = tf.tanh(constant(2))
    del node.spec
    with pytest.raises(AttributeError):
        tf.exp(node)
    with pytest.raises(TypeError):
        _native.next_node_id(1)


def test_deep_chains_are_freed_without_recursing():
    # Freeing the last node frees the chain; done recursively in C it would
    # overflow the C stack long before 100,000 nodes.
    x = tf.tanh(constant(1))
    probe = weakref.ref(x)
    for _ in range(100_000):
        x = x + 1.0
    del x
    assert probe() is None
    # Inputs kept in the node and in an array of their own (more than two).
    for extra in ((), (1.0, 2.0)):
        chain = VirtualNode(0, ACCESS, (), (), None, None)
        probe = weakref.ref(chain)
        for node_id in range(1, 300_000):
            chain = VirtualNode(node_id, ACCESS, [chain, *extra], (), None, None)
        del chain
        assert probe() is None


def test_inputs_are_a_tuple_and_can_be_replaced():
    x, y = tf.tanh(constant(1)), tf.exp(constant(1))
    node = x + y
    assert node.inputs == (x, y) and type(node.inputs) is tuple
    consumers = x.consumers
    node.inputs = [y, x, 3.0]        # a list is copied, beyond the inline two
    assert node.inputs == (y, x, 3.0)
    node.inputs = (x,)
    assert node.inputs == (x,)
    del node.inputs
    assert node.inputs == ()
    assert x.consumers == consumers  # (counted when recorded, not here)
    probe = weakref.ref(y)
    del y
    assert probe() is None           # replaced inputs are released
    with pytest.raises(TypeError, match="tuple or list"):
        node.inputs = x
    with pytest.raises(TypeError, match="tuple or list"):
        VirtualNode(0, ACCESS, x, (), None, None)


def test_variables_and_python_numbers_give_their_own_specs():
    x = constant(1, 3)
    narrow = tensorflow.Variable(np.ones((3, 4), np.float32))
    wide = tensorflow.Variable(np.ones((3, 5), np.float64))
    for _ in range(2):  # the second time from the specs kept on them
        assert tf.matmul(x, narrow).shape == (1, 4)
        assert tf.matmul(tf.cast(x, tf.float64), wide).dtype == tf.float64
    h = tf.tanh(x)
    assert (h + 1).dtype == (h + 1.0).dtype == tf.float32
    assert (h + 1).inputs == (h, 1) and (h + 1).entry.name == "operator.add"
    with pytest.raises(TypeError):
        _native.setup(context, None, None, None, ACCESS, [], set(),
                      type(constant(1)))


def test_a_variable_freed_gives_its_address_no_stale_spec():
    """The recorder keeps variables' specs by address: a variable freed and
    another made, perhaps at the same address, gets its own spec, and the
    cache keeps none of them alive."""
    x = constant(1, 3)
    rng = np.random.default_rng(0)
    for width in rng.integers(1, 9, 60):
        weight = tensorflow.Variable(np.ones((3, width), np.float32))
        probe = weakref.ref(weight)
        assert tf.matmul(x, weight).shape == (1, width)
        assert tf.matmul(x, weight).shape == (1, width)   # (from the cache)
        del weight
        gc.collect()
        assert probe() is None
    wide = tensorflow.Variable(np.ones((3, 2), np.float64))
    assert tf.matmul(tf.cast(x, tf.float64), wide).dtype == tf.float64


def test_lists_of_ints_give_the_spec_spec_of_foreign_gives():
    """Lists of Python ints take a native fast path (a spec by length);
    other lists, and ints beyond int64, take spec_of_foreign's."""
    table = tensorflow.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
    rows = tf.tanh(table)
    for ids in ([2], [3, 0, 3], [2], [1.0, 2.0, 3.0], [[1, 2, 3]], [1, 2, 3]):
        node = tf.gather(rows, ids) if type(ids[0]) is int and len(ids) < 3 \
            else rows + ids
        key = (node.attrs, tuple(map(type, node.attrs)), rows.spec, spec_of_foreign(ids))
        assert node.entry.cache[key] is node.spec
    np.testing.assert_array_equal(tf.gather(table, [3, 0, 3]).numpy(),
                                  tensorflow.gather(table, [3, 0, 3]).numpy())
    with pytest.raises(NotLazy):
        spec_of_foreign([2 ** 64])
    with pytest.raises(Exception) as eager_error:
        tensorflow.gather(table, [2 ** 64])
    with pytest.raises(type(eager_error.value)):
        tf.gather(table, [2 ** 64])   # not recorded: eager's error, at once


def test_graphs_rewritten_by_patterns_are_freed(parameters):
    """Nodes are invisible to the cyclic collector, so a cycle through them
    would never be freed: none is made, even where pattern matching and
    joining rewrite nodes' inputs."""
    parameters(granularity="subgraph", collect=1, fuse=True)
    rng = np.random.default_rng(3)
    model = MODELS["tree_lstm"](rng)
    tf.reset_stats()
    probes = []
    for _ in range(2):  # collect patterns, then replace and join
        with tf.GradientTape() as tape:
            loss = tf.add_n([model.loss(tf, example)
                             for example in model.random_examples(rng, 4)])
            probes += [weakref.ref(node) for node in context.pending]
        tape.gradient(loss, model.variables)
        del loss, tape
    assert tf.stats()["pattern_fusions"] > 0
    gc.collect()
    assert not [probe for probe in probes if probe() is not None]


def test_node_storage_is_reused_and_returned():
    """Nodes live in chunks filled in recording order (native/slab.c): a
    chunk whose nodes die is refilled, a chunk that a few long-lived nodes
    keep is refilled once half of it is free, and empty chunks beyond a
    bound go back to the system."""
    x = tf.tanh(constant(1))
    before = _native.slab_statistics()
    per_chunk = before["nodes_per_chunk"]
    kept = []
    for _ in range(10):
        nodes = [x + 1.0 for _ in range(20 * per_chunk)]
        kept += nodes[::per_chunk // 3]   # about three per chunk live on
        del nodes
    after = _native.slab_statistics()
    assert after["nodes"] == before["nodes"] + len(kept)
    # Without reuse of the chunks kept nodes pin: 200 chunks and more.
    assert after["chunks"] - before["chunks"] <= 45
    del kept
    assert _native.slab_statistics()["nodes"] == before["nodes"]
    # 600 chunks' worth freed at once: at most 512 empty ones stay.
    nodes = [x + 1.0 for _ in range(600 * per_chunk)]
    del nodes
    after = _native.slab_statistics()
    assert after["empty_chunks"] == 512
    assert after["chunks"] - after["empty_chunks"] <= before["chunks"] - before["empty_chunks"] + 1


def test_eager_tensor_operands_get_the_spec_spec_of_foreign_gives():
    """Eager tensors' specs are kept by dtype and shape in C: the same
    interned Spec as spec_of_foreign's, for each dtype and shape, when
    first met and when found again."""
    values = [np.ones((1, 3), np.float32), np.ones((), np.int32),
              np.ones((2, 2), np.float64), np.zeros((3,), np.bool_),
              np.array(["a"]), np.ones((1, 3), np.float64)]
    for _ in range(2):
        for value in values:
            tensor = tensorflow.constant(value)
            node = tf.identity(tensor)
            assert node.spec is spec_of_foreign(tensor)
            assert node.inputs[0] is tensor


# -- operators (native/_native.c): recorded with no Python frame -------------

def test_operators_record_at_the_users_line_in_either_order():
    x, y = tf.tanh(constant(2, 2)), tf.sigmoid(constant(2, 2))
    line = sys._getframe().f_lineno + 1
    results = [x * y, x + 1.0, 2.0 - x, -x, abs(x), x @ y, x / 2, 2 ** x, x ** 2,
               constant(2, 2) * x, np.float32(3) * x, x // 1.0, x % 1.0, ~(x > 0)]
    for result in results:
        assert type(result) is VirtualNode, result
        assert result.site[0] is sys._getframe().f_code
        assert result.site[1] in (line, line + 1)
    np.testing.assert_allclose(
        np.asarray(results[0]), np.full((2, 2), np.tanh(1.0) / (1 + np.exp(-1.0))),
        rtol=1e-6)
    np.testing.assert_allclose(np.asarray(results[2]), np.full((2, 2), 2 - np.tanh(1.0)),
                               rtol=1e-6)
    with pytest.raises(TypeError):
        pow(x, 2, 3)


def test_an_operand_the_recorder_cannot_describe_computes_the_operator_now():
    x = tf.tanh(constant(1, 2))
    ragged = tensorflow.ragged.constant([[1.0, 2.0]])
    for result in (x + ragged, ragged + x):
        assert isinstance(result, tensorflow.RaggedTensor)
        np.testing.assert_allclose(result.to_tensor().numpy(),
                                   np.tanh(1.0) + np.array([[1.0, 2.0]]), rtol=1e-6)


@pytest.mark.parametrize("arguments", [(), ({},), ([], ValueError),
                                       ({"__add__": 1}, ValueError)])
def test_set_operators_rejects_bad_tables_and_keeps_the_installed_ones(arguments):
    with pytest.raises(TypeError):
        _native.set_operators(*arguments)
    node = tf.tanh(constant(1, 1))
    assert type(node + 1.0) is VirtualNode


@pytest.mark.parametrize("function, values, axis", [
    ("concat", lambda x: x, 0), ("concat", lambda x: (x, x), 1), ("concat", lambda x: [x], 0),
    ("stack", lambda x: x, 1), ("add_n", lambda x: x, None), ("add_n", lambda x: [x, x], None),
])
def test_a_lone_tensor_is_taken_as_tensorflow_takes_it(function, values, axis):
    """tf.concat takes a tensor given for its list as a list of it; tf.stack
    and tf.add_n iterate it (its rows)."""
    x = tensorflow.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    axis = () if axis is None else (axis,)
    want = getattr(tensorflow, function)(values(x), *axis).numpy()
    got = getattr(tf, function)(values(tf.identity(x)), *axis)
    assert type(got) is VirtualNode
    np.testing.assert_array_equal(np.asarray(got), want)


RECORDER_CALLS = [
    lambda tf, a, b: tf.matmul(a, b),
    lambda tf, a, b: tf.matmul(a, b, transpose_b=True),
    lambda tf, a, b: tf.matmul(a, b, False, True, name="product"),
    lambda tf, a, b: tf.matmul(b=b, a=a),
    lambda tf, a, b: tf.reduce_sum(a, name="total"),
    lambda tf, a, b: tf.split(a, 3, axis=1),
    lambda tf, a, b: tf.split(a, [1, 2], 1),
    lambda tf, a, b: tf.concat([a, b], axis=1),
    lambda tf, a, b: tf.concat((a, b), 0),
    lambda tf, a, b: tf.concat((x for x in (a, b)), 0),   # TensorFlow's ValueError
    lambda tf, a, b: tf.add_n([a, b, a]),
    lambda tf, a, b: tf.reduce_sum(a, 1, True),
    lambda tf, a, b: tf.matmul(a, b, transpose_c=True),    # TensorFlow's TypeError
    lambda tf, a, b: tf.matmul(a),                         # TensorFlow's TypeError
    lambda tf, a, b: tf.matmul(a, b, a=a),                 # TensorFlow's TypeError
]


@pytest.mark.parametrize("call", RECORDER_CALLS)
def test_functions_record_in_c_as_their_generated_wrappers_do(call):
    """A patched function is a ``_native.Recorder``: its lazy calls, by
    position or keyword, with defaults, ``name`` or attributes given,
    record the node the generated wrapper (its ``fallback``) records, at
    the user's line, and evaluate to TensorFlow's values; every other
    call (a generator for a list, a bad argument) is the wrapper's, whose
    errors are TensorFlow's."""
    rng = np.random.default_rng(3)
    a, b = (tensorflow.constant(rng.normal(size=(3, 3)).astype(np.float32))
            for _ in range(2))

    class Wrappers:   # the same functions as their generated wrappers
        def __getattr__(self, name):
            return getattr(tf, name).fallback

    def outcome(module):
        try:
            return call(module, a, b)
        except (TypeError, ValueError) as error:
            return error

    def message(error):   # (without the addresses of the call's objects)
        return re.sub("0x[0-9a-f]+", "", str(error))

    expected = outcome(tensorflow)
    with tf.batching():
        got = outcome(tf)
        by_wrapper = outcome(Wrappers())
        if isinstance(expected, Exception):
            assert type(got) is type(by_wrapper) is type(expected)
            assert message(got) == message(by_wrapper)
            return
        for node, reference in zip(tensorflow.nest.flatten(got),
                                   tensorflow.nest.flatten(by_wrapper)):
            assert type(node) is VirtualNode and node.entry is reference.entry
            assert node.attrs == reference.attrs and node.spec is reference.spec
            assert node.site == reference.site and node.site[0] is call.__code__
    for value, reference in zip(tensorflow.nest.flatten(got), tensorflow.nest.flatten(expected)):
        np.testing.assert_allclose(value.numpy(), reference.numpy(), rtol=1e-6)


def test_a_recorder_is_a_function_to_its_users():
    """What code reads off a function: its name, signature, documentation
    and ``__wrapped__``; pickled and copied by name, bound as a method, as
    a Python function is; and eager mode (nothing records) passes the call
    to TensorFlow."""
    assert type(tf.matmul) is _native.Recorder
    assert tf.matmul.__name__ == "matmul" and tf.matmul.__module__ == "subgraphjit"
    assert inspect.signature(tf.matmul) == inspect.signature(tensorflow.matmul)
    assert "Lazily recorded" in tf.matmul.__doc__ and "matmul" in repr(tf.matmul)
    assert pickle.loads(pickle.dumps(tf.matmul)) is tf.matmul
    assert copy.deepcopy(tf.matmul) is tf.matmul

    class Holder:
        total = tf.reduce_sum

    holder = Holder()
    assert holder.total.__self__ is holder and Holder.total is tf.reduce_sum
    x = tensorflow.constant([[0.5, -1.0]])
    tf.set_parameter("mode", "eager")
    try:
        value = tf.reduce_sum(x)
    finally:
        tf.set_parameter("mode", "lazy")
    assert type(value) is type(x)
    np.testing.assert_array_equal(value.numpy(), tensorflow.reduce_sum(x).numpy())
    # (What Keras may take as an activation stays a Python function.)
    assert type(tf.sigmoid) is type(tf.nn.softmax) is types.FunctionType


@pytest.mark.parametrize("arguments", [
    (), (None,), (ALL_ENTRIES[0], len, (), (), None, 1, -1, False),
    (ALL_ENTRIES[0], 5, ("a",), (None,), None, 1, -1, False),
    (ALL_ENTRIES[0], len, ("a", "b"), (None,), None, 1, -1, False),
    (ALL_ENTRIES[0], len, ("a",), (None,), None, 0, -1, False),
    (ALL_ENTRIES[0], len, ("a", "name"), (None, None), None, 1, 0, False),
    (ALL_ENTRIES[0], len, (1,), (None,), None, 1, -1, False),
    (ALL_ENTRIES[0], len, ("a",) * 17, (None,) * 17, None, 1, -1, False),
])
def test_bad_recorders_raise_clean_errors(arguments):
    with pytest.raises((TypeError, ValueError)):
        _native.Recorder(*arguments)
