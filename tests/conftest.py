"""Every test starts with no line judged to run its scopes eagerly
(eager_scopes.py): a test's scopes are judged by its own calls, not by
those of the tests that ran before it at the same lines; and ends with
its thread's operations run, none left queued (overlap.py) for the next
test, whose own eager ops would otherwise run asynchronously and raise
their errors late, at some other test's line.  A test that
sets parameters does it through ``parameters``, which restores them: a
parameter left set leaks into every later test on the same worker."""

import pytest

import subgraphjit
from subgraphjit import eager_scopes, overlap


@pytest.fixture(autouse=True)
def no_line_judged():
    eager_scopes.reset()
    yield


@pytest.fixture(autouse=True)
def nothing_left_queued():
    """A training step leaves its backward and update queued until the next
    evaluation (by design); a test's end is that point here.  (A queued
    op's failure is raised at the test's teardown.)"""
    yield
    overlap.end()


@pytest.fixture
def parameters():
    """Set parameters for one test; restore them and forget patterns after."""
    changed = {}

    def set_parameters(**values):
        for key, value in values.items():
            changed.setdefault(key, subgraphjit.get_parameter(key))
            subgraphjit.set_parameter(key, value)
        subgraphjit.reset_patterns()

    yield set_parameters
    for key, value in changed.items():
        subgraphjit.set_parameter(key, value)
    subgraphjit.reset_patterns()
