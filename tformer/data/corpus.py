"""A built-in English-German corpus for CPUs and CI: a small phrase grammar, generated offline.

Small enough to learn in minutes, rich enough that a model must learn real translation, not word
substitution:

* agreement: German articles and adjective endings follow gender, number and case
  ("the small dog" -> "der kleine Hund" as subject, "den kleinen Hund" as object, "ein kleiner Hund");
  the verb agrees with its subject ("sieht" / "sehen", also for "the dog and the cat");
* reordering: the perfect puts the participle last ("has seen the car" -> "hat das Auto gesehen"),
  subordinate clauses put the verb last ("..., dass der Hund das Auto sieht"), a fronted adverb
  inverts subject and verb ("today the dog sees" -> "heute sieht der Hund"), "not" follows the object.

    write_offline_corpus("runs/offline", n_train=20000)   # train/val/test .en/.de, the Multi30k layout
"""
from __future__ import annotations

import random
from pathlib import Path

# English singular, plural | German singular, plural, gender (m/f/n)
NOUNS = [
    ("dog", "dogs", "Hund", "Hunde", "m"), ("cat", "cats", "Katze", "Katzen", "f"),
    ("child", "children", "Kind", "Kinder", "n"), ("man", "men", "Mann", "Männer", "m"),
    ("woman", "women", "Frau", "Frauen", "f"), ("car", "cars", "Auto", "Autos", "n"),
    ("book", "books", "Buch", "Bücher", "n"), ("house", "houses", "Haus", "Häuser", "n"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"), ("bird", "birds", "Vogel", "Vögel", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"), ("ball", "balls", "Ball", "Bälle", "m"),
    ("girl", "girls", "Mädchen", "Mädchen", "n"), ("door", "doors", "Tür", "Türen", "f"),
    ("flower", "flowers", "Blume", "Blumen", "f"), ("letter", "letters", "Brief", "Briefe", "m"),
    ("tree", "trees", "Baum", "Bäume", "m"), ("table", "tables", "Tisch", "Tische", "m"),
    ("picture", "pictures", "Bild", "Bilder", "n"), ("horse", "horses", "Pferd", "Pferde", "n"),
]
ADJECTIVES = [("small", "klein"), ("big", "groß"), ("red", "rot"), ("old", "alt"), ("young", "jung"),
              ("new", "neu"), ("green", "grün"), ("black", "schwarz"), ("white", "weiß"),
              ("happy", "glücklich"), ("beautiful", "schön"), ("yellow", "gelb")]
# English base, 3rd singular, participle | German 3rd singular, plural, participle
VERBS = [("see", "sees", "seen", "sieht", "sehen", "gesehen"),
         ("like", "likes", "liked", "mag", "mögen", "gemocht"),
         ("buy", "buys", "bought", "kauft", "kaufen", "gekauft"),
         ("find", "finds", "found", "findet", "finden", "gefunden"),
         ("hold", "holds", "held", "hält", "halten", "gehalten"),
         ("carry", "carries", "carried", "trägt", "tragen", "getragen"),
         ("paint", "paints", "painted", "malt", "malen", "gemalt"),
         ("read", "reads", "read", "liest", "lesen", "gelesen"),
         ("draw", "draws", "drawn", "zeichnet", "zeichnen", "gezeichnet"),
         ("watch", "watches", "watched", "beobachtet", "beobachten", "beobachtet")]
ADVERBS = [("today", "heute"), ("often", "oft"), ("now", "jetzt"), ("sometimes", "manchmal")]
THINKERS = [("knows", "know", "weiß", "wissen"), ("says", "say", "sagt", "sagen"),
            ("thinks", "think", "denkt", "denken")]

# (case, gender or "pl") -> (definite article, weak ending) and (indefinite article, mixed ending)
DEFINITE = {("nom", "m"): ("der", "e"), ("nom", "f"): ("die", "e"), ("nom", "n"): ("das", "e"),
            ("acc", "m"): ("den", "en"), ("acc", "f"): ("die", "e"), ("acc", "n"): ("das", "e"),
            ("nom", "pl"): ("die", "en"), ("acc", "pl"): ("die", "en")}
INDEFINITE = {("nom", "m"): ("ein", "er"), ("nom", "f"): ("eine", "e"), ("nom", "n"): ("ein", "es"),
              ("acc", "m"): ("einen", "en"), ("acc", "f"): ("eine", "e"), ("acc", "n"): ("ein", "es"),
              ("nom", "pl"): ("", "e"), ("acc", "pl"): ("", "e")}   # plural without article: strong ending


