"""The words the families draw from: RULER-style "adjective-noun" keys, MQAR's keys, the words haystack.

RULER draws its keys from wonderwords' adjective and noun lists; these are 64 common English
adjectives and 64 concrete nouns of one to three syllables (4,096 keys), written here so that no
package or download is needed. The words haystack draws the same 128 words: a haystack of them is
incompressible text (Zoology's random non-query tokens, as words) yet reads as words to a tokenizer.
"""

from __future__ import annotations

ADJECTIVES = tuple("""
able bitter bold brave bright broad calm clean clever cold cool crisp curious damp dark deep eager early
empty faint fancy fast fierce flat fresh gentle glad golden grand green happy heavy hollow honest humble
jolly keen kind large lazy light little lively loud lucky mellow merry mighty modern narrow neat noble
odd plain proud quick quiet rapid rare rich rough round royal silent
""".split())
NOUNS = tuple("""
anchor apple arrow badge basket beacon bottle bridge bucket button cabin candle canyon castle cherry
circle cloud comet compass copper cottage crystal desert dragon engine falcon feather forest fountain
garden glacier guitar hammer harbor helmet island jacket kettle ladder lantern lemon magnet meadow
mirror needle orchard pebble pepper pillow planet pocket rabbit ribbon river rocket saddle shovel
silver spider temple thunder tiger tunnel wagon
""".split())
NOISE_WORDS = ADJECTIVES + NOUNS
"""128 distinct words (tests/icl_eval/test_recall_families.py checks it)."""

