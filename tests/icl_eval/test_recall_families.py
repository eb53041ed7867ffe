"""The recall families against hand-built items: texts, needle placement in model tokens, exact lengths,
and the answer extracted exactly as scored.

    python -m pytest tests/icl_eval/test_recall_families.py -q

Oracles written here, independent of icl_eval/recall: a passkey prompt assembled by hand from the
papers' sentences, byte by byte; each family's semantics re-derived from its texts (the JSON parsed,
the variable chain followed, the MQAR block read); depths measured on the prompt itself.
"""

from __future__ import annotations

import json
import re

import pytest

from evalm.config_toolkit import ConfigError, build
from evalm.icl_eval.recall import scoring
from evalm.icl_eval.recall.config import FAMILIES, RecallConfig
from evalm.icl_eval.recall.families import FAMILIES as GENERATORS
from evalm.icl_eval.recall.haystacks import FILLER, Haystacks
from evalm.icl_eval.recall.layout import body_pieces, cut_left, place
from evalm.icl_eval.recall.runner import encoded_item, item_rng
from evalm.icl_eval.recall.vocabulary import NOISE_WORDS
from evalm.text.tokenizer import ByteTokenizer
from tests import models

BYTES = ByteTokenizer()
BOS = (256,)


def prompts_of(task: str, length: int, depths, config=None, tokenizer=BYTES, seed: int = 1, index: int = 0):
    """(spec, encoded, [Placed per depth], slack) exactly as the runner builds them."""
    config = config or RecallConfig(depths=tuple(depths))
    spec, enc = encoded_item(task, seed, index, config, tokenizer, BOS)
    units, slack = Haystacks(tokenizer).take(spec.haystack, item_rng(task, seed, index, "haystack"), length - enc.fixed,
                                             spec.asked_words)
    pieces = body_pieces(units, enc.others, item_rng(task, seed, index, "place"))
    return spec, enc, [place(enc, pieces, d) for d in depths], slack


def test_a_passkey_prompt_is_the_hand_built_one_byte_for_byte():
    """Mohtashami & Jaggi's prompt written out here: instruction, whole filler sentences, the pass key
    sentence after the sentence nearest the depth, the question; as long as whole sentences allow."""
    spec, _, placed, slack = prompts_of("passkey", 1000, [0, 50, 100])
    key = re.search(r"pass key is (\d+)\.", spec.group[0]).group(1)
    head = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the important information there.")
    needle = f" The pass key is {key}. Remember it. {key} is the pass key."
    question = " What is the pass key? The pass key is"
    room = 1000 - 1 - len(head) - len(needle) - len(question)
    sentences, used = [], 0
    while used + len(FILLER[len(sentences) % 5]) <= room:  # every filler sentence is ASCII: bytes == characters
        sentences.append(FILLER[len(sentences) % 5])
        used += len(sentences[-1])
    assert slack == room - used and 0 <= slack < max(map(len, FILLER))
    for depth, got in zip((0, 50, 100), placed):
        bounds = [sum(map(len, sentences[:i])) for i in range(len(sentences) + 1)]
        at = min(range(len(bounds)), key=lambda i: (abs(bounds[i] - depth / 100 * used), i))
        text = head + "".join(sentences[:at]) + needle + "".join(sentences[at:]) + question
        assert got.prompts == ((256,) + tuple(text.encode()),)
        assert len(got.prompts[0]) == 1000 - slack  # the length read is the requested one minus the slack
        assert got.needle_at == 1 + len(head) + bounds[at]
    tail = tuple((needle + question).encode())
    assert placed[0].needle_at == 1 + len(head) and placed[2].prompts[0][-len(tail):] == tail


@pytest.mark.parametrize("task", FAMILIES)
def test_every_family_places_its_needle_at_the_stated_depth_in_model_tokens(task):
    """The first needle of the group starts where the prompt says, after depth% of the rest of the body
    (to within half the longest piece: needles go between units and other needles), and every prompt
    is exactly length - slack tokens long."""
    depths = (0, 10, 25, 50, 75, 90, 100)
    spec, enc, placed, slack = prompts_of(task, 3000, depths)
    unit = max(map(len, Haystacks(BYTES).filler + Haystacks(BYTES).words))
    assert 0 <= slack < unit
    unit = max([unit, *map(len, enc.others)])
    for depth, p in zip(depths, placed):
        prompt = p.prompts[-1]
        assert len(prompt) == 3000 - slack
        assert prompt[p.needle_at : p.needle_at + len(enc.group[0])] == enc.group[0]
        body = len(prompt) - len(enc.head) - sum(map(len, enc.group)) - sum(map(len, enc.questions)) \
            - sum(map(len, enc.answers[:-1]))
        assert abs((p.needle_at - len(enc.head)) - depth / 100 * body) <= unit / 2 + 1
        assert abs(p.depth_actual - 100 * (p.needle_at - len(enc.head)) / body) < 1e-9
    assert placed[0].needle_at == len(enc.head) or task in ("niah_multikey", "variable_tracking")  # others may lead


