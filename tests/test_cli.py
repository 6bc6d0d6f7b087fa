"""``subgraphjit tune`` on a small user script: Table 6.3 per depth, CSV."""

import csv
import subprocess
import sys
import textwrap

import pytest

import subgraphjit as tf
from subgraphjit.tools import cli

SCRIPT = textwrap.dedent('''
    import numpy as np
    import subgraphjit as tf
    from experiments.example_models import MODELS

    rng = np.random.default_rng(0)
    model = MODELS["tree_gru"](rng)
    for step in range(50):  # tune stops it once collection is over
        with tf.GradientTape() as tape:
            loss = tf.add_n([model.loss(tf, e) for e in model.random_examples(rng, 4)])
        tape.gradient(loss, model.variables)
    raise SystemExit("not stopped by subgraphjit tune")
''')


@pytest.fixture
def restore_parameters():
    saved = {key: tf.get_parameter(key) for key in
             ("granularity", "depth", "collect", "freq", "equivalence")}
    yield
    for key, value in saved.items():
        tf.set_parameter(key, value)
    tf.reset_patterns()


def test_tune_prints_table_6_3_and_writes_csv(tmp_path, capsys, restore_parameters):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    table = tmp_path / "table.csv"
    cli.main(["tune", "--script", str(script), "--depths", "1,3",
                     "--collect", "2", "--csv", str(table)])
    printed = capsys.readouterr().out
    assert "Table 6.3" in printed and "Recommended: depth" in printed
    with open(table) as handle:
        lines = list(csv.reader(handle))
    assert lines[0] == list(cli.COLUMNS)
    depths = {int(line[0]): line for line in lines[1:]}
    assert sorted(depths) == [1, 3]
    # Deeper walks make bigger patterns; every frequent one has two ops or more.
    assert float(depths[3][4]) > float(depths[1][4]) >= 2 or int(depths[1][2]) == 0
    assert int(depths[3][2]) > 0


def test_bad_arguments_get_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="depths"):
        cli.main(["tune", "--depths", "five"])
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(["tune", "--script", str(tmp_path / "missing.py")])


def test_python_dash_m_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "subgraphjit", "tune", "--help"],
                            capture_output=True, text=True, check=True)
    assert "--depths" in result.stdout


def test_tune_schedulers_compares_batches_and_sweeps(tmp_path, capsys):
    table = tmp_path / "schedulers.csv"
    cli.main(["tune", "--schedulers", "--models", "tree_gru,bilstm_tagger",
              "--batch-size", "6", "--fsm-sweep", "alpha=0.5,1",
              "--csv", str(table)])
    printed = capsys.readouterr().out
    assert "ED-Batch figure 7" in printed and "FSM settings: alpha=0.5" in printed
    with open(table) as handle:
        lines = list(csv.DictReader(handle))
    assert [(line["alpha"], line["model"]) for line in lines] == [
        ("0.5", "tree_gru"), ("0.5", "bilstm_tagger"),
        ("1.0", "tree_gru"), ("1.0", "bilstm_tagger")]
    for line in lines:
        bound, agenda, critical, fsm = (int(line[key]) for key in
                                        ("lower bound", "agenda", "critical", "fsm-sort"))
        assert bound <= fsm <= agenda and bound <= critical <= agenda
    with pytest.raises(SystemExit, match="KEY one of"):
        cli.main(["tune", "--schedulers", "--fsm-sweep", "gamma=1"])
