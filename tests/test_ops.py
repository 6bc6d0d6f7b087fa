"""Differential tests for every op entry: subgraphjit equals eager
TensorFlow -- the spec known at record time, the value, and the gradients --
for one instance, and for several instances evaluated (batched) together.

Each entry has a case: a function of a NumPy random generator returning the
op's arguments, with tensors given as ``Float`` (differentiable), ``Exact``
(ints and bools) or ``Index`` arrays.  An entry without a case fails
``test_every_entry_has_a_case``.
"""

import operator

import numpy as np
import pytest
import tensorflow
from hypothesis import given, settings, strategies

import subgraphjit
from subgraphjit.ir.table import OPERATORS, TF_ENTRIES
from gradients import assert_gradient_equal


class Float:
    """A float tensor argument; gradients are compared for it."""
    def __init__(self, array):
        self.array = np.asarray(array, np.float32)


class Exact:
    """An int or bool tensor argument."""
    def __init__(self, array):
        self.array = np.asarray(array)


class Index(Exact):
    pass


def shape(rng, rank=None, low=1, high=4):
    rank = int(rng.integers(1, 4)) if rank is None else rank
    return tuple(int(d) for d in rng.integers(low, high + 1, size=rank))


def floats(rng, dims, positive=False):
    values = rng.standard_normal(dims)
    return Float(np.abs(values) + 0.5 if positive else values)


def broadcast_pair(rng):
    dims = shape(rng, rank=int(rng.integers(1, 4)))
    other = list(dims)
    for axis in range(len(other)):
        if rng.random() < 0.3:
            other[axis] = 1
    if rng.random() < 0.3:
        other = other[1:] or [1]
    pair = [dims, tuple(other)]
    rng.shuffle(pair)
    return pair


def unary(positive=False, kwargs=None):
    return lambda rng: ([floats(rng, shape(rng), positive)], dict(kwargs or {}))


def binary(positive=False, exact=None):
    def case(rng):
        first, second = broadcast_pair(rng)
        if exact == "bool":
            return [Exact(rng.random(first) < 0.5), Exact(rng.random(second) < 0.5)], {}
        if exact == "int":
            return [Exact(rng.integers(1, 9, first).astype(np.int32)),
                    Exact(rng.integers(1, 9, second).astype(np.int32))], {}
        return [floats(rng, first, positive), floats(rng, second, positive)], {}
    return case


def reduction(rng, exact=False):
    dims = shape(rng)
    axis = None if rng.random() < 0.3 else int(rng.integers(-len(dims), len(dims)))
    x = Exact(rng.random(dims) < 0.5) if exact else floats(rng, dims)
    return [x], {"axis": axis, "keepdims": bool(rng.random() < 0.5)}


def axis_case(rng):
    dims = shape(rng)
    return [floats(rng, dims)], {"axis": int(rng.integers(-len(dims), len(dims)))}


def matmul_case(rng):
    m, k, n = (int(d) for d in rng.integers(1, 5, size=3))
    transpose_a, transpose_b = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    a = floats(rng, (k, m) if transpose_a else (m, k))
    b = floats(rng, (n, k) if transpose_b else (k, n))
    return [a, b], {"transpose_a": transpose_a, "transpose_b": transpose_b}


def list_case(count, same_shape=True):
    def case(rng):
        dims = shape(rng)
        axis = int(rng.integers(0, len(dims)))
        values = [floats(rng, dims) for _ in range(count)]
        return [values], ({} if same_shape else {"axis": axis})
    return case


def reshape_case(rng):
    dims = shape(rng)
    size = int(np.prod(dims))
    return [floats(rng, dims)], {"shape": [-1, size][:1] if rng.random() < 0.5
                                 else [size, 1]}


def transpose_case(rng):
    dims = shape(rng)
    return [floats(rng, dims)], {"perm": rng.permutation(len(dims)).tolist()}


def squeeze_case(rng):
    dims = list(shape(rng))
    axis = int(rng.integers(0, len(dims) + 1))
    dims.insert(axis, 1)
    return [floats(rng, dims)], {"axis": axis}


def split_case(rng):
    dims = list(shape(rng))
    axis = int(rng.integers(0, len(dims)))
    dims[axis] = 3
    splits = 3 if rng.random() < 0.5 else [1, 2]
    return [floats(rng, dims), splits], {"axis": axis}