def test_the_group_follows_its_first_needle_in_order_and_others_keep_their_order():
    spec, enc, placed, _ = prompts_of("variable_tracking", 2000, [30])
    text = BYTES.decode(list(placed[0].prompts[0]))
    asked = [text.index(s) for s in spec.group]
    distractors = [text.index(s) for s in spec.others]
    assert asked == sorted(asked) and distractors == sorted(distractors)
    assert asked[0] == placed[0].needle_at - 1  # the bos is one token, no byte of text


def test_the_families_say_what_they_ask():
    """Each family's texts re-read here: the gold is what the context says, the question asks for it."""
    config = RecallConfig()
    by = {t: prompts_of(t, 4000, [50], config)[0] for t in FAMILIES}
    pk = by["passkey"]
    assert pk.golds == ((re.search(r"is (\d+)\. Remember", pk.group[0]).group(1),),) and 1 <= int(pk.golds[0][0]) <= 50000
    for task, asked in (("niah_single", 1), ("niah_multikey", 1), ("niah_multivalue", 1), ("niah_multiquery", 4)):
        s = by[task]
        needles = [re.fullmatch(r" One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", n).groups()
                   for n in s.group + s.others]
        keys = {k for k, _ in needles[: len(s.group)]}
        assert len(keys) == asked and all(k in s.questions[0] for k in keys)
        assert sorted(s.golds[0]) == sorted(v for k, v in needles if k in keys)
        assert not any(k in s.questions[0] for k, _ in needles[len(s.group):])
    assert len(by["niah_multikey"].others) == 3 and len(by["niah_multivalue"].golds[0]) == 4
    vt = by["variable_tracking"]
    value = re.search(r"assigned the value (\d{5})", vt.questions[0]).group(1)
    chain = _follow_chain(vt.group + vt.others, value)
    assert set(chain) == set(vt.golds[0]) and len(chain) == 3 and f"{len(chain)} variables" in vt.questions[0]
    kv = by["kv_recall"]
    obj = json.loads(kv.group[0].removeprefix(" JSON data: "))
    key = re.search(r'Key: "([0-9a-f-]{36})"', kv.questions[0]).group(1)
    assert len(obj) == 10 and kv.golds == ((obj[key],),)
    mq = by["mqar"]
    words = mq.group[0].split()
    pairs = dict(zip(words[0::2], words[1::2]))
    assert len(pairs) == 16 and [(pairs[q.split()[-1]],) for q in mq.questions] == list(mq.golds)


def _follow_chain(statements, value: str) -> list[str]:
    assign = dict(re.fullmatch(r" VAR ([A-Z]{5}) = (.+)\.", s).groups() for s in statements)
    found, frontier = [], [value]
    while frontier:
        target = frontier.pop()
        for name, rhs in assign.items():
            if rhs in (target, f"VAR {target}") and name not in found:
                found.append(name)
                frontier.append(name)
    return found


def test_mqar_queries_continue_after_each_gold_value():
    """Zoology's multi-query: query j's prompt is query j-1's prompt, its gold value, then key j."""
    spec, enc, placed, _ = prompts_of("mqar", 1500, [50])
    prompts = placed[0].prompts
    for j in range(1, len(prompts)):
        assert prompts[j] == prompts[j - 1] + enc.answers[j - 1] + enc.questions[j]
    assert BYTES.decode(list(prompts[0])).endswith("\nQueries:" + spec.questions[0].removeprefix("\nQueries:"))


def test_the_same_seed_gives_the_same_item_and_another_seed_another():
    a, b, c = (prompts_of("niah_multikey", 1200, [40], seed=s)[2][0].prompts for s in (1, 1, 2))
    assert a == b and a != c


