"""Agenda-based batching (DyNet): of the types ready to run, run the one
whose remaining nodes have the lowest average depth (ties: the type that
became ready first).

A whole schedule is made in C (``native/analysis.c``).  The step-by-step
calls stay for the FSM scheduler, which keeps the ready lists here and
replaces the choice of type; tests/test_native_analysis.py checks that both
choose alike."""

from ... import _native


class AgendaScheduler:
    name = "agenda"

    def whole_schedule(self, graph):
        return _native.agenda_schedule(graph.type_of, graph.sources,
                                       len(graph.signatures))

    def init(self, graph):
        from . import depths
        self._type_of = graph.type_of
        depth = self._depth_of_index = depths(graph)
        type_count = len(graph.signatures)
        self._remaining = [0] * type_count
        self._depth_sum = [0] * type_count
        self._waiting_for = {}
        self._consumers = {}
        # Ready nodes by type (public: the FSM scheduler picks from them).
        self.ready = {}
        for index, node_type in enumerate(graph.type_of):
            if node_type < 0:
                continue
            self._remaining[node_type] += 1
            self._depth_sum[node_type] += depth[index]
            needed = graph.sources[index]
            if needed:
                self._waiting_for[index] = len(needed)
                for source in needed:
                    self._consumers.setdefault(source, []).append(index)
            else:
                self.ready.setdefault(node_type, []).append(index)

    def next_batch(self):
        if not self.ready:
            return None
        chosen = min(self.ready, key=lambda node_type:
                     self._depth_sum[node_type] / self._remaining[node_type])
        return self.ready.pop(chosen)

    def post_process(self, batch):
        depth = self._depth_of_index
        for index in batch:
            node_type = self._type_of[index]
            self._remaining[node_type] -= 1
            self._depth_sum[node_type] -= depth[index]
            for consumer in self._consumers.pop(index, ()):
                self._waiting_for[consumer] -= 1
                if self._waiting_for[consumer] == 0:
                    del self._waiting_for[consumer]
                    self.ready.setdefault(self._type_of[consumer], []).append(consumer)
