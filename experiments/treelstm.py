"""A binary (constituency) Tree-LSTM, Tai et al. 2015, as a researcher
writes it in eager TensorFlow: Python recursion over each tree, one small op
at a time.  It takes the TensorFlow-like module as an argument, so the same
code runs under ``tensorflow`` and under ``subgraphjit``.
"""

import numpy as np


class TreeLSTM:
    def __init__(self, tf, vocabulary_size, classes, embedding=300, hidden=150,
                 seed=0):
        self.tf = tf
        rng = np.random.default_rng(seed)

        def weight(*shape, scale=None):
            scale = scale if scale is not None else 1 / np.sqrt(shape[0])
            return tf.Variable((rng.uniform(-scale, scale, shape)).astype(np.float32))

        self.embedding = weight(vocabulary_size, embedding, scale=0.1)
        self.leaf_weight = weight(embedding, 3 * hidden)
        self.leaf_bias = tf.Variable(np.zeros((1, 3 * hidden), np.float32))
        self.node_weight = weight(2 * hidden, 5 * hidden)
        self.node_bias = tf.Variable(np.zeros((1, 5 * hidden), np.float32))
        self.output_weight = weight(hidden, classes)
        self.output_bias = tf.Variable(np.zeros((1, classes), np.float32))
        self.variables = [self.embedding, self.leaf_weight, self.leaf_bias,
                          self.node_weight, self.node_bias, self.output_weight,
                          self.output_bias]

    def encode(self, tree, word_ids):
        """(h, c) of a tree's root."""
        tf = self.tf
        if tree.is_leaf:
            x = tf.nn.embedding_lookup(self.embedding, [word_ids[tree.word]])
            gates = tf.matmul(x, self.leaf_weight) + self.leaf_bias
            i, o, u = tf.split(gates, 3, axis=1)
            c = tf.sigmoid(i) * tf.tanh(u)
            return tf.sigmoid(o) * tf.tanh(c), c
        left_h, left_c = self.encode(tree.left, word_ids)
        right_h, right_c = self.encode(tree.right, word_ids)
        children = tf.concat([left_h, right_h], axis=1)
        gates = tf.matmul(children, self.node_weight) + self.node_bias
        i, forget_left, forget_right, o, u = tf.split(gates, 5, axis=1)
        c = (tf.sigmoid(i) * tf.tanh(u)
             + tf.sigmoid(forget_left) * left_c
             + tf.sigmoid(forget_right) * right_c)
        return tf.sigmoid(o) * tf.tanh(c), c

    def logits(self, tree, word_ids):
        h, _ = self.encode(tree, word_ids)
        return self.tf.matmul(h, self.output_weight) + self.output_bias

    def loss(self, tree, word_ids):
        """Cross-entropy of the root's sentiment."""
        tf = self.tf
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=[tree.label], logits=self.logits(tree, word_ids)))


def train_step(tf, model, optimizer, minibatch, word_ids):
    """One minibatch, written exactly as the issue's user code."""
    with tf.GradientTape() as tape:
        loss = tf.add_n([model.loss(tree, word_ids) for tree in minibatch]) / len(minibatch)
        if hasattr(tf, "build"):
            loss = tf.build(loss)
    gradients = tape.gradient(loss, model.variables)
    optimizer.apply_gradients(zip(gradients, model.variables))
    return float(loss)