@pytest.mark.parametrize(("kind", "text", "gold", "extracted", "right"), [
    ("number", " 15243. What else?", ("15243",), ("15243",), True),
    ("number", " 1524\n15243", ("15243",), ("1524",), False),  # read up to the first line break
    ("number", "\n 15243", ("15243",), ("15243",), True),  # leading whitespace and line breaks skipped
    ("numbers", " 7654321, 1234567.", ("1234567", "7654321"), ("7654321", "1234567"), True),
    ("numbers", " 7654321, 7654321", ("1234567", "7654321"), ("7654321", "7654321"), False),
    ("numbers", " 7654321, 1234567, 1111111", ("1234567", "7654321"), ("7654321", "1234567", "1111111"), False),
    ("names", " QWERT, ASDFG and ZXCVB", ("ZXCVB", "QWERT", "ASDFG"), ("QWERT", "ASDFG", "ZXCVB"), True),
    ("names", " QWERTY ASDFG", ("QWERT", "ASDFG"), ("ASDFG",), False),  # a 6-letter word is no name
    ("uuid", ' "0f8fad5b-d9cb-469f-a165-70867728950e"', ("0f8fad5b-d9cb-469f-a165-70867728950e",),
     ("0f8fad5b-d9cb-469f-a165-70867728950e",), True),
])
def test_the_answer_is_extracted_exactly_as_it_is_scored(kind, text, gold, extracted, right):
    assert scoring.extract(kind, text) == extracted
    assert scoring.correct(kind, text, gold) is right


def test_lengths_are_exact_in_a_bpe_tokenizers_own_tokens(tmp_path):
    """With a trained BPE, a prompt is the sum of its pieces' own encodings: length - slack tokens,
    the needle's tokens where the prompt says."""
    from evalm.icl_eval.models.hf import HFTokenizerAdapter

    tok = HFTokenizerAdapter(models.hf_tokenizer(tmp_path))
    for task in ("passkey", "kv_recall", "mqar"):
        spec, enc, placed, slack = prompts_of(task, 2500, [0, 60, 100], tokenizer=tok)
        for p in placed:
            assert len(p.prompts[-1]) == 2500 - slack
            assert p.prompts[0][p.needle_at : p.needle_at + len(enc.group[0])] == tuple(tok.encode(spec.group[0]))
        assert enc.head[: len(BOS)] == BOS and enc.head[len(BOS):] == tuple(tok.encode(spec.instruction))


def test_drop_left_keeps_the_bos_and_the_end_and_says_what_it_cut():
    _, _, placed, _ = prompts_of("passkey", 1500, [0, 100])
    early, late = (cut_left(p, BOS, 1000) for p in placed)
    for cut, whole in ((early, placed[0]), (late, placed[1])):
        assert cut.prompts[0][:1] == BOS and cut.prompts[0][1:] == whole.prompts[0][-999:]
        assert cut.dropped == len(whole.prompts[0]) - 1000 and len(cut.prompts[0]) == 1000
    assert early.needle_lost and not late.needle_lost  # lost at depth 0, kept at 100
    assert late.prompts[0][late.needle_at : late.needle_at + 10] == placed[1].prompts[0][placed[1].needle_at :][:10]


def test_settings_refuse_bad_values_in_one_line():
    for bad, words in (({"depths": (0, 120)}, "0 to 100"), ({"tasks": ("passkey", "needle")}, "unknown family needle"),
                       ({"lengths": (300_000,)}, "262,144"), ({"vt_hops": 3}, "vt_hops = 3"),
                       ({"seeds": (1, 1)}, "none twice")):
        with pytest.raises(ConfigError, match=words):
            build(RecallConfig, bad, where="flags [recall]")


def test_the_family_table_and_the_vocabulary():
    assert tuple(GENERATORS) == FAMILIES and len(set(NOISE_WORDS)) == len(NOISE_WORDS) == 128


@pytest.mark.parametrize("task", ["niah_single", "niah_multiquery", "mqar"])
def test_a_words_haystack_never_holds_the_asked_keys_words(task):
    """The keys are drawn from the haystack's own words: the haystack around a needle leaves the asked
    key's adjective and noun out (read back from the prompt's text, not from the spec's list)."""
    for seed in (1, 2, 3):
        spec, enc, placed, _ = prompts_of(task, 2000, [50], seed=seed)
        text = BYTES.decode(list(placed[0].prompts[0]))
        for needle in (*spec.group, *spec.others):
            text = text.replace(needle, " ")
        text = text[: text.index(spec.questions[0])]  # the question names the key: the haystack ends before it
        haystack = set(re.findall(r"[a-z]+", text)) & set(NOISE_WORDS)
        asked = set(re.findall(r"[a-z]+", " ".join(spec.questions))) & set(NOISE_WORDS)
        assert asked and len(haystack) > 20 and not haystack & asked, (task, seed, haystack & asked)


def test_the_old_name_of_the_words_haystack_is_refused_with_what_it_became():
    with pytest.raises(ConfigError, match="renamed 'words'.*RULER's noise haystack is this project's 'filler'"):
        build(RecallConfig, {"haystack": "noise"}, where="run.toml [recall]")
    assert RecallConfig().haystack == "words"