def gather_case(rng):
    dims = shape(rng, low=2)
    axis = int(rng.integers(0, len(dims)))
    indices = rng.integers(0, dims[axis], size=shape(rng, rank=1))
    return [floats(rng, dims), Index(indices.astype(np.int32))], {"axis": axis}


def embedding_case(rng):
    table = floats(rng, (6, 3))
    ids = rng.integers(0, 6, size=shape(rng, rank=int(rng.integers(1, 3))))
    return [table, Index(ids.astype(np.int32))], {}


def sparse_xent_case(rng):
    rows, classes = (int(d) for d in rng.integers(1, 5, size=2))
    return [], {"labels": Index(rng.integers(0, classes, rows).astype(np.int32)),
                "logits": floats(rng, (rows, classes))}


def dense_xent_case(rng):
    dims = shape(rng, rank=2)
    labels = rng.random(dims)
    return [], {"labels": Float(labels / labels.sum(-1, keepdims=True)),
                "logits": floats(rng, dims)}


ENTRY_CASES = {
    **{entry.name: unary() for entry in TF_ENTRIES if entry.family == "elementwise"},
    "math.log": unary(positive=True), "math.sqrt": unary(positive=True),
    "math.rsqrt": unary(positive=True), "math.reciprocal": unary(positive=True),
    "math.log1p": unary(positive=True),
    "nn.leaky_relu": unary(kwargs={"alpha": 0.1}),
    "cast": lambda rng: ([floats(rng, shape(rng))], {"dtype": tensorflow.int32}),
    "math.logical_not": lambda rng: ([Exact(rng.random(shape(rng)) < 0.5)], {}),
    **{entry.name: binary() for entry in TF_ENTRIES if entry.family == "broadcasting"},
    "math.pow": binary(positive=True),
    "math.floordiv": binary(exact="int"), "math.floormod": binary(exact="int"),
    "math.logical_and": binary(exact="bool"), "math.logical_or": binary(exact="bool"),
    "nn.bias_add": lambda rng: ([floats(rng, (2, 3)), floats(rng, (3,))], {}),
    "clip_by_value": lambda rng: ([floats(rng, shape(rng)), -0.5, 0.5], {}),
    **{entry.name: reduction for entry in TF_ENTRIES if entry.family == "reduction"},
    "math.reduce_any": lambda rng: reduction(rng, exact=True),
    "math.reduce_all": lambda rng: reduction(rng, exact=True),
    "math.argmax": axis_case, "math.argmin": axis_case,
    "nn.softmax": axis_case, "nn.log_softmax": axis_case,
    "linalg.matmul": matmul_case,
    "tensordot": lambda rng: ([floats(rng, (2, 3)), floats(rng, (3, 4))], {"axes": 1}),
    "reshape": reshape_case, "transpose": transpose_case,
    "expand_dims": axis_case, "squeeze": squeeze_case,
    "tile": lambda rng: ([floats(rng, (2, 3))], {"multiples": [2, 1]}),
    "reverse": lambda rng: ([floats(rng, (2, 3))], {"axis": [int(rng.integers(0, 2))]}),
    "concat": list_case(2, same_shape=False), "stack": list_case(3, same_shape=False),
    "math.add_n": list_case(3),
    "split": split_case,
    "unstack": lambda rng: ([floats(rng, (2, 3))], {"axis": int(rng.integers(0, 2))}),
    "gather": gather_case, "nn.embedding_lookup": embedding_case,
    "one_hot": lambda rng: ([Index(rng.integers(0, 4, size=3).astype(np.int32)), 4], {}),
    "nn.sparse_softmax_cross_entropy_with_logits": sparse_xent_case,
    "nn.softmax_cross_entropy_with_logits": dense_xent_case,
    "nn.sigmoid_cross_entropy_with_logits": lambda rng: (
        [], {"labels": Float(rng.random((2, 3))), "logits": floats(rng, (2, 3))}),
    "zeros": lambda rng: ([list(shape(rng))], {}),
    "ones": lambda rng: ([tuple(shape(rng))], {"dtype": tensorflow.int32}),
}


def test_every_entry_has_a_case():
    assert set(ENTRY_CASES) == {entry.name for entry in TF_ENTRIES}


# -- running a case both ways -------------------------------------------------

