"""Synthetic fact corpus: passages about invented entities, so every answer exists only in the context.

A passage is a list of facts "<name> <relation> <value>." about a few invented people; a question asks
one attribute of one person. Other people's facts of the same type act as distractors, so the model has
to bind the value to the asked name, not just copy a value of the right type.

Split discipline: names and templates are partitioned into a train part and a held-out part. Translators
train on split="train" and are evaluated on split="eval" (unseen names, unseen fact/question phrasings).
The tiny language models are pretrained on split="all": they must know the whole language they are tested on.
"""

import random
from dataclasses import dataclass, field

Fact = tuple[str, str, str]  # (person, attribute, value)
StatedFact = tuple[str, str, str, str]  # (person, attribute, value, sentence)

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ren",
    "tas",
    "vo",
    "ju",
    "pel",
    "dor",
    "si",
    "na",
    "bek",
    "ru",
    "fa",
    "zen",
    "ti",
    "gro",
    "mal",
    "os",
    "ve",
    "lin",
    "qua",
    "hu",
    "sor",
]
CITY_STEMS = ["Mar", "Bel", "Tor", "Kes", "Ulm", "Var", "Pon", "Dres", "Hal", "Lis", "Nor", "Gav", "Rim", "Sol"]
CITY_ENDS = ["ton", "ia", "grad", "ford", "os", "heim", "port", "vale"]
JOBS = [
    "baker",
    "pilot",
    "nurse",
    "farmer",
    "painter",
    "lawyer",
    "miner",
    "sailor",
    "doctor",
    "teacher",
    "tailor",
    "singer",
    "driver",
    "writer",
    "chemist",
    "butcher",
    "dancer",
    "judge",
    "guard",
    "clerk",
]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "gray"]

# attribute -> (fact templates, question templates); the LAST template of each list is held out for eval.
TEMPLATES = {
    "city": (
        ["{n} lives in {v}.", "{n} moved to {v}.", "The home of {n} is {v}."],
        ["Where does {n} live?", "Which city is {n} in?", "What is the city of {n}?"],
    ),
    "job": (
        ["{n} works as a {v}.", "{n} is a {v}.", "The job of {n} is {v}."],
        ["What is the job of {n}?", "What does {n} do?", "Which job does {n} have?"],
    ),
    "age": (
        ["{n} is {v} years old.", "{n} turned {v}.", "The age of {n} is {v}."],
        ["How old is {n}?", "What age is {n}?", "What is the age of {n}?"],
    ),
    "color": (
        ["{n} likes {v}.", "The favorite color of {n} is {v}.", "{n} loves the color {v}."],
        ["Which color does {n} like?", "What color does {n} love?", "What is the favorite color of {n}?"],
    ),
}
ATTRIBUTES = list(TEMPLATES)


def _all_names() -> list[str]:
    names = [(a + b).capitalize() for a in SYLLABLES for b in SYLLABLES if a != b]
    return sorted(set(names))


NAMES = _all_names()
CITIES = sorted({s + e for s in CITY_STEMS for e in CITY_ENDS})
VALUES = {"city": CITIES, "job": JOBS, "age": [str(a) for a in range(12, 96)], "color": COLORS}
SPLITS = ("train", "eval", "all")


def split_names(split: str) -> list[str]:
    # every 5th name is held out for evaluation
    if split == "train":
        return [n for i, n in enumerate(NAMES) if i % 5 != 0]
    if split == "eval":
        return [n for i, n in enumerate(NAMES) if i % 5 == 0]
    if split == "all":
        return NAMES
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def split_templates(templates: list[str], split: str) -> list[str]:
    if split == "train":
        return templates[:-1]
    if split == "eval":
        return templates[-1:]
    if split == "all":
        return templates
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass
class QAItem:
    passage: str  # context, starts with a space (byte-level BPE splits " Name" the same everywhere)
    question: str  # "\nQ: ...\nA: <asked name>" (see question_turn)
    answer: str  # " value"
    options: list[str] = field(default_factory=list)  # closed-set candidates (each " value"), answer included
    label: int = 0  # index of the answer in options
    attribute: str = ""
    facts: list[Fact] = field(default_factory=list)  # (person, attribute, value) of every fact in the passage
    person: str = ""  # whom the question is about


