"""Small dynamic models written as plain eager TensorFlow against a module
``tf`` (``tensorflow`` or ``subgraphjit``): the differential tests run each
one both ways and compare losses and gradients, and ``subgraphjit tune
--schedulers`` compares the batching schedulers on each.

Each model is a class with ``variables`` and ``loss(tf, example)``; each has
a ``random_examples(rng, count)`` making inputs of varying structure.
"""

import functools

import numpy as np
import tensorflow


def _weight(rng, *shape, scale=0.3):
    return tensorflow.Variable(
        (rng.standard_normal(shape) * scale).astype(np.float32))


def random_tree(rng, leaves, vocabulary):
    if leaves == 1:
        return int(rng.integers(vocabulary))
    left = int(rng.integers(1, leaves))
    return (random_tree(rng, left, vocabulary),
            random_tree(rng, leaves - left, vocabulary))


class TreeModel:
    vocabulary, classes = 30, 3

    def random_examples(self, rng, count):
        return [(random_tree(rng, int(rng.integers(1, 12)), self.vocabulary),
                 int(rng.integers(self.classes))) for _ in range(count)]

    def loss(self, tf, example):
        tree, label = example
        hidden = self.encode(tf, tree)[0]
        logits = tf.matmul(hidden, self.output)
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=[label], logits=logits))


class TreeLSTM(TreeModel):
    def __init__(self, rng, embed=6, hidden=5):
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.leaf = _weight(rng, embed, 3 * hidden)
        self.internal = _weight(rng, 2 * hidden, 5 * hidden)
        self.bias = _weight(rng, 1, 5 * hidden)
        self.output = _weight(rng, hidden, self.classes)
        self.variables = [self.embedding, self.leaf, self.internal, self.bias,
                          self.output]

    def cells(self, tf):
        """The leaf cell and the internal cell, as ``encode`` calls them."""
        return (functools.partial(self.leaf_cell, tf),
                functools.partial(self.internal_cell, tf))

    def leaf_cell(self, tf, x):
        i, o, u = tf.split(tf.matmul(x, self.leaf), 3, axis=1)
        c = tf.sigmoid(i) * tf.tanh(u)
        return tf.sigmoid(o) * tf.tanh(c), c

    def internal_cell(self, tf, hl, cl, hr, cr, weight=None):
        weight = self.internal if weight is None else weight
        z = tf.matmul(tf.concat([hl, hr], axis=1), weight) + self.bias
        i, fl, fr, o, u = tf.split(z, 5, axis=1)
        c = tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(fl) * cl + tf.sigmoid(fr) * cr
        return tf.sigmoid(o) * tf.tanh(c), c

    def encode(self, tf, tree):
        leaf_cell, internal_cell = self.cells(tf)
        if isinstance(tree, int):
            return leaf_cell(tf.nn.embedding_lookup(self.embedding, [tree]))
        (hl, cl), (hr, cr) = self.encode(tf, tree[0]), self.encode(tf, tree[1])
        return internal_cell(hl, cl, hr, cr)


class ChildSumTreeLSTM(TreeModel):
    """Tai et al.'s child-sum Tree-LSTM as public examples write it:
    vectors without a leading axis of one, ``tf.zeros(...)[:] + ...`` and
    ``h_sum += h``, the matrix-vector idiom ``tensordot(W, x, axes=1)``.
    The cell's arithmetic calls the real ``tensorflow`` module, as a
    library written against TensorFlow would: under subgraphjit it gets
    nodes and records through TensorFlow's dispatch (dropin/dispatch.py)."""

    def __init__(self, rng, embed=6, hidden=5):
        self.hidden = hidden
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.input_iou = _weight(rng, 3 * hidden, embed)
        self.hidden_iou = _weight(rng, 3 * hidden, hidden)
        self.bias_iou = _weight(rng, 3 * hidden)
        self.hidden_f = _weight(rng, hidden, hidden)
        self.bias_f = _weight(rng, hidden)
        self.output = _weight(rng, hidden, self.classes)
        self.variables = [self.embedding, self.input_iou, self.hidden_iou,
                          self.bias_iou, self.hidden_f, self.bias_f, self.output]

    def loss(self, tf, example):
        tree, label = example
        hidden = self.encode(tf, tree)[0]
        logits = tensorflow.reshape(tensorflow.tensordot(hidden, self.output, axes=1),
                                    (1, self.classes))
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=[label], logits=logits))

    def encode(self, tf, tree):
        children = [] if isinstance(tree, int) else [self.encode(tf, child)
                                                     for child in tree]
        h_sum = tf.zeros((self.hidden,))
        for h, _ in children:
            h_sum += h
        iou = tf.zeros((3 * self.hidden,))[:] + self.bias_iou
        iou += tensorflow.tensordot(self.hidden_iou, h_sum, axes=1)
        if isinstance(tree, int):
            x = tf.nn.embedding_lookup(self.embedding, tree)
            iou += tensorflow.tensordot(self.input_iou, x, axes=1)
        i, o, u = tensorflow.split(iou, 3)
        c = tensorflow.sigmoid(i) * tensorflow.tanh(u)
        for h, child_c in children:
            f = tensorflow.sigmoid(tensorflow.tensordot(self.hidden_f, h, axes=1)
                                   + self.bias_f)
            c += f * child_c
        return tensorflow.sigmoid(o) * tensorflow.tanh(c), c