def resolve(module, path):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def realise(argument, lazy, variables):
    """Turn a case argument into a real tensor (a Variable for floats, to
    take gradients), and for lazy runs into a VirtualNode around it."""
    if isinstance(argument, list):
        return [realise(item, lazy, variables) for item in argument]
    if isinstance(argument, Float):
        variable = tensorflow.Variable(argument.array)
        variables.append(variable)
        return subgraphjit.identity(variable) if lazy else variable
    if isinstance(argument, Exact):
        tensor = tensorflow.constant(argument.array)
        return subgraphjit.identity(tensor) if lazy else tensor
    return argument


def run(function, args, kwargs, lazy):
    """Outputs and gradients of ``sum(output * weights)`` for each output."""
    variables = []
    with tensorflow.GradientTape(persistent=True) as tape:
        real_args = [realise(a, lazy, variables) for a in args]
        real_kwargs = {k: realise(v, lazy, variables) for k, v in kwargs.items()}
        result = function(*real_args, **real_kwargs)
        outputs = result if isinstance(result, list) else [result]
        specs = [(o.dtype, tuple(o.shape)) for o in outputs]
        if lazy:
            outputs = subgraphjit.build(outputs)
        targets = [tensorflow.reduce_sum(tensorflow.cast(o, tensorflow.float32)
                                         * (1.0 + np.arange(np.prod(o.shape)).reshape(o.shape) % 3))
                   for o in outputs if o.dtype.is_floating]
        total = tensorflow.add_n(targets) if targets else None
    gradients = ([tape.gradient(total, v) for v in variables]
                 if total is not None else [])
    return outputs, specs, gradients


def assert_same(lazy, eager):
    lazy_outputs, lazy_specs, lazy_gradients = lazy
    eager_outputs, _, eager_gradients = eager
    assert lazy_specs == [(o.dtype, tuple(o.shape)) for o in eager_outputs]
    for got, expected in zip(lazy_outputs, eager_outputs):
        assert got.dtype == expected.dtype
        if expected.dtype.is_floating:
            np.testing.assert_allclose(got.numpy(), expected.numpy(),
                                       rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got.numpy(), expected.numpy())
    assert len(lazy_gradients) == len(eager_gradients)
    for got, expected in zip(lazy_gradients, eager_gradients):
        assert_gradient_equal(got, expected, atol=1e-5)


@pytest.mark.parametrize("entry_name", sorted(ENTRY_CASES))
@settings(max_examples=6, deadline=None)
@given(seed=strategies.integers(0, 2**32 - 1))
def test_entry_equals_eager(entry_name, seed):
    args, kwargs = ENTRY_CASES[entry_name](np.random.default_rng(seed))
    assert_same(run(resolve(subgraphjit, entry_name), args, kwargs, lazy=True),
                run(resolve(tensorflow, entry_name), args, kwargs, lazy=False))


# Entries that run per instance by design (see subgraphjit/batcher/rules.py).
NO_BATCH_RULE = set()


@pytest.mark.parametrize("entry_name", sorted(ENTRY_CASES))
def test_entry_batched_over_instances_equals_eager(entry_name):
    """Three instances of equal shapes, new values each, evaluated together:
    one batched op, whose rows must equal the op run on each instance."""
    args, kwargs = ENTRY_CASES[entry_name](np.random.default_rng(len(entry_name)))
    cases = [(args, kwargs)]
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        cases.append(([_refill(a, rng) for a in args],
                      {k: _refill(v, rng) for k, v in kwargs.items()}))
    lazy_function = resolve(subgraphjit, entry_name)
    results = [lazy_function(*[realise(a, True, []) for a in case_args],
                             **{k: realise(v, True, []) for k, v in case_kwargs.items()})
               for case_args, case_kwargs in cases]
    subgraphjit.reset_stats()
    built = subgraphjit.build(results)
    unbatched = subgraphjit.stats()["unbatched"]
    if entry_name not in NO_BATCH_RULE:
        assert not unbatched, unbatched
    eager_function = resolve(tensorflow, entry_name)
    for value, (case_args, case_kwargs) in zip(built, cases):
        expected = eager_function(
            *[realise(a, False, []) for a in case_args],
            **{k: realise(v, False, []) for k, v in case_kwargs.items()})
        for got, want in zip(value if isinstance(value, list) else [value],
                             expected if isinstance(expected, list) else [expected]):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(np.asarray(got, np.float64),
                                       np.asarray(want, np.float64),
                                       rtol=1e-5, atol=1e-6)


