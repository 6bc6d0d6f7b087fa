"""Depth-limited signatures: equal exactly when the subgraphs are equal."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.patterns import signature as signatures
from subgraphjit.patterns.signature import Signer


def cell(x, h, weight):
    """A small recurrent cell: tanh(x @ W + h) * sigmoid(h)."""
    return tf.tanh(tf.matmul(x, weight) + h) * tf.sigmoid(h)


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    return [tensorflow.Variable(rng.standard_normal((3, 3)).astype(np.float32))
            for _ in range(2)]


def leaf(*shape):
    return tf.identity(np.ones(shape, np.float32))


def test_equal_subgraphs_have_equal_signatures(weights):
    signer = Signer()
    h = leaf(1, 3)
    root = cell(leaf(1, 3), h, weights[0])
    a = signer.walk(root, 3)
    b = signer.walk(cell(leaf(1, 3), leaf(1, 3), weights[0]), 3)
    assert a.signature == b.signature and hash(a.signature) == hash(b.signature)
    # Depth 3 from the multiply stops at the matmul and at h; h, reached
    # again through the sigmoid, is an input once.
    matmul = root.inputs[0].inputs[0].inputs[0]
    assert [node.id for node in a.inputs] == [matmul.id, h.id]
    assert len(a.nodes) == 4  # add, tanh, sigmoid, multiply


def test_ops_attributes_constants_and_parameters_distinguish(weights):
    signer = Signer()
    x, h = leaf(1, 3), leaf(1, 3)
    base = signer.walk(cell(x, h, weights[0]), 4).signature
    other_weight = signer.walk(cell(x, h, weights[1]), 4).signature
    other_op = signer.walk(tf.tanh(tf.matmul(x, weights[0]) + h) * tf.tanh(h), 4).signature
    transposed = signer.walk(tf.tanh(tf.matmul(x, weights[0], transpose_b=True) + h)
                             * tf.sigmoid(h), 4).signature
    scaled = [signer.walk(tf.sigmoid(x) * c, 2).signature for c in (0.5, 0.25, 1)]
    assert len({base, other_weight, other_op, transposed}) == 4
    assert len(set(scaled)) == 3  # 0.5, 0.25 and the int 1 all differ


def test_the_depth_limit_cuts_the_walk():
    signer = Signer()
    x, y = leaf(1, 3), leaf(1, 3)
    deep_x = tf.exp(tf.tanh(x))
    deep_y = tf.exp(tf.sigmoid(y))
    assert signer.walk(deep_x, 1).signature == signer.walk(deep_y, 1).signature
    assert signer.walk(deep_x, 2).signature != signer.walk(deep_y, 2).signature
    walk = signer.walk(deep_x, 1)
    assert len(walk.nodes) == 1 and walk.inputs[0] is deep_x.inputs[0]


def test_shared_nodes_are_marked_not_walked_twice():
    """Thesis figure 5.1: a diamond differs from the tree of the same ops."""
    signer = Signer()
    x, c = leaf(1, 3), leaf(1, 3)
    shared = tf.tanh(x)
    diamond = (c * shared) + (shared * c)
    tree = (c * tf.tanh(x)) + (tf.tanh(x) * c)
    diamond_walk, tree_walk = signer.walk(diamond, 3), signer.walk(tree, 3)
    assert diamond_walk.signature != tree_walk.signature
    assert sum(node is shared for node in diamond_walk.nodes) == 1


def test_equivalence_levels():
    x3, x4 = leaf(1, 3), leaf(1, 4)
    by_shape, by_structure = Signer("shape"), Signer("structure")
    assert by_shape.walk(tf.tanh(x3), 2).signature != by_shape.walk(tf.tanh(x4), 2).signature
    assert (by_structure.walk(tf.tanh(x3), 2).signature
            == by_structure.walk(tf.tanh(x4), 2).signature)
    ints = tf.identity(np.ones((1, 3), np.int32))
    assert (by_structure.walk(tf.abs(x3), 2).signature
            != by_structure.walk(tf.abs(ints), 2).signature)  # dtypes still count
    with pytest.raises(ValueError, match="shape"):
        Signer("exact")


def test_a_hash_collision_never_makes_subgraphs_equal(monkeypatch):
    monkeypatch.setattr(signatures, "digest_of", lambda data: 42)
    signer = Signer()
    x = leaf(1, 3)
    a, b = signer.walk(tf.tanh(x), 2).signature, signer.walk(tf.sigmoid(x), 2).signature
    assert a.digest == b.digest == 42
    assert a != b and len({a, b}) == 2


def test_no_subgraph_is_hashed_twice():
    signer = Signer()
    x = leaf(1, 3)
    chain = x
    for _ in range(50):
        chain = tf.tanh(chain)
    roots = [chain]
    node = chain
    for _ in range(49):  # every node of the chain as a root, depth 10
        node = node.inputs[0]
        roots.append(node)
    for root in roots:
        signer.walk(root, 10)
    first = signer.nodes_hashed
    for root in roots:
        signer.walk(root, 10)
    assert signer.nodes_hashed == first  # the second pass: all memoized


def test_memoized_walks_equal_fresh_walks(weights):
    x, h = leaf(1, 3), leaf(1, 3)
    roots = [cell(x, h, weights[0]) for _ in range(3)]
    memoized = Signer()
    for root in roots:
        memoized.walk(root, 4)
    again = [memoized.walk(root, 4) for root in roots]
    fresh = [Signer().walk(root, 4) for root in roots]
    for a, b in zip(again, fresh):
        assert a.signature == b.signature
        assert [id(i) for i in a.inputs] == [id(i) for i in b.inputs]
        assert [n.id for n in a.nodes] == [n.id for n in b.nodes]


def test_a_lookups_list_of_rows_is_a_pattern_argument_other_values_stop_walks(weights):
    """A lookup by a Python list of rows (a tree's leaf) may be inside a
    pattern, the list an argument of it; a lookup by a NumPy array or by a
    row out of the table (whose error must name its own line), a loss's
    list of labels and a NumPy scalar keep their nodes out
    (``has_value_operand``)."""
    table = weights[0]   # (3 rows)
    by_list = tf.nn.embedding_lookup(table, [2, 0])
    # (Of by_list's spec: recorded without running the op on stand-ins.)
    assert signatures.has_value_operand(tf.nn.embedding_lookup(table, [2, 3]))
    assert signatures.has_value_operand(tf.nn.embedding_lookup(table, [-1, 0]))
    by_array = tf.nn.embedding_lookup(table, np.array([2, 0]))
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=[1], logits=leaf(1, 3))
    scaled = tf.multiply(leaf(1, 3), np.float32(2))
    assert not signatures.has_value_operand(by_list)
    assert signatures.has_value_operand(by_array)
    assert signatures.has_value_operand(loss)
    assert signatures.has_value_operand(scaled)
    # (By identity: a node's == is TensorFlow's, element by element.)
    walk = Signer(for_patterns=True).walk(tf.matmul(by_list, weights[1]), 3)
    assert any(node is by_list for node in walk.nodes)
    assert any(value is by_list.inputs[1] for value in walk.inputs)
    stopped = Signer(for_patterns=True).walk(tf.matmul(by_array, weights[1]), 3)
    assert not any(node is by_array for node in stopped.nodes)
    assert any(value is by_array for value in stopped.inputs)