class TreeLSTM2Type(TreeLSTM):
    """ED-Batch's TreeLSTM-2Type: every internal node is one of two cells
    with weights of their own, chosen at random, so a tree holds two
    internal node types that a scheduler must interleave well."""

    def __init__(self, rng, embed=6, hidden=5):
        super().__init__(rng, embed, hidden)
        self.internal_other = _weight(rng, 2 * hidden, 5 * hidden)
        self.variables.append(self.internal_other)

    def random_examples(self, rng, count):
        def assign_kinds(tree):
            if isinstance(tree, int):
                return tree
            return (int(rng.integers(2)), assign_kinds(tree[0]),
                    assign_kinds(tree[1]))
        return [(assign_kinds(tree), label)
                for tree, label in super().random_examples(rng, count)]

    def encode(self, tf, tree):
        if isinstance(tree, int):
            return super().encode(tf, tree)
        kind, left, right = tree
        (hl, cl), (hr, cr) = self.encode(tf, left), self.encode(tf, right)
        return self.internal_cell(tf, hl, cl, hr, cr,
                                  self.internal if kind == 0 else self.internal_other)


class TreeGRU(TreeModel):
    def __init__(self, rng, embed=6, hidden=5):
        self.hidden = hidden
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.leaf = _weight(rng, embed, hidden)
        self.gates = _weight(rng, 2 * hidden, 3 * hidden)
        self.candidate = _weight(rng, 2 * hidden, hidden)
        self.output = _weight(rng, hidden, self.classes)
        self.variables = [self.embedding, self.leaf, self.gates,
                          self.candidate, self.output]

    def encode(self, tf, tree):
        if isinstance(tree, int):
            x = tf.gather(self.embedding, [tree])
            return (tf.tanh(tf.matmul(x, self.leaf)),)
        left, right = self.encode(tf, tree[0])[0], self.encode(tf, tree[1])[0]
        children = tf.concat([left, right], 1)
        reset_left, reset_right, update = tf.split(
            tf.sigmoid(tf.matmul(children, self.gates)), 3, axis=1)
        reset = tf.concat([reset_left * left, reset_right * right], 1)
        candidate = tf.tanh(tf.matmul(reset, self.candidate))
        return (update * (left + right) / 2 + (1.0 - update) * candidate,)


class FunctionTreeLSTM(TreeLSTM):
    """The Tree-LSTM with its two cells in ``tf.function``, as TensorFlow's
    guides advise.  Under subgraphjit a ``tf.function`` given nodes records
    its body (``subgraphjit/dropin/functions.py``); eagerly each call runs
    the traced graph."""

    def __init__(self, rng, embed=6, hidden=5):
        super().__init__(rng, embed, hidden)
        self._functions = {}

    def cells(self, tf):
        """This module's ``tf.function`` of each cell, made once (as a
        decorator in a module that imports ``tf`` would)."""
        if tf not in self._functions:
            self._functions[tf] = tuple(map(tf.function, super().cells(tf)))
        return self._functions[tf]


class _Tree:
    """A tree and the module the model code calls, as one keyword argument
    (Keras 3 converts a nest of numbers; it leaves an object alone)."""

    def __init__(self, shape, tf):
        self.shape, self.tf = shape, tf