def _refill(argument, rng):
    """The same argument with new random values of the same shape (floats
    stay positive where the case made them positive)."""
    if isinstance(argument, list):
        return [_refill(item, rng) for item in argument]
    if isinstance(argument, Float):
        values = rng.standard_normal(argument.array.shape)
        return Float(np.abs(values) + 0.5 if argument.array.min() > 0 else values)
    return argument


# -- operators, slicing, and the special wrappers ---------------------------

OPERAND_KINDS = ["tensor-tensor", "tensor-int", "tensor-float", "int-tensor",
                 "float-tensor"]


@pytest.mark.parametrize("dunder", sorted(OPERATORS))
@pytest.mark.parametrize("kind", OPERAND_KINDS)
def test_operator_equals_eager(dunder, kind):
    name, python_operator, arity = OPERATORS[dunder]
    rng = np.random.default_rng(len(dunder) + len(kind))
    integer = name in ("and", "or", "xor", "invert", "mod", "floordiv")
    make = (lambda: Exact(rng.integers(1, 5, (2, 3)).astype(np.int32))) if integer \
        else (lambda: floats(rng, (2, 3), positive=name == "pow"))
    if name in ("and", "or", "xor", "invert"):
        make = lambda: Exact(rng.random((2, 3)) < 0.5)  # noqa: E731
    if arity == 1:
        if kind != "tensor-tensor":
            pytest.skip("unary operators take one tensor")
        args = [make()]
    elif name == "matmul":
        if kind != "tensor-tensor":
            pytest.skip("@ takes two tensors")
        args = [floats(rng, (2, 3)), floats(rng, (3, 2))]
    else:
        scalar = {"int": 2, "float": 1.5}.get(kind.split("-")[-1 if kind.startswith("tensor") else 0])
        if scalar is not None and (integer and isinstance(scalar, float)
                                   or name in ("and", "or", "xor")):
            pytest.skip("no such Python scalar for this operator")
        if kind == "tensor-tensor":
            args = [make(), make()]
        elif kind.startswith("tensor"):
            args = [make(), scalar]
        else:
            args = [scalar, make()]
    function = python_operator
    assert_same(run(function, args, {}, lazy=True), run(function, args, {}, lazy=False))


SLICES = [
    (0,), (-1,), (slice(1, None),), (slice(None, None, 2),),
    (slice(None), 1), (Ellipsis, 0), (tensorflow.newaxis, slice(None)),
    (slice(None, -1), slice(None, None, -1)),
]


@pytest.mark.parametrize("slice_spec", SLICES, ids=repr)
def test_slicing_equals_eager(slice_spec):
    x = floats(np.random.default_rng(0), (3, 4))
    key = slice_spec[0] if len(slice_spec) == 1 else slice_spec
    function = lambda tensor: tensor[key]  # noqa: E731
    assert_same(run(function, [x], {}, lazy=True), run(function, [x], {}, lazy=False))


def test_shape_is_static():
    node = subgraphjit.tanh(tensorflow.ones((2, 5)))
    shape_tensor = subgraphjit.shape(node)
    assert node.result is None and node.batched is None  # nothing evaluated
    np.testing.assert_array_equal(shape_tensor.numpy(), [2, 5])


def test_dropout_draws_the_same_masks_as_eager():
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    tensorflow.random.set_seed(7)
    eager = [tensorflow.nn.dropout(tensorflow.constant(x), 0.5) for _ in range(2)]
    tensorflow.random.set_seed(7)
    lazy = [subgraphjit.nn.dropout(subgraphjit.identity(x), 0.5) for _ in range(2)]
    for got, want in zip(subgraphjit.build(lazy), eager):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not np.array_equal(eager[0].numpy(), eager[1].numpy())


