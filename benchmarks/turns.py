"""Systems measured in processes of their own that take turns, pass by pass.

This machine's speed moves by a fifth from minute to minute (BENCHMARKS.md).
Measured one after another, each system's passes fall in a minute of their
own, and a ratio compares two minutes as much as two systems.  So every
system runs in a process of its own (in one process, a system ran slower
after another), all of them warmed up first, one at a time, and then the
processes take turns: one pass of each in turn, then the next round, so
that each system's passes sample the same minutes.  A process waits for its
turn blocked on a read, using no processor.

The protocol, on the child's standard input and output (lines of its own
start with ``@turns``, so that anything else a library prints is left
alone): the child prints ``ready`` once warmed up, then for each mode name
it reads runs one pass and prints the pass's seconds; ``done`` makes it
print its final JSON and exit.
"""

import json
import subprocess
import sys
import tempfile
import time

PREFIX = "@turns "


def serve(passes, final):
    """The child's side: ``passes`` maps a mode name to a function that runs
    one pass; ``final()`` gives what to print at ``done``."""
    _say("ready")
    for line in sys.stdin:
        mode = line.strip()
        if mode == "done":
            _say(json.dumps(final()))
            return
        started = time.perf_counter()
        passes[mode]()
        _say(json.dumps(time.perf_counter() - started))


def _say(text):
    print(PREFIX + text, flush=True)


class Child:
    """One system's process, started and warmed up."""

    def __init__(self, name, command):
        self.name = name
        # (Its error output is read only if it fails: a pipe nobody reads
        # would block it once full, so it goes to a file.)
        self.errors = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.errors, text=True)
        self._expect("ready")

    def run(self, mode):
        """One pass of ``mode``: its seconds."""
        self.process.stdin.write(mode + "\n")
        self.process.stdin.flush()
        return json.loads(self._reply())

    def finish(self):
        self.process.stdin.write("done\n")
        self.process.stdin.flush()
        final = json.loads(self._reply())
        self.process.wait()
        self.errors.close()
        return final

    def _expect(self, text):
        reply = self._reply()
        if reply != text:
            self._fail(f"said {reply!r}, not {text!r}")

    def _reply(self):
        for line in self.process.stdout:
            if line.startswith(PREFIX):
                return line[len(PREFIX):].strip()
        self._fail("ended")

    def _fail(self, what):
        self.process.kill()
        self.process.wait()
        self.errors.seek(0)
        sys.exit(f"{self.name}: its process {what}:\n{self.errors.read()[-3000:]}")


def take_turns(children, modes, passes):
    """Every child's seconds per pass, by child name and mode: for each mode,
    ``passes`` rounds of one pass of each child in turn."""
    seconds = {child.name: {mode: [] for mode in modes} for child in children}
    for mode in modes:
        for _ in range(passes):
            for child in children:
                seconds[child.name][mode].append(child.run(mode))
    return seconds