def _keras_network(rng, embed, hidden):
    """A ``keras.Model`` subclass whose ``call`` recurses over a tree: a
    Tree-GRU whose leaf projection, gates and candidate are ``Dense``
    layers (variables built at once, from ``rng``'s seeds)."""
    import keras

    def dense(units, inputs, activation=None):
        layer = keras.layers.Dense(units, activation=activation,
                                   kernel_initializer=keras.initializers.RandomNormal(
                                       stddev=0.3, seed=int(rng.integers(2**30))),
                                   bias_initializer="zeros")
        layer.build((None, inputs))
        return layer

    class TreeGRUNetwork(keras.Model):
        def __init__(self):
            super().__init__()
            self.leaf = dense(hidden, embed, "tanh")
            self.gates = dense(3 * hidden, 2 * hidden, "sigmoid")
            self.candidate = dense(hidden, 2 * hidden, "tanh")

        def state(self, tf, tree, embedding):
            if isinstance(tree, int):
                return self.leaf(tf.gather(embedding, [tree]))
            left = self.state(tf, tree[0], embedding)
            right = self.state(tf, tree[1], embedding)
            reset_left, reset_right, update = tf.split(
                self.gates(tf.concat([left, right], 1)), 3, axis=1)
            candidate = self.candidate(tf.concat([reset_left * left, reset_right * right], 1))
            return update * (left + right) / 2 + (1.0 - update) * candidate

        def call(self, tree, embedding):
            return self.state(tree.tf, tree.shape, embedding)

    return TreeGRUNetwork()


class KerasTreeGRU(TreeModel):
    """A Tree-GRU as a Keras user writes it: a subclassed ``keras.Model``
    whose ``call`` recurses over the tree through ``Dense`` layers."""

    def __init__(self, rng, embed=6, hidden=5):
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.network = _keras_network(rng, embed, hidden)
        self.output = _weight(rng, hidden, self.classes)
        self.variables = [self.embedding, self.output, *self.network.trainable_variables]

    def encode(self, tf, tree):
        return (self.network(tree=_Tree(tree, tf), embedding=self.embedding),)


class MVRNN(TreeModel):
    """Matrix-vector RNN: every node has a vector and a matrix, and a parent
    multiplies each child's vector by the other child's matrix -- a product
    of two activations, the case operator batching of weights cannot cover."""

    def __init__(self, rng, size=4):
        self.size = size
        self.vectors = _weight(rng, self.vocabulary, size)
        self.matrices = _weight(rng, self.vocabulary, size * size, scale=0.2)
        self.combine = _weight(rng, 2 * size, size)
        self.combine_matrices = _weight(rng, size, 2 * size, scale=0.2)
        self.output = _weight(rng, size, self.classes)
        self.variables = [self.vectors, self.matrices, self.combine,
                          self.combine_matrices, self.output]

    def encode(self, tf, tree):
        if isinstance(tree, int):
            vector = tf.reshape(tf.gather(self.vectors, tree), (1, self.size))
            matrix = tf.reshape(tf.gather(self.matrices, tree),
                                (self.size, self.size)) + tf.eye(self.size)
            return vector, matrix
        (a, A), (b, B) = self.encode(tf, tree[0]), self.encode(tf, tree[1])
        vector = tf.tanh(tf.matmul(
            tf.concat([tf.matmul(a, B), tf.matmul(b, A)], 1), self.combine))
        matrix = tf.matmul(self.combine_matrices, tf.concat([A, B], 0))
        return vector, matrix


class SequenceModel:
    vocabulary, classes = 20, 4

    def random_examples(self, rng, count):
        examples = []
        for _ in range(count):
            length = int(rng.integers(1, 9))
            examples.append((rng.integers(self.vocabulary, size=length).tolist(),
                             rng.integers(self.classes, size=length).tolist()))
        return examples


def lstm_cell(tf, x, h, c, weight, bias):
    i, f, o, u = tf.split(tf.matmul(tf.concat([x, h], 1), weight) + bias, 4, 1)
    c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(u)
    return tf.sigmoid(o) * tf.tanh(c), c


