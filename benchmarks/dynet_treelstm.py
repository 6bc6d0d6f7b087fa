"""The same Tree-LSTM in DyNet with autobatching, run by benchmarks/batching.py
and benchmarks/record_cost.py in a subprocess (DyNet reads its flags at
import).  Prints one JSON line: sentences per second for training and for
inference, or with ``--construction`` what building one minibatch's loss
graph costs (the model's Python code included, nothing computed); with
``--serve``, its passes when batching.py gives it its turn (turns.py).

    python benchmarks/dynet_treelstm.py --dynet-autobatch 1 --batch-size 25
    (autobatch 1: agenda-based, 2: depth-based)
    python benchmarks/dynet_treelstm.py --construction --batch-size 25
"""

import argparse
import ctypes
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import turns  # noqa: E402
from experiments import sst  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--trees", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--embedding", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=150)
    parser.add_argument("--construction", action="store_true",
                        help="time graph construction of the first minibatch")
    parser.add_argument("--serve", action="store_true",
                        help="take turns with other systems' processes (turns.py)")
    arguments, _ = parser.parse_known_args()  # --dynet-* flags are DyNet's
    import dynet as dy

    trees = sst.load_split("train", limit=arguments.trees)
    vocabulary = sst.Vocabulary(trees)
    model = dy.ParameterCollection()
    embed, hidden = arguments.embedding, arguments.hidden
    embedding = model.add_lookup_parameters((len(vocabulary), embed))
    leaf_weight = model.add_parameters((3 * hidden, embed))
    leaf_bias = model.add_parameters(3 * hidden)
    node_weight = model.add_parameters((5 * hidden, 2 * hidden))
    node_bias = model.add_parameters(5 * hidden)
    output_weight = model.add_parameters((2, hidden))
    output_bias = model.add_parameters(2)
    trainer = dy.AdagradTrainer(model, 0.05)

    def encode(tree):
        if tree.is_leaf:
            x = embedding[vocabulary[tree.word]]
            gates = dy.affine_transform([leaf_bias, leaf_weight, x])
            i = dy.logistic(dy.pick_range(gates, 0, hidden))
            o = dy.logistic(dy.pick_range(gates, hidden, 2 * hidden))
            u = dy.tanh(dy.pick_range(gates, 2 * hidden, 3 * hidden))
            c = dy.cmult(i, u)
            return dy.cmult(o, dy.tanh(c)), c
        left_h, left_c = encode(tree.left)
        right_h, right_c = encode(tree.right)
        gates = dy.affine_transform([node_bias, node_weight,
                                     dy.concatenate([left_h, right_h])])
        parts = [dy.pick_range(gates, k * hidden, (k + 1) * hidden) for k in range(5)]
        i, forget_left, forget_right, o = (dy.logistic(p) for p in parts[:4])
        c = (dy.cmult(i, dy.tanh(parts[4])) + dy.cmult(forget_left, left_c)
             + dy.cmult(forget_right, right_c))
        return dy.cmult(o, dy.tanh(c)), c

    def logits(tree):
        return dy.affine_transform([output_bias, output_weight, encode(tree)[0]])

    def build_loss(minibatch):
        return dy.esum([dy.pickneglogsoftmax(logits(t), t.label)
                        for t in minibatch]) / len(minibatch)

    minibatches = [trees[k:k + arguments.batch_size]
               for k in range(0, len(trees), arguments.batch_size)]
    if arguments.construction:
        print(json.dumps(construction_cost(dy, build_loss, minibatches[0],
                                           arguments.passes)))
        return
    def train():
        for minibatch in minibatches:
            dy.renew_cg()
            loss = build_loss(minibatch)
            loss.value()
            loss.backward()
            trainer.update()

    def infer():
        for minibatch in minibatches:
            dy.renew_cg()
            outputs = [logits(t) for t in minibatch]
            dy.forward(outputs)
            [o.npvalue() for o in outputs]

    if arguments.serve:   # (batching.py's child: passes when its turn comes)
        turns.serve({"train": train, "infer": infer}, lambda: {"sentences": len(trees)})
        return
    speeds = {}
    for mode, run_pass in (("train", train), ("infer", infer)):
        rates = []
        for _ in range(arguments.passes):
            started = time.perf_counter()
            run_pass()
            rates.append(len(trees) / (time.perf_counter() - started))
        speeds[mode] = sorted(rates)[len(rates) // 2]
    print(json.dumps(speeds))


def construction_cost(dy, build_loss, minibatch, repeats):
    """Microseconds per graph node to build ``batch``'s loss (median and
    best of ``repeats``), and the nodes: those DyNet's graph prints."""
    seconds = []
    for _ in range(repeats):
        dy.renew_cg()
        started = time.perf_counter()
        build_loss(minibatch)
        seconds.append(time.perf_counter() - started)
    nodes = _graph_nodes(dy)
    per_node = sorted(second / nodes * 1e6 for second in seconds)
    return {"nodes": nodes, "us_per_node_median": per_node[len(per_node) // 2],
            "us_per_node_best": per_node[0]}


def _graph_nodes(dy):
    """Nodes of the current graph, from its Graphviz dump (DyNet's C++ writes
    it to standard error and has no count of its own in Python)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as dump:
        os.dup2(dump.fileno(), 2)
        try:
            dy.cg().print_graphviz()
            ctypes.CDLL(None).fflush(None)   # C++ streams write through stdio
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        dump.seek(0)
        return sum(1 for line in dump if '[label="' in line)


if __name__ == "__main__":
    main()
