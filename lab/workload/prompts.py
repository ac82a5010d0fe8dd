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
_AGENT_TASKS: tuple[str, ...] = (
    "Fix the failing test in {x} and run the suite again.",
    "Add a command-line flag to {x}, with tests and docs.",
    "Find why {x} is slow and make it faster without changing its output.",
)
_AGENT_TOPICS: tuple[str, ...] = ("the parser module", "the HTTP client", "the cache layer")
_AGENT_FOLLOW: tuple[str, ...] = (
    "[tool result] {x}: 3 files changed, tests pass.",
    "[tool result] {x}: 1 test failed, see the traceback above.",
    "Looks good. Now do the same for {x}.",
)
_FOLLOW: tuple[str, ...] = (
    "Thanks. Can you go into more detail about {x}?",
    "That helps. Now change it a bit for {x}.",
    "Follow-up about {x}: what would you do differently?",
)


def prompt_text(intent: str, turn: int, choice: int) -> str:
    """A short deterministic user message for ``intent`` at ``turn``; ``choice`` picks variants."""
    if intent.startswith("agent_"):  # a coding agent's task, then tool results
        x = _AGENT_TOPICS[(choice >> 8) % len(_AGENT_TOPICS)]
        texts = _AGENT_TASKS if turn == 1 else _AGENT_FOLLOW
        return texts[choice % len(texts)].format(x=x)
    topics = _TOPICS.get(intent, ("this",))
    x = topics[(choice >> 8) % len(topics)]
    if turn == 1:
        first = _FIRST.get(intent)
        if first is None:
            description = INTENTS_30.get(intent, "a general question").rstrip(".").lower()
            return f"I have a request about {description}. Can you help me with {x}?"
        return first[choice % len(first)].format(x=x)
    return _FOLLOW[choice % len(_FOLLOW)].format(x=x)