class BiLSTMTagger(SequenceModel):
    def __init__(self, rng, embed=5, hidden=4):
        self.hidden = hidden
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.forward = _weight(rng, embed + hidden, 4 * hidden)
        self.backward = _weight(rng, embed + hidden, 4 * hidden)
        self.bias = _weight(rng, 1, 4 * hidden)
        self.output = _weight(rng, 2 * hidden, self.classes)
        self.variables = [self.embedding, self.forward, self.backward,
                          self.bias, self.output]

    def run(self, tf, inputs, weight):
        h = c = tf.zeros((1, self.hidden))
        states = []
        for x in inputs:
            h, c = lstm_cell(tf, x, h, c, weight, self.bias)
            states.append(h)
        return states

    def loss(self, tf, example):
        words, tags = example
        inputs = [tf.nn.embedding_lookup(self.embedding, [w]) for w in words]
        forward = self.run(tf, inputs, self.forward)
        backward = self.run(tf, inputs[::-1], self.backward)[::-1]
        losses = []
        for f, b, tag in zip(forward, backward, tags):
            logits = tf.matmul(tf.concat([f, b], 1), self.output)
            losses.append(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=[tag], logits=logits))
        return tf.reduce_sum(tf.add_n(losses))


class LatticeLSTM(SequenceModel):
    """A character LSTM chain with word cells jumping over spans, as in the
    lattice LSTM for Chinese NER: a word cell reads the character state
    where the word starts and gates its memory into the character cell where
    the word ends.  An example is (characters, tags, words), each word an
    inclusive (start, end) span of two or more characters
    (``experiments/weibo_ner.py`` makes them from a real lexicon)."""

    def __init__(self, rng, embed=5, hidden=4, vocabulary=None, classes=None):
        self.vocabulary = vocabulary or self.vocabulary
        self.classes = classes or self.classes
        self.hidden = hidden
        self.embedding = _weight(rng, self.vocabulary, embed)
        self.char = _weight(rng, embed + hidden, 4 * hidden)
        self.word = _weight(rng, embed + hidden, 3 * hidden)
        self.merge = _weight(rng, embed + hidden, hidden)
        self.bias = _weight(rng, 1, 4 * hidden)
        self.output = _weight(rng, hidden, self.classes)
        self.variables = [self.embedding, self.char, self.word, self.merge,
                          self.bias, self.output]

    def random_examples(self, rng, count):
        examples = []
        for chars, tags in super().random_examples(rng, count):
            words = [(end - length + 1, end) for end in range(len(chars))
                     for length in (2, 3)
                     if end - length + 1 >= 0 and rng.random() < 0.35]
            examples.append((chars, tags, words))
        return examples

    def loss(self, tf, example):
        chars, tags, words = example
        words_ending_at = {}
        for start, end in words:
            words_ending_at.setdefault(end, []).append(start)
        h = c = tf.zeros((1, self.hidden))
        hs, cs, losses = [], [], []
        for position, char in enumerate(chars):
            x = tf.nn.embedding_lookup(self.embedding, [char])
            h, c = lstm_cell(tf, x, h, c, self.char, self.bias)
            for start in words_ending_at.get(position, ()):
                word_input = tf.concat([x, hs[start]], 1)
                i, f, u = tf.split(tf.matmul(word_input, self.word), 3, 1)
                word_memory = tf.sigmoid(f) * cs[start] + tf.sigmoid(i) * tf.tanh(u)
                gate = tf.sigmoid(tf.matmul(tf.concat([x, word_memory], 1),
                                            self.merge))
                c = gate * word_memory + (1.0 - gate) * c
            hs.append(h)
            cs.append(c)
            logits = tf.matmul(h, self.output)
            losses.append(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=[tags[position]], logits=logits))
        return tf.reduce_sum(tf.add_n(losses))


class Attention(SequenceModel):
    """Self-attention over a variable-length sequence, one query per word."""

    def __init__(self, rng, size=6):
        self.embedding = _weight(rng, self.vocabulary, size)
        self.query = _weight(rng, size, size)
        self.key = _weight(rng, size, size)
        self.value = _weight(rng, size, size)
        self.output = _weight(rng, size, self.classes)
        self.variables = [self.embedding, self.query, self.key, self.value,
                          self.output]

    def loss(self, tf, example):
        words, tags = example
        x = tf.nn.embedding_lookup(self.embedding, words)        # (length, size)
        scores = tf.matmul(tf.matmul(x, self.query), tf.matmul(x, self.key),
                           transpose_b=True) / np.sqrt(6.0)
        context = tf.matmul(tf.nn.softmax(scores, axis=-1), tf.matmul(x, self.value))
        logits = tf.matmul(tf.tanh(context), self.output)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tags, logits=logits))