def test_multi_output_split_and_unstack():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for lazy, eager in [
            (subgraphjit.split(subgraphjit.identity(x), [1, 3], axis=1),
             tensorflow.split(x, [1, 3], axis=1)),
            (subgraphjit.unstack(subgraphjit.identity(x)), tensorflow.unstack(x))]:
        assert [part.shape for part in lazy] == [part.shape for part in eager]
        for got, want in zip(subgraphjit.build(lazy), eager):
            np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_shape_errors_match_tensorflow():
    for lazy, eager in [
            (lambda: subgraphjit.add(subgraphjit.identity(np.ones(3, np.float32)),
                                     np.ones(4, np.float32)),
             lambda: tensorflow.add(np.ones(3, np.float32), np.ones(4, np.float32))),
            (lambda: subgraphjit.identity(np.ones((2, 3), np.float32))
             @ subgraphjit.identity(np.ones((2, 3), np.float32)),
             lambda: tensorflow.ones((2, 3)) @ np.ones((2, 3), np.float32))]:
        with pytest.raises(Exception) as eager_error:
            eager()
        with pytest.raises(Exception) as lazy_error:
            lazy()
        assert type(lazy_error.value) is type(eager_error.value)
        assert any(__file__ in note for note in lazy_error.value.__notes__)


def test_binary_operators_cover_python_scalars_with_broadcasting():
    x = tensorflow.constant([[1.0, 2.0, 3.0]])
    node = subgraphjit.identity(x)
    pairs = [(2 - node, 2 - x), (node / 4, x / 4), (3 ** node, 3 ** x),
             (operator.mul(np.float32(2), node), np.float32(2) * x)]
    for lazy, eager in pairs:
        np.testing.assert_allclose(np.asarray(lazy), eager.numpy(), rtol=1e-6)


def test_ops_of_no_tensors_record_only_outside_traces():
    """tf.zeros records a node in eager code; inside a tf.function trace,
    where no operand would tell, TensorFlow's own runs; a variable made
    from one gets its value."""
    node = subgraphjit.zeros((2, 3))
    assert type(node) is subgraphjit.VirtualNode and node.shape == (2, 3)

    @tensorflow.function
    def traced(x):
        zeros = subgraphjit.ones([2], tensorflow.int32)
        assert isinstance(zeros, tensorflow.Tensor)
        return x + zeros

    np.testing.assert_array_equal(traced(tensorflow.constant([1, 2])), [2, 3])
    variable = tensorflow.Variable(subgraphjit.zeros([3]))
    np.testing.assert_array_equal(variable.numpy(), np.zeros(3, np.float32))
    subgraphjit.set_parameter("mode", "eager")
    try:
        assert isinstance(subgraphjit.zeros([1]), tensorflow.Tensor)
    finally:
        subgraphjit.set_parameter("mode", "lazy")


@pytest.mark.parametrize("call", [
    lambda tf, a, b: tf.matmul(a, b),
    lambda tf, a, b: tf.matmul(a, b, transpose_b=True),      # a middle default given
    lambda tf, a, b: tf.matmul(a, b, False, True, name="mm"),  # the last one given
    lambda tf, a, b: tf.matmul(a, b, transpose_a=0),         # refused by TensorFlow
    lambda tf, a, b: tf.reduce_sum(a, 1, True),
    lambda tf, a, b: tf.reduce_sum(a, keepdims=True),
    lambda tf, a, b: tf.concat([a, b], axis=1),
    lambda tf, a, b: tf.split(a, 3, axis=1),
    lambda tf, a, b: tf.zeros((2, 3), tensorflow.int32),
    lambda tf, a, b: tf.nn.embedding_lookup(b, [2, 0], max_norm=1.0),
], ids=["defaults", "middle", "last", "refused", "positional", "keyword", "concat",
        "split", "no tensors", "lookup"])
def test_eager_calls_pass_the_users_arguments_as_tensorflow_gets_them(call):
    """With nothing recorded, the wrappers pass on only the arguments up to
    the last one given (ir/record.py, ``_passing_on``): whichever that is,
    the result is TensorFlow's."""
    a, b = (np.random.default_rng(5).normal(size=(2, 3, 3)).astype(np.float32))

    def outcome(module):
        try:
            return call(module, a, b)
        except TypeError as error:   # TensorFlow's own, on an argument it refuses
            return error

    expected = outcome(tensorflow)
    subgraphjit.set_parameter("mode", "eager")
    try:
        got = outcome(subgraphjit)
    finally:
        subgraphjit.set_parameter("mode", "lazy")
    if isinstance(expected, TypeError):
        assert type(got) is TypeError and str(got) == str(expected)
        return
    for value, reference in zip(tensorflow.nest.flatten(got), tensorflow.nest.flatten(expected)):
        assert type(value) is type(reference) and value.dtype == reference.dtype
        np.testing.assert_allclose(value.numpy(), reference.numpy(), rtol=1e-6)