def template_words(split: str) -> list[str]:
    """The words of the split's fact and question templates (placeholders and punctuation removed)."""
    words = set()
    for facts, questions in TEMPLATES.values():
        for template in split_templates(facts, split) + split_templates(questions, split):
            words.update(w.strip(".?") for w in template.split() if "{" not in w)
    return sorted(words - {""})


def varied_template(rng: random.Random, split: str) -> str:
    """A fact template never used in pretraining: 0-2 words, the name, 1-3 words, the value, all words drawn from
    the split's own templates ("Where job Kalo of moved Marton."), so training on it adds phrasing variety
    without reading any held-out template."""
    words = template_words(split)
    before, between = rng.sample(words, rng.randint(0, 2)), rng.sample(words, rng.randint(1, 3))
    text = " ".join(before + ["{n}"] + between + ["{v}."])
    return text[0].upper() + text[1:]


def state_facts(
    rng: random.Random, slots: list[tuple[str, str]], split: str, phrase_mix: float = 0.0
) -> list[StatedFact]:
    """(person, attribute, value, sentence) for each (person, attribute) slot, in order; with probability
    phrase_mix a fact is phrased with a varied_template instead of one of the split's templates."""
    facts = []
    for person, attr in slots:
        value = rng.choice(VALUES[attr])
        template = rng.choice(split_templates(TEMPLATES[attr][0], split))
        if phrase_mix > 0 and rng.random() < phrase_mix:  # no extra draw at 0: datasets stay as they were
            template = varied_template(rng, split)
        facts.append((person, attr, value, template.format(n=person, v=value)))
    return facts


def ask_one(rng: random.Random, facts: list[StatedFact], split: str) -> tuple[str, str, str, str]:
    """A random fact of the passage and a question about it: (person, attribute, value, question)."""
    person, attr, value, _ = rng.choice(facts)
    return person, attr, value, rng.choice(split_templates(TEMPLATES[attr][1], split)).format(n=person)


def question_turn(question: str, person: str) -> str:
    """ "\nQ: <question>\nA: <asked name>": the answer follows the asked name directly. With any token between
    the name and the answer position ("...of Kalo?\nA:") the tiny models never learned to bind a value to its
    name; with the name last they do (experiments/translation/probe_recall.py,
    experiments/results/kvtranslate/checkpoints/README.md)."""
    return f"\nQ: {question}\nA: {person}"


def qa_item(facts: list[StatedFact], person: str, attr: str, value: str, question: str, options: list[str]) -> QAItem:
    return QAItem(
        passage=" " + " ".join(f[3] for f in facts),
        question=question_turn(question, person),
        answer=" " + value,
        options=[" " + o for o in options],
        label=options.index(value),
        attribute=attr,
        facts=[f[:3] for f in facts],
        person=person,
    )


