"""Agenda-based batching (DyNet): of the types ready to run, run the one
whose remaining nodes have the lowest average depth (ties: the type that
became ready first).

``schedule`` is made in C (``native/analysis.c``).  The same schedule is
also made a batch at a time, in Python (``init``, then ``next_batch`` and
``post_process`` in turn): the FSM scheduler keeps its ready lists here and
replaces the choice of type; tests/test_native_analysis.py checks that both
choose alike (``step_by_step``)."""

from ... import _native
from .structure import depths


class AgendaScheduler:
    name = "agenda"

    def schedule(self, graph):
        return _native.agenda_schedule(graph.type_of, graph.sources,
                                       len(graph.signatures))

    def step_by_step(self, graph):
        """The schedule a batch at a time, as the FSM scheduler drives it
        (what ``schedule`` must equal)."""
        self.init(graph)
        batches = []
        while (batch := self.next_batch()) is not None:
            self.post_process(batch)
            batches.append(batch)
        return batches

    def init(self, graph):
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
