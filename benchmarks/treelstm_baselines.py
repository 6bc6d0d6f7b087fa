"""Tree-LSTM baselines for the batching benchmark, written in plain
TensorFlow: the per-instance model with its cells in tf.function, and a
hand-batched model that runs a whole minibatch level by level -- what an
expert writes by hand.  Both share ``experiments.treelstm.TreeLSTM``'s
weights layout, so every system computes the same function.
"""

import numpy as np
import tensorflow as tf

from experiments.treelstm import TreeLSTM


class FunctionCellTreeLSTM(TreeLSTM):
    """The per-instance recursion, with each cell one compiled tf.function."""

    def __init__(self, *args, **kwargs):
        super().__init__(tf, *args, **kwargs)
        self._leaf = tf.function(self._leaf_cell)
        self._node = tf.function(self._node_cell)

    def _leaf_cell(self, word_id):
        x = tf.nn.embedding_lookup(self.embedding, word_id)
        i, o, u = tf.split(tf.matmul(x, self.leaf_weight) + self.leaf_bias, 3, 1)
        c = tf.sigmoid(i) * tf.tanh(u)
        return tf.sigmoid(o) * tf.tanh(c), c

    def _node_cell(self, left_h, left_c, right_h, right_c):
        gates = tf.matmul(tf.concat([left_h, right_h], 1), self.node_weight) + self.node_bias
        i, forget_left, forget_right, o, u = tf.split(gates, 5, 1)
        c = (tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(forget_left) * left_c
             + tf.sigmoid(forget_right) * right_c)
        return tf.sigmoid(o) * tf.tanh(c), c

    def encode(self, tree, word_ids):
        if tree.is_leaf:
            return self._leaf(tf.constant([word_ids[tree.word]]))
        left_h, left_c = self.encode(tree.left, word_ids)
        right_h, right_c = self.encode(tree.right, word_ids)
        return self._node(left_h, left_c, right_h, right_c)


@tf.custom_gradient
def gather_rows(table, rows):
    """tf.gather with a dense gradient: one segment sum, instead of the
    IndexedSlices that TensorFlow densifies slowly behind a concat."""
    def gradient(upstream):
        return tf.math.unsorted_segment_sum(upstream, rows, tf.shape(table)[0]), None
    return tf.gather(table, rows), gradient


class HandBatchedTreeLSTM(TreeLSTM):
    """A minibatch at a time: every leaf in one op, then one batched cell per
    tree height, children's states gathered from the levels below."""

    def __init__(self, *args, **kwargs):
        super().__init__(tf, *args, **kwargs)

    @staticmethod
    def plan(minibatch, word_ids):
        """Rows of every node, by height: leaves' word ids, and per level the
        rows of each node's children in the table of all lower levels."""
        height, levels = {}, []
        for tree in minibatch:
            for node in tree.nodes():  # children first
                h = 0 if node.is_leaf else 1 + max(height[id(node.left)],
                                                   height[id(node.right)])
                height[id(node)] = h
                while len(levels) <= h:
                    levels.append([])
                levels[h].append(node)
        row, offset = {}, 0
        for level in levels:
            for position, node in enumerate(level):
                row[id(node)] = offset + position
            offset += len(level)
        leaf_ids = [word_ids[node.word] for node in levels[0]]
        children = [(np.array([row[id(n.left)] for n in level], np.int32),
                     np.array([row[id(n.right)] for n in level], np.int32))
                    for level in levels[1:]]
        roots = np.array([row[id(tree)] for tree in minibatch], np.int32)
        labels = np.array([tree.label for tree in minibatch], np.int32)
        return leaf_ids, children, roots, labels

    def batch_logits(self, plan):
        leaf_ids, children, roots, _ = plan
        x = tf.nn.embedding_lookup(self.embedding, leaf_ids)
        i, o, u = tf.split(tf.matmul(x, self.leaf_weight) + self.leaf_bias, 3, 1)
        c = tf.sigmoid(i) * tf.tanh(u)
        hs, cs = [tf.sigmoid(o) * tf.tanh(c)], [c]
        for left, right in children:
            all_h, all_c = tf.concat(hs, 0), tf.concat(cs, 0)
            gates = tf.matmul(tf.concat([gather_rows(all_h, left),
                                         gather_rows(all_h, right)], 1),
                              self.node_weight) + self.node_bias
            i, forget_left, forget_right, o, u = tf.split(gates, 5, 1)
            c = (tf.sigmoid(i) * tf.tanh(u)
                 + tf.sigmoid(forget_left) * gather_rows(all_c, left)
                 + tf.sigmoid(forget_right) * gather_rows(all_c, right))
            hs.append(tf.sigmoid(o) * tf.tanh(c))
            cs.append(c)
        root_h = gather_rows(tf.concat(hs, 0), roots)
        return tf.matmul(root_h, self.output_weight) + self.output_bias

    def batch_loss(self, plan):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=plan[3], logits=self.batch_logits(plan)))

    @staticmethod
    def plan_tensors(plan):
        leaf_ids, children, roots, labels = plan
        return (tf.constant(leaf_ids, tf.int32),
                [(tf.constant(left), tf.constant(right)) for left, right in children],
                tf.constant(roots), tf.constant(labels))


def compiled_hand_batched(model, optimizer):
    """The hand-batched model with its whole step in tf.function: one trace
    per tree height seen (the level loop unrolls), then one call per step."""
    @tf.function(reduce_retracing=True)
    def train_step(plan):
        with tf.GradientTape() as tape:
            loss = model.batch_loss(plan)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.variables),
                                      model.variables))
        return loss

    @tf.function(reduce_retracing=True)
    def logits(plan):
        return model.batch_logits(plan)
    return train_step, logits

