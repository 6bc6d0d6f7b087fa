"""Depth-based batching (TensorFlow Fold): one batch per (depth, type)."""


class DepthScheduler:
    name = "depth"

    def init(self, graph):
        from . import depths
        depth = depths(graph)
        groups = {}
        for index, node_type in enumerate(graph.type_of):
            if node_type >= 0:
                groups.setdefault((depth[index], node_type), []).append(index)
        self._batches = [groups[key] for key in sorted(groups, reverse=True)]

    def next_batch(self):
        return self._batches.pop() if self._batches else None

    def post_process(self, batch):
        pass