class SelfAttentionVarlen:
    """Self-attention over sentences of 3 to 15 tokens, one label per
    sentence: embeddings ``[n, size]``, queries, keys and values by matrix
    products with shared weights, scores ``[n, n]``, softmax, the weighted
    sum, a mean over the tokens and a classifier.  Most of its ops differ
    between sentences only in their first axis (n), which subgraphjit
    batches over (README, "Batching over varying lengths"); the score
    matrices differ in both axes and batch per length."""

    vocabulary, classes = 50, 3

    def __init__(self, rng, size=8):
        self.size = size
        self.embedding = _weight(rng, self.vocabulary, size)
        self.query = _weight(rng, size, size)
        self.key = _weight(rng, size, size)
        self.value = _weight(rng, size, size)
        self.bias = _weight(rng, size)
        self.output = _weight(rng, size, self.classes)
        self.variables = [self.embedding, self.query, self.key, self.value,
                          self.bias, self.output]

    def random_examples(self, rng, count):
        return [(rng.integers(self.vocabulary, size=int(rng.integers(3, 16))).tolist(),
                 int(rng.integers(self.classes))) for _ in range(count)]

    def loss(self, tf, example):
        words, label = example
        x = tf.nn.embedding_lookup(self.embedding, words)        # (n, size)
        queries = tf.matmul(x, self.query)
        keys = tf.matmul(x, self.key)
        values = tf.matmul(x, self.value)
        scores = tf.matmul(queries, keys, transpose_b=True) / np.sqrt(self.size)
        context = tf.matmul(tf.nn.softmax(scores, axis=-1), values)  # (n, size)
        hidden = tf.tanh(tf.nn.bias_add(context, self.bias) + x)
        pooled = tf.reduce_mean(hidden, axis=0, keepdims=True)   # (1, size)
        logits = tf.matmul(pooled, self.output)
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=[label], logits=logits))


MODELS = {"tree_lstm": TreeLSTM, "tree_lstm_2type": TreeLSTM2Type,
          "child_sum_tree_lstm": ChildSumTreeLSTM,
          "function_tree_lstm": FunctionTreeLSTM,
          "tree_gru": TreeGRU, "keras_tree_gru": KerasTreeGRU, "mv_rnn": MVRNN,
          "bilstm_tagger": BiLSTMTagger, "lattice_lstm": LatticeLSTM,
          "attention": Attention,
          "self_attention_varlen": SelfAttentionVarlen}


# -- value-dependent control flow -------------------------------------------
# The models below read tensor values in Python (``float(gate) > 0.5``), so
# run one instance after another each read evaluates that instance alone;
# under subgraphjit the minibatch loop runs them with ``tf.batching.map``
# (``minibatch_losses``), whose rounds serve every instance's reads in one
# batched evaluation.  They stay out of ``MODELS``: the tests and tools over
# ``MODELS`` run the sequential loop, where every read is a forced evaluation.

def minibatch_losses(tf, model, examples):
    """Every example's loss: with ``tf.batching.map`` where ``tf`` has it
    (subgraphjit), else the plain loop (eager TensorFlow)."""
    batching = getattr(tf, "batching", None)
    if hasattr(batching, "map"):
        return batching.map(lambda example: model.loss(tf, example), examples)
    return [model.loss(tf, example) for example in examples]


def _leaves(tree):
    return [tree] if isinstance(tree, int) else _leaves(tree[0]) + _leaves(tree[1])


