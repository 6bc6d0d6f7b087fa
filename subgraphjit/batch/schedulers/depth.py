"""Depth-based batching (TensorFlow Fold): one batch per (depth, type), by
increasing depth, then type (``native/analysis.c``)."""

from ... import _native


class DepthScheduler:
    name = "depth"

    def whole_schedule(self, graph):
        return _native.depth_schedule(graph.type_of, graph.sources,
                                      len(graph.signatures))

    def init(self, graph):
        self._batches = self.whole_schedule(graph)[::-1]

    def next_batch(self):
        return self._batches.pop() if self._batches else None

    def post_process(self, batch):
        pass
