"""Each filter's ratio against values computed by hand; normalisation; word lists; profiles.

Run: python -m pytest tests/data_pipeline/test_filters.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from evalm.config_toolkit import ConfigError, build
from evalm.data_pipeline import filters, wordlists
from evalm.data_pipeline.config import FilterConfig, FilterProfile, load_stage
from evalm.data_pipeline.document import Document
from evalm.data_pipeline.filter_job import filter_documents
from evalm.data_pipeline.normalize import normalize


def test_word_count_splits_on_space_newline_tab():
    assert len(filters.words("a b  c\n d\te ")) == 5


def test_char_repetition_by_hand():
    # 3-grams of "abcabcx": abc, bca, cab, abc, bcx -> counts 2,1,1,1; distinct 4, seen once 3,
    # k = min(isqrt(4)=2, 4-3=1) = 1 -> 2 / 5
    assert filters.char_repetition_ratio("abcabcx", 3) == pytest.approx(0.4)
    # "aaaa", 2-grams: aa x3; distinct 1, once 0, k = min(1, 1) = 1 -> 3/3
    assert filters.char_repetition_ratio("aaaa", 2) == pytest.approx(1.0)
    # 10-grams of "0123456789"*2 + "x": 12 grams, "0123456789" twice, 10 others once;
    # k = min(isqrt(11)=3, 11-10=1) = 1 -> 2/12
    assert filters.char_repetition_ratio("0123456789" * 2 + "x", 10) == pytest.approx(2 / 12)
    assert filters.char_repetition_ratio("short", 10) == 0.0


def test_word_repetition_by_hand_on_normalised_words():
    # normalised: a b c a b c; bigrams ab, bc, ca, ab, bc -> repeated occurrences 4 of 5
    words = filters.normalized_words("A, b. c a b!! c")
    assert words == ["a", "b", "c", "a", "b", "c"]
    assert filters.word_repetition_ratio(words, 2) == pytest.approx(0.8)
    # all distinct 5-grams -> 0
    assert filters.word_repetition_ratio(list("abcdefgh"), 5) == 0.0


def test_special_ratio_by_hand():
    assert filters.special_ratio("ab, 1") == pytest.approx(3 / 5)  # ',', ' ', '1'
    assert filters.special_ratio("abc") == 0.0


def test_word_list_ratios_by_hand():
    norm = filters.normalized_words("The cat and THE dog. 42")  # "42" strips to empty: dropped
    assert norm == ["the", "cat", "and", "the", "dog"]
    assert filters.word_list_ratio(norm, frozenset({"the", "and"})) == pytest.approx(3 / 5)
    assert filters.word_list_ratio(norm, frozenset({"dog"})) == pytest.approx(1 / 5)
    assert filters.word_list_ratio([], frozenset({"x"})) == 0.0


def test_first_failing_filter_is_the_reason_and_profiles_apply():
    base = dict(word_count=100, char_repetition=0.05, word_repetition=0.1, special_characters=0.2,
                stop_words=0.4, flagged_words=0.0)
    p = FilterProfile()
    assert filters.reject_reason(filters.Ratios(**base), p) is None
    for field, value, reason in [
        ("word_count", 19, "word_count"), ("word_count", 100_001, "word_count"),
        ("char_repetition", 0.107, "char_repetition"), ("word_repetition", 0.2, "word_repetition"),
        ("special_characters", 0.41, "special_characters"), ("stop_words", 0.29, "stop_words"),
        ("flagged_words", 0.011, "flagged_words"),
    ]:
        assert filters.reject_reason(filters.Ratios(**{**base, field: value}), p) == reason
    # two failures: the earlier one in the quality-filter table of docs/data_pipeline.md is recorded
    both = filters.Ratios(**{**base, "special_characters": 0.9, "stop_words": 0.0})
    assert filters.reject_reason(both, p) == "special_characters"
    # DM Mathematics is exempt from the special-character filter (docs/data_pipeline.md)
    dm = FilterConfig().profile("DM Mathematics")
    assert filters.reject_reason(filters.Ratios(**{**base, "special_characters": 0.6}), dm) is None


def test_normalize_whitespace_and_ascii():
    raw = "a\u00a0 b\u2003c\r\nd \u2014 \u00e9t\u00e9\n\n\n\nend  "
    text, removed = normalize(raw)
    assert text == "a b c\nd t\n\nend"
    assert removed == len(raw) - len(text)


def test_shipped_word_lists_have_provenance():
    for path in (wordlists.DEFAULT_STOPWORDS, wordlists.DEFAULT_FLAGGED):
        header = " ".join(wordlists.provenance(path)).lower()
        assert "source:" in header and "licence:" in header
    stop = wordlists.load(wordlists.DEFAULT_STOPWORDS, normalize_word=filters.normalize_word)
    assert {"the", "and", "of"} <= stop and len(stop) > 500
    flagged = wordlists.load(wordlists.DEFAULT_FLAGGED, normalize_word=filters.normalize_word)
    assert len(flagged) > 350 and "the" not in flagged


def test_word_list_path_is_configurable(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("# source: test\n# licence: CC0\nFoo\nbar.\n")
    assert wordlists.load(path, normalize_word=filters.normalize_word) == {"foo", "bar"}
    with pytest.raises(FileNotFoundError, match="word list not found"):
        wordlists.load(tmp_path / "missing.txt", normalize_word=filters.normalize_word)


def test_unknown_config_keys_name_file_key_and_valid_keys(tmp_path):
    path = tmp_path / "data.toml"
    path.write_text("[filter]\nmin_wrods = 3\n")
    with pytest.raises(ConfigError, match=r"data.toml \[filter\]: unknown key\(s\) \['min_wrods'\]; valid keys"):
        load_stage("filter", path)
    path.write_text("[filter.overrides.Books3]\nmax_specal_ratio = 1.0\n")
    with pytest.raises(ConfigError, match="max_specal_ratio"):
        load_stage("filter", path)
    path.write_text("[filtr]\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_stage("filter", path)
    with pytest.raises(ConfigError, match="x.default: min_words"):
        build(FilterConfig, {"default": {"min_words": "many"}}, where="x")


def test_every_filter_bound_is_a_threshold_of_the_profile():
    fields = set(FilterProfile.__dataclass_fields__)
    for f in filters.FILTERS:
        assert (f.low or f.high) and {f.low, f.high} - {""} <= fields, f.reason
    assert filters.REASONS == tuple(filters.Ratios.__dataclass_fields__)


@dataclasses.dataclass(frozen=True)
class DigitProfile(FilterProfile):
    max_digit_ratio: float = 0.05
    """The test filter's threshold: share of characters that are digits."""


