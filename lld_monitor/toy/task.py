"""A toy Search-R1 task: invented facts about made-up entities, a noisy retriever, exact match.

Answers cannot be guessed without searching: every entity name and every value is an invented
word drawn from the task's seed. A one-hop question (``city of zorvak``) needs one search
(``zorvak city``); a two-hop question (``city of friend of zorvak``) needs the friend's name
first (``zorvak friend`` then ``quelby city``). Everything here is pure Python (no torch).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

# Tags of the tool protocol; each is a single token of the toy tokenizer.
SEARCH_OPEN = "<search>"
SEARCH_CLOSE = "</search>"
INFO_OPEN = "<information>"
INFO_CLOSE = "</information>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TAGS: tuple[str, ...] = (
    SEARCH_OPEN,
    SEARCH_CLOSE,
    INFO_OPEN,
    INFO_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)
FRIEND = "friend"  # the relation that links entities (the first hop of two-hop questions)
DOC_SEP = ";"  # separates retrieved documents inside <information>
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class ToyTaskConfig:
    """Size and difficulty of the toy task (defaults: small enough for a CPU test)."""

    n_entities: int = 24
    attributes: tuple[str, ...] = ("city", "color", "pet")
    n_values: int = 8  # distinct invented values per attribute
    answer_words: int = 1  # words per value (> 1: multi-token answers that share words)
    two_hop_frac: float = 0.5  # share of questions that need two searches
    n_docs: int = 3  # documents returned per search (1 relevant + distractors)
    miss_rate: float = 0.1  # probability that the relevant document is not returned
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_entities < 4:
            raise ValueError(f"n_entities must be >= 4, got {self.n_entities}")
        if not self.attributes or FRIEND in self.attributes:
            raise ValueError(f"attributes must be non-empty and must not contain {FRIEND!r}")
        if self.n_values < 2 or self.answer_words < 1 or self.n_docs < 1:
            raise ValueError("n_values must be >= 2, answer_words >= 1 and n_docs >= 1")
        for name in ("two_hop_frac", "miss_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class Question:
    """One task instance: the prompt text, the gold answer, and the searches that solve it."""

    prompt: str
    answer: str  # space-separated words
    hops: int  # 1 or 2
    gold_queries: tuple[str, ...]  # the searches a perfect policy issues, in order
    entity: str
    attribute: str


def _invent_words(rng: random.Random, n: int, taken: set[str], syllables: int = 2) -> list[str]:
    """``n`` distinct pronounceable invented words not in ``taken`` (``taken`` is updated)."""
    out: list[str] = []
    while len(out) < n:
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
        word += rng.choice(_CONSONANTS)
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


@dataclass
class KnowledgeBase:
    """Invented facts: ``facts[entity][attribute] = value`` (``friend`` holds another entity)."""

    config: ToyTaskConfig
    entities: list[str] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def generate(cls, config: ToyTaskConfig) -> KnowledgeBase:
        """Draw entities, value words and facts from ``config.seed``."""
        rng = random.Random(config.seed)
        taken: set[str] = set(config.attributes) | {FRIEND}
        entities = _invent_words(rng, config.n_entities, taken)
        values: dict[str, list[str]] = {}
        for attr in config.attributes:
            if config.answer_words == 1:
                values[attr] = _invent_words(rng, config.n_values, taken)
            else:
                # Multi-word values built from a small shared pool, so distractor answers share
                # tokens with the gold one (``lo bami`` vs ``lo keta``).
                pool = _invent_words(rng, max(3, config.n_values // 2 + 1), taken, syllables=1)
                combos: set[str] = set()
                while len(combos) < config.n_values:
                    combos.add(" ".join(rng.choice(pool) for _ in range(config.answer_words)))
                values[attr] = sorted(combos)
        facts: dict[str, dict[str, str]] = {}
        for i, ent in enumerate(entities):
            row = {attr: rng.choice(values[attr]) for attr in config.attributes}
            # friend: a different entity (a random derangement-like pick)
            j = rng.randrange(len(entities) - 1)
            row[FRIEND] = entities[j if j < i else j + 1]
            facts[ent] = row
        return cls(config=config, entities=entities, values=values, facts=facts)

    def documents(self) -> list[tuple[str, str, str]]:
        """All documents as ``(entity, attribute, value)``."""
        return [(e, a, v) for e, row in self.facts.items() for a, v in row.items()]

    def vocabulary(self) -> list[str]:
        """Every word the task can produce (for the tokenizer)."""
        words = set(self.entities) | set(self.config.attributes) | {FRIEND}
        for vals in self.values.values():
            for v in vals:
                words.update(v.split())
        words.update(["question", ":", "of", "?", DOC_SEP])
        return sorted(words)

    def questions(self) -> list[Question]:
        """Every one-hop and two-hop question of the knowledge base, in a fixed order."""
        out: list[Question] = []
        for ent in self.entities:
            for attr in self.config.attributes:
                answer = self.facts[ent][attr]
                out.append(
                    Question(
                        prompt=f"question : {attr} of {ent} ?",
                        answer=answer,
                        hops=1,
                        gold_queries=(f"{ent} {attr}",),
                        entity=ent,
                        attribute=attr,
                    )
                )
                friend = self.facts[ent][FRIEND]
                out.append(
                    Question(
                        prompt=f"question : {attr} of {FRIEND} of {ent} ?",
                        answer=self.facts[friend][attr],
                        hops=2,
                        gold_queries=(f"{ent} {FRIEND}", f"{friend} {attr}"),
                        entity=ent,
                        attribute=attr,
                    )
                )
        return out

    def sample_questions(self, n: int, seed: int) -> list[Question]:
        """``n`` questions drawn with replacement, ``two_hop_frac`` of them two-hop."""
        rng = random.Random(seed)
        pool = self.questions()
        one = [q for q in pool if q.hops == 1]
        two = [q for q in pool if q.hops == 2]
        return [
            rng.choice(two if rng.random() < self.config.two_hop_frac else one) for _ in range(n)
        ]


class Retriever:
    """Word-overlap search over the knowledge base with distractors and a miss rate.

    A query scores each document by how many of its words are the document's entity or
    attribute; the best document is returned with ``n_docs - 1`` distractors (same entity or
    same attribute), shuffled. With probability ``miss_rate`` the best document is left out.
    """

    def __init__(self, kb: KnowledgeBase, *, seed: int = 0) -> None:
        self.kb = kb
        self._docs = kb.documents()
        self._rng = random.Random(seed)

    def search(self, query: str) -> list[tuple[str, str, str]]:
        """The documents returned for ``query``, as ``(entity, attribute, value)``."""
        words = set(query.split())
        cfg = self.kb.config
        if not words:
            return []
        scored = [((d[0] in words) + (d[1] in words), d) for d in self._docs]
        best_score = max(s for s, _ in scored)
        if best_score == 0:
            return []
        best = [d for s, d in scored if s == best_score]
        hit = best[self._rng.randrange(len(best))]
        related = [d for s, d in scored if s > 0 and d != hit]
        k = min(cfg.n_docs - 1, len(related))
        picked = self._rng.sample(related, k)
        if self._rng.random() < cfg.miss_rate:
            others = [d for d in related if d not in picked]
            hit = others[self._rng.randrange(len(others))] if others else None
        docs = picked + ([hit] if hit is not None else [])
        self._rng.shuffle(docs)
        return docs

    def information(self, query: str) -> str:
        """The tool feedback text for ``query``: ``<information> e a v ; ... </information>``."""
        docs = self.search(query)
        body = f" {DOC_SEP} ".join(f"{e} {a} {v}" for e, a, v in docs)
        return f"{INFO_OPEN} {body} {INFO_CLOSE}" if body else f"{INFO_OPEN} {INFO_CLOSE}"


def extract_answer(tokens: Sequence[str]) -> str | None:
    """The words between the last ``<answer>`` and the following ``</answer>``, or None."""
    try:
        start = len(tokens) - 1 - list(reversed(tokens)).index(ANSWER_OPEN)
    except ValueError:
        return None
    rest = list(tokens[start + 1 :])
    if ANSWER_CLOSE not in rest:
        return None
    return " ".join(rest[: rest.index(ANSWER_CLOSE)])


def exact_match(tokens: Sequence[str], gold: str) -> float:
    """1.0 when the extracted answer equals ``gold`` word for word, else 0.0."""
    pred = extract_answer(tokens)
    return float(pred is not None and pred.split() == gold.split())


def demonstration(
    question: Question,
    retriever: Retriever,
    kb: KnowledgeBase,
    rng: random.Random,
    *,
    p_skip_search: float = 0.0,
    p_wrong_answer: float = 0.0,
    p_stop_early: float = 0.0,
    think_words: int = 0,
    filler: Sequence[str] = (),
) -> list[tuple[str, bool]]:
    """A demonstration as ``(text, generated)`` segments; noise makes it imperfect.

    ``p_skip_search``: answer with a guessed value without searching. ``p_wrong_answer``: answer
    with a value from a distractor. ``p_stop_early``: on two-hop questions, answer after the
    first search. ``think_words``: each action starts with that many random ``filler`` words (a
    long, low-likelihood "reasoning" prefix shared by correct and incorrect responses). Tool
    feedback comes from the real retriever (``generated=False``).
    """
    if think_words and not filler:
        raise ValueError("think_words > 0 needs filler words: build the tokenizer with extra_words")

    def think() -> str:
        return "".join(f"{rng.choice(filler)} " for _ in range(think_words))

    attr = question.attribute
    if rng.random() < p_skip_search:
        guess = rng.choice(kb.values[attr])
        return [(f"{think()}{ANSWER_OPEN} {guess} {ANSWER_CLOSE}", True)]
    segments: list[tuple[str, bool]] = []
    queries = list(question.gold_queries)
    if question.hops == 2 and rng.random() < p_stop_early:
        queries = queries[:1]
    last_docs: list[tuple[str, str, str]] = []
    issued: list[str] = []
    for i, query in enumerate(queries):
        if i == 1:
            # the second query uses the friend found by the first search (if it was found)
            friend = next(
                (v for e, a, v in last_docs if a == FRIEND and e == question.entity), None
            )
            if friend is None:
                break
            query = f"{friend} {attr}"
        issued.append(query)
        segments.append((f"{think()}{SEARCH_OPEN} {query} {SEARCH_CLOSE}", True))
        last_docs = retriever.search(query)
        body = f" {DOC_SEP} ".join(f"{e} {a} {v}" for e, a, v in last_docs)
        info = f"{INFO_OPEN} {body} {INFO_CLOSE}" if body else f"{INFO_OPEN} {INFO_CLOSE}"
        segments.append((info, False))
    ent_words = set(issued[-1].split()) if len(issued) == question.hops else set()
    found = [v for e, a, v in last_docs if a == attr and e in ent_words]
    distractors = [v for e, a, v in last_docs if a == attr and v not in found]
    if found and rng.random() >= p_wrong_answer:
        answer = found[0]
    elif distractors:
        answer = rng.choice(distractors)
    else:
        answer = rng.choice(kb.values[attr])
    segments.append((f"{think()}{ANSWER_OPEN} {answer} {ANSWER_CLOSE}", True))
    return segments
