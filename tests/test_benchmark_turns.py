"""benchmarks/turns.py: systems' processes taking turns, pass by pass."""

import pathlib
import sys

import pytest

from benchmarks import turns

CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from benchmarks import turns
print("a library's own line")   # (not the protocol's: left alone)
count = {{"train": 0, "infer": 0}}
def one(mode):
    def run():
        count[mode] += 1
        time.sleep(0.01 if mode == "train" else 0.0)
    return run
turns.serve({{mode: one(mode) for mode in count}}, lambda: dict(count, name={name!r}))
"""


def child(name, source=CHILD):
    root = str(pathlib.Path(__file__).resolve().parents[1])
    return turns.Child(name, [sys.executable, "-c", source.format(root=root, name=name)])


def test_children_take_turns_and_report_each_pass_and_their_end():
    children = [child("first"), child("second")]
    seconds = turns.take_turns(children, ("train", "infer"), passes=3)
    for each in children:
        assert [len(seconds[each.name][mode]) for mode in ("train", "infer")] == [3, 3]
        assert all(s >= 0.01 for s in seconds[each.name]["train"])
        assert each.finish() == {"train": 3, "infer": 3, "name": each.name}


def test_a_child_that_fails_names_itself_and_shows_its_error():
    with pytest.raises(SystemExit) as raised:
        child("broken", "import sys; sys.exit('no such system: broken')")
    assert "broken: its process ended" in str(raised.value)
    assert "no such system: broken" in str(raised.value)
