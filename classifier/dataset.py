"""Labelled requests (JSONL) and the stratified 80/10/10 split.

One JSON object per line::

    {"id": "cg-001", "intent": "code_generation", "lang": "en", "text": "Write a ..."}
    {"id": "cg-031", "intent": "code_debugging", "lang": "en", "turns": ["first", "last"]}
    {"id": "x", "intent": "chitchat", "messages": [{"role": "user", "content": "hi"}]}

``text`` is a single request; ``turns`` the user messages of one conversation, oldest first;
``messages`` a chat (its user messages are taken). The label is the intent of the last user
message. ``split`` (``train``, ``val`` or ``test``) is optional; where absent,
:func:`stratified_split` assigns one.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from kvcast.classifier.inputs import WINDOW_TURNS, Window, window_from_messages
from kvcast.stats.taxonomy import merge_map

SPLITS = ("train", "val", "test")
FRACTIONS = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class Example:
    """One labelled request: its window (turn, text), 30- or merged label, language, split."""

    id: str
    intent: str
    window: Window
    lang: str = "en"
    split: str | None = None


def _window(record: dict) -> Window:
    if "messages" in record:
        return window_from_messages(record["messages"])
    turns = record.get("turns")
    if turns is None:
        turns = [record["text"]]
    turns = [str(t) for t in turns][-WINDOW_TURNS:]
    total = len(record.get("turns") or [None])
    first = total - len(turns) + 1
    return [(first + k, text) for k, text in enumerate(turns)]


def read_examples(path: str | Path, taxonomy: int = 30) -> list[Example]:
    """Labelled examples of a JSONL file, labels mapped to the ``taxonomy``-category set.

    Raises ValueError naming the line of a record without a known intent or without text.
    """
    mapping = merge_map(taxonomy)
    merged = set(mapping.values())
    out: list[Example] = []
    with Path(path).open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = orjson.loads(line)
            intent = record.get("intent")
            if intent in mapping:
                intent = mapping[intent]
            elif intent not in merged:
                raise ValueError(f"{path}:{lineno}: unknown intent {intent!r}")
            try:
                window = _window(record)
            except KeyError as exc:
                raise ValueError(f"{path}:{lineno}: no text, turns or messages") from exc
            if not window:
                raise ValueError(f"{path}:{lineno}: no user text")
            split = record.get("split")
            if split is not None and split not in SPLITS:
                raise ValueError(f"{path}:{lineno}: split must be one of {SPLITS}")
            out.append(
                Example(
                    id=str(record.get("id", lineno)),
                    intent=intent,
                    window=window,
                    lang=str(record.get("lang", "en")),
                    split=split,
                )
            )
    return out


def stratified_split(
    labels: Sequence[str], seed: int = 0, fractions: tuple[float, float, float] = FRACTIONS
) -> list[str]:
    """A split name per item: within each class, shuffled, then cut 80/10/10 (rounded).

    Every class with at least three items gets at least one validation and one test item.
    """
    rng = random.Random(seed)
    by_class: dict[str, list[int]] = defaultdict(list)
    for index, label in enumerate(labels):
        by_class[label].append(index)
    out = ["train"] * len(labels)
    for label in sorted(by_class):
        members = by_class[label]
        rng.shuffle(members)
        n = len(members)
        n_val = round(n * fractions[1])
        n_test = round(n * fractions[2])
        if n >= 3:
            n_val, n_test = max(1, n_val), max(1, n_test)
        for index in members[:n_val]:
            out[index] = "val"
        for index in members[n_val : n_val + n_test]:
            out[index] = "test"
    return out


def assign_splits(examples: Sequence[Example], seed: int = 0) -> list[str]:
    """The split of each example: its own where every example has one, else stratified."""
    if examples and all(e.split is not None for e in examples):
        return [e.split for e in examples]  # type: ignore[misc]
    return stratified_split([e.intent for e in examples], seed)
