"""Every test starts with no line judged to run its scopes eagerly
(eager_scopes.py): a test's scopes are judged by its own calls, not by
those of the tests that ran before it at the same lines."""

import pytest

from subgraphjit import eager_scopes


@pytest.fixture(autouse=True)
def no_line_judged():
    eager_scopes.reset()
    yield
