"""Unit tests for transformer_lib.arithmetic (chapter 22): the held-out split, the corpus and the checker."""

import re

from transformer_lib.arithmetic import END, VOCAB, Problem, check_answer, corpus_lines, is_held_out, render, sample_problems
from transformer_lib.data import CharTokenizer


def test_held_out_pairs_never_appear_in_training_data():
    text = "\n".join(corpus_lines(20_000, seed=3))
    pairs = {(int(a), int(b)) for a, b in re.findall(r"(?<!\d)(\d+)(?:\+| plus | and )(\d+)(?!\d)", text)}
    assert len(pairs) > 1000 and not any(is_held_out(a, b) for a, b in pairs)
    for p in sample_problems(200, held_out=True, seed=1):
        assert is_held_out(p.a, p.b) and is_held_out(p.b, p.a) and (p.a, p.b) not in pairs
    assert not any(is_held_out(p.a, p.b) for p in sample_problems(500, held_out=False, seed=2))


def test_check_answer_is_exact():
    p = Problem(12, 30, "add 12 and 30.")
    assert check_answer(p, "42" + END)
    assert not check_answer(p, "42") and not check_answer(p, "420" + END) and not check_answer(p, " 42" + END)


def test_the_corpus_and_problems_are_seeded_and_in_the_vocabulary():
    assert corpus_lines(300, seed=5) == corpus_lines(300, seed=5) != corpus_lines(300, seed=6)
    tok = CharTokenizer(VOCAB)
    tok.encode("\n".join(corpus_lines(2000, seed=5)))  # refuses a character outside the vocabulary
    problems = sample_problems(50, held_out=True, seed=3)
    assert problems == sample_problems(50, held_out=True, seed=3)
    assert render(END) == "<|end|>"
