"""Depth-based batching (TensorFlow Fold): one batch per (depth, type), by
increasing depth, then type (``native/analysis.c``)."""

from ... import _native


class DepthScheduler:
    name = "depth"

    def schedule(self, graph):
        return _native.depth_schedule(graph.type_of, graph.sources,
                                      len(graph.types))