def make_item(
    rng: random.Random,
    n_facts: int,
    split: str = "all",
    n_options: int = 4,
    max_people: int | None = None,
    template_split: str | None = None,
    phrase_mix: float = 0.0,
) -> QAItem:
    """One passage with n_facts facts, a question about one of them, and closed-set options.

    Facts are spread over people with attributes drawn so that same-type distractors are common. Names come from
    `split`, fact and question templates from `template_split` (default: `split` too)."""
    template_split = template_split or split
    names = split_names(split)
    n_people = max(1, min(n_facts, max_people or n_facts, rng.randint((n_facts + 1) // 2, n_facts)))
    people = rng.sample(names, n_people)
    slots = [(p, a) for p in people for a in ATTRIBUTES]
    # make sure each person gets at least one fact, then fill the rest
    chosen = [(p, rng.choice(ATTRIBUTES)) for p in people]
    rest = [s for s in slots if s not in chosen]
    rng.shuffle(rest)
    chosen += rest[: max(0, n_facts - len(chosen))]
    chosen = chosen[:n_facts]
    rng.shuffle(chosen)
    facts = state_facts(rng, chosen, template_split, phrase_mix)
    person, attr, value, question = ask_one(rng, facts, template_split)
    # options: the answer, same-type values present in the passage (hardest), then random ones
    in_passage = [f[2] for f in facts if f[1] == attr and f[2] != value]
    pool = [v for v in VALUES[attr] if v != value and v not in in_passage]
    distractors = list(dict.fromkeys(in_passage))[: n_options - 1]
    distractors += rng.sample(pool, n_options - 1 - len(distractors))
    options = [value] + distractors
    rng.shuffle(options)
    return qa_item(facts, person, attr, value, question, options)


def make_recall_item(rng: random.Random, n_facts: int, split: str = "all") -> QAItem:
    """A passage whose facts all share one attribute, each about a different person ("The job of A is x. The job
    of B is y. ..."): the type of the asked value gives no hint, only binding it to the asked name does."""
    attr = rng.choice(ATTRIBUTES)
    facts = state_facts(rng, [(person, attr) for person in rng.sample(split_names(split), n_facts)], split)
    person, attr, value, question = ask_one(rng, facts, split)
    return qa_item(facts, person, attr, value, question, [value])


def has_same_type_distractor(item: QAItem) -> bool:
    """Whether the passage holds another value of the asked type: only then does answering need the value
    bound to the asked name (with a single value of that type, matching the type is enough)."""
    return sum(f[1] == item.attribute for f in item.facts) >= 2


def asked_fact(item: QAItem) -> Fact:
    """The (person, attribute, value) fact that item's question asks about."""
    return next(f for f in item.facts if f[0] == item.person and f[1] == item.attribute)


def questions_about(
    rng: random.Random, item: QAItem, n: int, split: str = "eval", skip_asked: bool = False
) -> list[QAItem]:
    """Up to n items sharing item's passage, each asking a different fact of it (multi-question documents);
    skip_asked leaves out the fact item's own question asks."""
    out = []
    facts = [f for f in item.facts if f != asked_fact(item)] if skip_asked else item.facts
    for person, attr, value in rng.sample(facts, min(n, len(facts))):
        q = rng.choice(split_templates(TEMPLATES[attr][1], split)).format(n=person)
        out.append(
            QAItem(
                passage=item.passage,
                question=question_turn(q, person),
                answer=" " + value,
                options=[" " + value],
                label=0,
                attribute=attr,
                facts=item.facts,
                person=person,
            )
        )
    return out


def make_dataset(
    n: int,
    seed: int,
    split: str = "all",
    min_facts: int = 2,
    max_facts: int = 6,
    n_options: int = 4,
    template_split: str | None = None,
    phrase_mix: float = 0.0,
) -> list[QAItem]:
    rng = random.Random(seed)
    return [
        make_item(
            rng,
            rng.randint(min_facts, max_facts),
            split,
            n_options,
            template_split=template_split,
            phrase_mix=phrase_mix,
        )
        for _ in range(n)
    ]


def make_long_dataset(
    n: int,
    seed: int,
    split: str = "eval",
    n_facts: int = 24,
    n_options: int = 4,
    template_split: str | None = None,
    phrase_mix: float = 0.0,
    min_facts: int | None = None,
) -> list[QAItem]:
    """Long-context variant: many facts (tune n_facts so passages sit near the position limit), about two per
    person. With min_facts each passage draws its number of facts from min_facts..n_facts (a mix of lengths)."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        facts = n_facts if min_facts is None else rng.randint(min_facts, n_facts)  # no extra draw without it
        items.append(
            make_item(
                rng,
                facts,
                split,
                n_options,
                max_people=max(1, facts // 2),
                template_split=template_split,
                phrase_mix=phrase_mix,
            )
        )
    return items


def tokenizer_training_text(n_passages: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_passages):
        item = make_item(rng, rng.randint(1, 8))
        out.append(item.passage + item.question + item.answer)
    return out
