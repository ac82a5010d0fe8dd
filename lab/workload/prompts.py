"""Short deterministic user messages for generated events (the classifier's input in demos)."""

from __future__ import annotations

from kvcast.stats.taxonomy import INTENTS_30

_FIRST: dict[str, tuple[str, ...]] = {
    "code_debugging": (
        "My {x} throws a null pointer exception when I call it twice, can you find the bug?",
        "This {x} fails its unit test with an off-by-one error, here is the stack trace.",
        "Why does my {x} segfault after the refactor? The traceback points at the loop.",
    ),
    "chitchat": (
        "Hey there! How is your day going? I just finished {x}.",
        "Hi, just wanted to say hello and chat a bit about {x}.",
        "Good morning! Tell me something fun, I'm bored after {x}.",
    ),
    "creative_writing": (
        "Write a short poem about {x} in the style of a sea shanty.",
        "Write a short story where {x} is the main character.",
        "Draft the opening scene of a play set around {x}.",
    ),
    "travel_planning": (
        "Plan a five-day itinerary for a trip that includes {x}.",
        "What is the cheapest way to travel to {x} next month?",
        "Suggest hotels and train connections for a weekend visiting {x}.",
    ),
    "general_explanations_definitions": (
        "Can you explain what {x} is and how it works?",
        "What is the definition of {x}, in simple words?",
        "Give me an overview of {x} for a beginner.",
    ),
}
_TOPICS: dict[str, tuple[str, ...]] = {
    "code_debugging": (
        "Python parser",
        "React component",
        "SQL query",
        "Rust borrow checker fix",
        "bash script",
        "Go HTTP handler",
    ),
    "chitchat": ("a long walk", "my coffee", "a movie night", "work", "a nap"),
    "creative_writing": (
        "a lighthouse keeper",
        "a lonely robot",
        "the last summer day",
        "a dragon who bakes bread",
    ),
    "travel_planning": ("Kyoto", "the Scottish Highlands", "Lisbon", "Patagonia", "Vienna"),
    "general_explanations_definitions": (
        "photosynthesis",
        "inflation",
        "a black hole",
        "the immune system",
        "blockchain",
    ),
}
_FOLLOW: tuple[str, ...] = (
    "Thanks. Can you go into more detail about {x}?",
    "That helps. Now change it a bit for {x}.",
    "Follow-up about {x}: what would you do differently?",
)


def prompt_text(intent: str, turn: int, choice: int) -> str:
    """A short deterministic user message for ``intent`` at ``turn``; ``choice`` picks variants."""
    topics = _TOPICS.get(intent, ("this",))
    x = topics[(choice >> 8) % len(topics)]
    if turn == 1:
        first = _FIRST.get(intent)
        if first is None:
            description = INTENTS_30.get(intent, "a general question").rstrip(".").lower()
            return f"I have a request about {description}. Can you help me with {x}?"
        return first[choice % len(first)].format(x=x)
    return _FOLLOW[choice % len(_FOLLOW)].format(x=x)
