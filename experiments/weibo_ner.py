"""Weibo NER (Chinese social media) as lattices for the lattice LSTM.

The files live in ``../shared/data/weibo_ner`` beside the repository, or in
``$SUBGRAPHJIT_DATA/weibo_ner``: one ``CHAR<seg>\\tTAG`` per line, where
``<seg>`` is the character's position in its jieba word (0 starts a word),
and a blank line between messages.

A lattice is the character chain plus one word cell per lexicon word found in
the message, as in Zhang and Yang's lattice LSTM.  The lexicon is the
training set's own segmentation: the multi-character words seen at least
``min_count`` times.  Every occurrence of a lexicon word in a message becomes
a word span, so spans overlap and jump over one another as in a real lattice.
"""

import collections

from experiments.data import data_directory

UNKNOWN = "<unk>"
LONGEST_WORD = 4


def read_messages(split):
    """The messages of one split ('train', 'dev', 'test'): lists of
    (character, starts_word, tag)."""
    path = data_directory("weibo_ner") / f"weiboNER_2nd_conll.{split}"
    if not path.exists():
        raise FileNotFoundError(
            f"Weibo NER file {path} is missing; put the data set in "
            f"../shared/data/weibo_ner or set SUBGRAPHJIT_DATA")
    messages, message = [], []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            line = line.rstrip("\n")
            if not line.strip():
                if message:
                    messages.append(message)
                message = []
                continue
            try:
                token, tag = line.split("\t")
                character, position = token[:-1], int(token[-1])
            except ValueError:
                raise ValueError(f"{path}:{line_number}: expected "
                                 f"'CHAR<digit>\\tTAG', got {line!r}") from None
            message.append((character, position == 0, tag))
    if message:
        messages.append(message)
    return messages


def segmented_words(message):
    """The jieba words of a message, as strings."""
    words, current = [], ""
    for character, starts_word, _ in message:
        if starts_word and current:
            words.append(current)
            current = ""
        current += character
    if current:
        words.append(current)
    return words


class Lattices:
    """Vocabularies and lexicon from the training split; ``examples(split)``
    gives (character ids, tag ids, word spans) for the lattice LSTM."""

    def __init__(self, min_count=2):
        train = read_messages("train")
        characters = collections.Counter(c for m in train for c, _, _ in m)
        self.characters = {UNKNOWN: 0}
        for character in sorted(characters):
            self.characters[character] = len(self.characters)
        self.tags = {tag: index for index, tag in enumerate(
            sorted({tag for m in train for _, _, tag in m}))}
        counts = collections.Counter(
            word for m in train for word in segmented_words(m)
            if 2 <= len(word) <= LONGEST_WORD)
        self.lexicon = {word for word, count in counts.items() if count >= min_count}

    def examples(self, split, limit=None):
        result = []
        for message in read_messages(split)[:limit]:
            # Positions are the message's tokens (a token is usually one
            # character, but not always), so words are matched token-wise.
            tokens = [c for c, _, _ in message]
            chars = [self.characters.get(c, 0) for c in tokens]
            tags = [self.tags.get(tag, self.tags["O"]) for _, _, tag in message]
            spans = [(start, start + length - 1)
                     for start in range(len(tokens))
                     for length in range(2, LONGEST_WORD + 1)
                     if start + length <= len(tokens)
                     and "".join(tokens[start:start + length]) in self.lexicon]
            result.append((chars, tags, spans))
        return result
