"""The step-by-step calls for a scheduler whose whole schedule is made at
once (``whole_schedule(graph)``, in C): its batches, handed out in turn."""


class WholeSchedule:
    def init(self, graph):
        self._batches = self.whole_schedule(graph)[::-1]

    def next_batch(self):
        return self._batches.pop() if self._batches else None

    def post_process(self, batch):
        pass