class GatedTree(TreeModel):
    """A tree whose expansion depends on tensor values.  A context flows
    top-down from the sentence's bag of words; at each internal node a gate
    read with ``float()`` decides whether to recurse into the children
    (each with a context of its own) and combine them with the recursive
    cell, or to summarise the subtree by the mean of its word embeddings.
    Either result is scaled by the gate (or its complement) so that the
    gate's weights get a gradient."""

    threshold = 0.5

    def __init__(self, rng, embed=6, hidden=5):
        # Weights scaled by fan-in, so that training stays stable at any
        # width (whether a gate opens must not hinge on rounding).
        self.embedding = _weight(rng, self.vocabulary, embed, scale=1.0)
        self.context = _weight(rng, embed, hidden, scale=embed ** -0.5)
        self.down = _weight(rng, hidden, hidden, scale=hidden ** -0.5)
        self.gate = _weight(rng, hidden, 1, scale=2 * hidden ** -0.5)
        self.leaf = _weight(rng, embed, hidden, scale=embed ** -0.5)
        self.cell = _weight(rng, 2 * hidden, hidden, scale=(2 * hidden) ** -0.5)
        self.summary = _weight(rng, embed, hidden, scale=embed ** -0.5)
        self.output = _weight(rng, hidden, self.classes, scale=hidden ** -0.5)
        self.variables = [self.embedding, self.context, self.down, self.gate,
                          self.leaf, self.cell, self.summary, self.output]

    def bag(self, tf, tree):
        return tf.reduce_mean(tf.nn.embedding_lookup(self.embedding, _leaves(tree)),
                              axis=0, keepdims=True)

    def encode(self, tf, tree, context=None):
        if context is None:
            context = tf.tanh(tf.matmul(self.bag(tf, tree), self.context))
        if isinstance(tree, int):
            x = tf.nn.embedding_lookup(self.embedding, [tree])
            return (tf.tanh(tf.matmul(x, self.leaf)),)
        gate = tf.sigmoid(tf.matmul(context, self.gate))
        if float(tf.reduce_sum(gate)) > self.threshold:   # expand
            children = [self.encode(tf, child, tf.tanh(
                tf.matmul(context, self.down)
                + tf.matmul(self.bag(tf, child), self.context)))[0]
                for child in tree]
            combined = tf.tanh(tf.matmul(tf.concat(children, 1), self.cell))
            return (gate * combined,)
        return ((1.0 - gate) * tf.tanh(tf.matmul(self.bag(tf, tree), self.summary)),)


class AdaptiveComputationRNN(SequenceModel):
    """Graves's adaptive computation time: at every word an RNN cell is
    repeated until the accumulated halting probability, read with
    ``float()``, passes 1 - eps (or ``max_steps``); the state is the
    halting-weighted mean of the steps' states, and the loss adds the ponder
    cost (steps plus the remainder).  Tags are predicted per word."""

    epsilon, max_steps, ponder_weight = 0.01, 4, 0.01

    def __init__(self, rng, embed=5, hidden=4):
        self.hidden = hidden
        # Scaled by fan-in: stable training at any width; the halting bias
        # starts at 1 (Graves: a few steps per word at first).
        self.embedding = _weight(rng, self.vocabulary, embed, scale=1.0)
        self.cell = _weight(rng, embed + hidden + 1, hidden,
                            scale=(embed + hidden + 1) ** -0.5)
        self.bias = _weight(rng, 1, hidden)
        self.halt = _weight(rng, hidden, 1, scale=2 * hidden ** -0.5)
        self.halt_bias = tensorflow.Variable([[1.0]])
        self.output = _weight(rng, hidden, self.classes, scale=hidden ** -0.5)
        self.variables = [self.embedding, self.cell, self.bias, self.halt,
                          self.halt_bias, self.output]

    def ponder(self, tf, x, state):
        """One word: the cell repeated until it halts; (state, ponder cost)."""
        total, weighted, probabilities = 0.0, [], []
        for step in range(self.max_steps):
            first = tf.ones((1, 1)) if step == 0 else tf.zeros((1, 1))
            state = tf.tanh(tf.matmul(tf.concat([x, state, first], 1), self.cell)
                            + self.bias)
            halting = tf.reduce_sum(tf.sigmoid(tf.matmul(state, self.halt)
                                               + self.halt_bias))
            probability = float(halting)
            if step == self.max_steps - 1 or total + probability > 1.0 - self.epsilon:
                remainder = 1.0 - tf.add_n(probabilities) if probabilities \
                    else tf.ones(())
                weighted.append(remainder * state)
                return tf.add_n(weighted), step + 1 + remainder
            total += probability
            probabilities.append(halting)
            weighted.append(halting * state)

    def loss(self, tf, example):
        words, tags = example
        state = tf.zeros((1, self.hidden))
        losses = []
        for word, tag in zip(words, tags):
            x = tf.nn.embedding_lookup(self.embedding, [word])
            state, cost = self.ponder(tf, x, state)
            logits = tf.matmul(state, self.output)
            losses.append(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=[tag], logits=logits)) + self.ponder_weight * cost)
        return tf.add_n(losses)


CONTROL_FLOW_MODELS = {"gated_tree": GatedTree,
                       "adaptive_computation": AdaptiveComputationRNN}