def test_a_filter_added_by_one_table_entry_drops_with_its_reason():
    """One entry (reason, measure, bound) extends the stage: ratios, checks and reasons follow it."""
    digits = filters.Filter("digits", lambda t: sum(ch.isdigit() for ch in t.text) / max(len(t.text), 1),
                            high="max_digit_ratio")
    table = (*filters.FILTERS, digits)
    prose = ("The quiet river ran past the old mill where a miller and his daughter kept bees in the summer, "
             "and in the winter they mended nets for the fishermen of the village by the sea.")
    numbers = prose + " Record 31415926 was filed in 2718 and 1618."
    docs = [Document("prose", prose, "Pile-CC"), Document("numbers", numbers, "Pile-CC")]
    config = FilterConfig(default=DigitProfile())
    stop = frozenset({"the", "and", "in", "a", "of", "for", "by", "his", "was", "they", "where"})
    verdicts = {v.doc.id: v for v in filter_documents(docs, config, stop, frozenset(), table)}
    assert verdicts["prose"].reason is None
    assert verdicts["numbers"].reason == "digits"  # passes the six of docs/data_pipeline.md, fails the new one
    assert dataclasses.asdict(verdicts["numbers"].ratios)["digits"] == pytest.approx(16 / len(numbers))
    assert list(dataclasses.asdict(verdicts["prose"].ratios)) == [*filters.REASONS, "digits"]
    # the six-filter table keeps the same document: the new entry alone drops it
    assert all(v.reason is None for v in filter_documents(docs, config, stop, frozenset()))
