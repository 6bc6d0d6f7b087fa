"""Weibo NER messages as lattices for the lattice LSTM."""

from experiments import weibo_ner


def test_weibo_lattices_match_words_token_by_token(tmp_path, monkeypatch):
    """A token of several characters is one position of the chain, so word
    spans count tokens, not characters."""
    folder = tmp_path / "weibo_ner"
    folder.mkdir()
    lines = "我0\tO\n们1\tO\nAB0\tO\n我0\tO\n们1\tO\n\n"
    for split in ("train", "dev", "test"):
        (folder / f"weiboNER_2nd_conll.{split}").write_text(lines, encoding="utf-8")
    monkeypatch.setenv("SUBGRAPHJIT_DATA", str(tmp_path))
    lattices = weibo_ner.Lattices(min_count=2)
    assert lattices.lexicon == {"我们"}
    [(chars, tags, spans)] = lattices.examples("dev")
    assert len(chars) == len(tags) == 5
    assert spans == [(0, 1), (3, 4)]
