"""Agenda-based batching (DyNet): of the types ready to run, run the one
whose remaining nodes have the lowest average depth (ties: the type that
became ready first).

``schedule`` is made in C (``native/analysis.c``), as is the FSM
scheduler's, which keeps agenda's ready lists and replaces its choice of
type; tests/test_native_analysis.py and tests/test_fsm.py hold the Python
references they are checked against."""

from ... import _native


class AgendaScheduler:
    name = "agenda"

    def schedule(self, graph):
        return _native.agenda_schedule(graph.type_of, graph.sources,
                                       len(graph.types))