class NounPhrase:
    """One noun phrase, rendered in English and (in a given case) in German."""

    def __init__(self, rng: random.Random, definite: bool | None = None):
        self.noun = rng.choice(NOUNS)
        self.plural = rng.random() < 0.3
        self.definite = rng.random() < 0.6 if definite is None else definite
        self.adjs = rng.sample(ADJECTIVES, k=rng.choice([0, 0, 1, 1, 2]))

    def en(self) -> str:
        words = [a[0] for a in self.adjs] + [self.noun[1] if self.plural else self.noun[0]]
        if self.definite:
            return " ".join(["the"] + words)
        if self.plural:
            return " ".join(words)
        return ("an " if words[0][0] in "aeiou" else "a ") + " ".join(words)

    def de(self, case: str) -> str:
        key = (case, "pl" if self.plural else self.noun[4])
        article, ending = (DEFINITE if self.definite else INDEFINITE)[key]
        words = [a[1] + ending for a in self.adjs] + [self.noun[3] if self.plural else self.noun[2]]
        return " ".join(([article] if article else []) + words)


def _subject(rng: random.Random) -> tuple[str, str, bool]:
    """(English, German nominative, plural?) -- sometimes two coordinated noun phrases."""
    a = NounPhrase(rng)
    if rng.random() < 0.12:
        b = NounPhrase(rng)
        return f"{a.en()} and {b.en()}", f"{a.de('nom')} und {b.de('nom')}", True
    return a.en(), a.de("nom"), a.plural


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German) sentence pair from the grammar."""
    s_en, s_de, plural = _subject(rng)
    verb = rng.choice(VERBS)
    kind = rng.choices(["simple", "perfect", "that", "adverb", "not"], weights=[3, 2, 2, 2, 1])[0]
    obj = NounPhrase(rng, definite=True if kind == "not" else None)
    o_en, o_de = obj.en(), obj.de("acc")
    v_en = verb[0] if plural else verb[1]
    v_de = verb[4] if plural else verb[3]
    if kind == "simple":
        en, de = f"{s_en} {v_en} {o_en}", f"{s_de} {v_de} {o_de}"
    elif kind == "perfect":
        en = f"{s_en} {'have' if plural else 'has'} {verb[2]} {o_en}"
        de = f"{s_de} {'haben' if plural else 'hat'} {o_de} {verb[5]}"
    elif kind == "that":
        t_en, t_de, t_pl = _subject(rng)
        think = rng.choice(THINKERS)
        en = f"{t_en} {think[1] if t_pl else think[0]} that {s_en} {v_en} {o_en}"
        de = f"{t_de} {think[3] if t_pl else think[2]}, dass {s_de} {o_de} {v_de}"
    elif kind == "adverb":
        adv = rng.choice(ADVERBS)
        if adv[0] in ("today", "now"):        # fronted: German inverts subject and verb (V2)
            en, de = f"{adv[0]} {s_en} {v_en} {o_en}", f"{adv[1]} {v_de} {s_de} {o_de}"
        else:                                 # "the dog often sees the car" -> "der Hund sieht oft das Auto"
            en, de = f"{s_en} {adv[0]} {v_en} {o_en}", f"{s_de} {v_de} {adv[1]} {o_de}"
    else:
        en = f"{s_en} {'do' if plural else 'does'} not {verb[0]} {o_en}"
        de = f"{s_de} {v_de} {o_de} nicht"

    def finish(s: str) -> str:
        return s[0].upper() + s[1:] + "."
    return finish(en), finish(de)


def generate_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """n (English, German) pairs, deterministic in `seed`; returned as two aligned lists."""
    rng = random.Random(seed)
    pairs = [sentence_pair(rng) for _ in range(n)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def write_offline_corpus(folder: str | Path, n_train: int = 20000, n_val: int = 500, n_test: int = 500,
                         seed: int = 0) -> Path:
    """Write train/val/test.{en,de} (one sentence a line, aligned) into `folder`; returns the folder.

    The test split is drawn with a different seed and never overlaps the training sentences.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    splits = {}
    for split, n, s in (("train", n_train, seed), ("val", n_val, seed + 1), ("test", n_test, seed + 2)):
        rng = random.Random(s)
        en, de = [], []
        tries = 0
        while len(en) < n and tries < 50 * n + 100:
            tries += 1
            e, d = sentence_pair(rng)
            if split != "train" and e in seen:          # held-out sentences are new sentences
                continue
            en.append(e), de.append(d)
        if split == "train":
            seen.update(en)
        splits[split] = (en, de)
    for split, (en, de) in splits.items():
        (folder / f"{split}.en").write_text("\n".join(en) + "\n")
        (folder / f"{split}.de").write_text("\n".join(de) + "\n")
    return folder
