"""The intent taxonomy of the IAC paper (appendix C): 30 categories and their 20/10 merges,
plus the agent intents kvcast's producers set from how a response ended.

Pure data shared by the statistics (state keys), the classifier (labels) and the generator.
``unknown`` is a valid state of its own: no classifier input, classifier disabled, or over budget.
The agent intents (:data:`AGENT_INTENTS`) are states of every taxonomy size but never a
classifier's output: only a producer sets them (``kvcast.producer.endings``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import MappingProxyType

UNKNOWN = "unknown"

INTENTS_30: MappingProxyType[str, str] = MappingProxyType(
    {
        "general_explanations_definitions": "Broad factual explanations, concept definitions, or general knowledge questions.",
        "creative_writing": "Creative writing such as stories, poems, scripts, or imaginative text generation.",
        "math_problem_solving": "Solving math questions, equations, symbolic problems, or numerical calculations.",
        "writing_business_marketing": "Business communication, professional writing, ads, pitches, or marketing content.",
        "code_generation": "Writing code from instructions, generating scripts, or implementing programming solutions.",
        "how_to_guides": "Step-by-step instructions for completing a task or learning how to do something.",
        "relationship": "Questions or discussion about romantic or interpersonal relationship issues.",
        "academic_writing": "Academic writing such as essays, reports, research text, or scholarly-style content.",
        "health_medical_info": "Health, symptom, medical, fitness, or wellness-related information requests.",
        "summarization": "Summarizing text, documents, articles, notes, or conversations.",
        "recommendations_products": "Requests for product suggestions, comparisons, or purchase recommendations.",
        "code_debugging": "Finding, explaining, or fixing bugs, errors, or technical issues in code or systems.",
        "chitchat": "Casual conversation, greetings, or light social interaction without a clear task goal.",
        "writing_editing_proofreading": "Revising, proofreading, shortening, polishing, or improving existing text.",
        "data_analysis_statistics": "Statistical analysis, data interpretation, quantitative reasoning, or results explanation.",
        "entertainment_media": "Movies, TV, music, books, games, celebrities, or general entertainment topics.",
        "career_jobs": "Career advice, resume help, interview preparation, job search, or workplace questions.",
        "legal_info": "Questions about laws, legal procedures, rights, or legal concepts.",
        "data_extraction_structuring": "Extracting structured information from unstructured text or reorganizing content into tables, fields, or formats.",
        "translation": "Translating content between languages.",
        "personal_life_advice": "Advice about everyday personal decisions, habits, routines, or general life situations.",
        "mental_wellbeing_support": "Emotional support, stress-related discussion, motivation, or general mental well-being guidance.",
        "research_deep_dive": "In-depth analytical or research-oriented requests requiring detailed explanation or synthesis.",
        "philosophy_religion": "Questions about beliefs, ethics, religion, spirituality, or philosophical ideas.",
        "travel_planning": "Planning trips, itineraries, transportation, destinations, or travel logistics.",
        "education_study_help": "General studying support, concept learning, homework help, or academic tutoring.",
        "personal_finance": "Budgeting, saving, investing, loans, taxes, or other personal finance topics.",
        "food_cooking_recipes": "Recipes, cooking instructions, ingredient substitutions, or food preparation advice.",
        "current_events_politics": "News, politics, public affairs, elections, or recent real-world events.",
        "system_admin_devops": "System setup, deployment, infrastructure, DevOps, cloud, networking, or server management.",
    }
)

# Merged label -> the original labels it absorbs (appendix C.2 and C.3).
MERGE_20: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "advice_support": ("relationship", "personal_life_advice", "mental_wellbeing_support"),
        "career_jobs": ("career_jobs",),
        "chitchat": ("chitchat",),
        "coding_and_systems": ("code_generation", "code_debugging", "system_admin_devops"),
        "current_events_politics": ("current_events_politics",),
        "education_learning": ("math_problem_solving", "education_study_help"),
        "food_cooking_recipes": ("food_cooking_recipes",),
        "general_explanations_definitions": ("general_explanations_definitions",),
        "health_medical_info": ("health_medical_info",),
        "how_to_guides": ("how_to_guides",),
        "legal_info": ("legal_info",),
        "personal_finance": ("personal_finance",),
        "philosophy_religion": ("philosophy_religion",),
        "recommendations": ("recommendations_products", "entertainment_media"),
        "research_deep_dive": (
            "data_analysis_statistics",
            "data_extraction_structuring",
            "research_deep_dive",
        ),
        "summarization": ("summarization",),
        "translation": ("translation",),
        "travel_planning": ("travel_planning",),
        "writing_creation": ("creative_writing", "writing_business_marketing", "academic_writing"),
        "writing_editing_proofreading": ("writing_editing_proofreading",),
    }
)

MERGE_10: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "advice_support": ("relationship", "personal_life_advice", "mental_wellbeing_support"),
        "career_education": ("math_problem_solving", "career_jobs", "education_study_help"),
        "chitchat": ("chitchat",),
        "coding_debugging": ("code_generation", "code_debugging", "system_admin_devops"),
        "data_work": ("data_analysis_statistics", "data_extraction_structuring"),
        "high_stakes_info": ("health_medical_info", "legal_info", "personal_finance"),
        "how_to_practical": ("how_to_guides", "food_cooking_recipes"),
        "recommendations_planning": (
            "recommendations_products",
            "entertainment_media",
            "travel_planning",
        ),
        "research_news": (
            "general_explanations_definitions",
            "research_deep_dive",
            "philosophy_religion",
            "current_events_politics",
        ),
        "writing_language": (
            "creative_writing",
            "writing_business_marketing",
            "academic_writing",
            "summarization",
            "writing_editing_proofreading",
            "translation",
        ),
    }
)

# How an agent's response ended (its OpenAI finish_reason), set by kvcast's producers when the
# caller gives no intent (docs/events.md, "Agent intents"); the same in the 30, 20 and 10 sizes.
AGENT_INTENTS: MappingProxyType[str, str] = MappingProxyType(
    {
        "agent_tool_call": "The response called a tool (finish_reason tool_calls or function_call, or a reply carrying tool calls): the caller's machine runs it and comes back, in seconds.",
        "agent_stop": "The response ended its turn (finish_reason stop): the next turn, if any, is a person's.",
        "agent_length": "The response reached its token limit (finish_reason length).",
        "agent_content_filter": "The engine's content filter ended the response (finish_reason content_filter).",
        "agent_cut": "The response never finished: the client hung up, the upstream failed or timed out, or the engine aborted it (no finish_reason, or abort or error).",
    }
)

TAXONOMIES: MappingProxyType[int, tuple[str, ...]] = MappingProxyType(
    {
        30: tuple(INTENTS_30),
        20: tuple(MERGE_20),
        10: tuple(MERGE_10),
    }
)


def merge_map(size: int) -> dict[str, str]:
    """Original 30-category label -> label of the ``size``-category taxonomy (30, 20 or 10)."""
    if size == 30:
        return {label: label for label in INTENTS_30}
    merges = {20: MERGE_20, 10: MERGE_10}.get(size)
    if merges is None:
        raise ValueError(f"taxonomy size must be 30, 20 or 10, got {size}")
    return {original: merged for merged, originals in merges.items() for original in originals}


def intents(size: int = 30) -> tuple[str, ...]:
    """State labels of a taxonomy: its categories, the agent intents, then ``unknown``."""
    if size not in TAXONOMIES:
        raise ValueError(f"taxonomy size must be 30, 20 or 10, got {size}")
    return (*TAXONOMIES[size], *AGENT_INTENTS, UNKNOWN)


# At most this many intents a deployment may add (``--taxonomy-file``): every state label becomes
# a table key and a metric label, so the set stays bounded.
MAX_EXTRA_INTENTS = 64
_INTENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def label_map(size: int = 30, extra: Sequence[str] = ()) -> dict[str, str]:
    """Producer label -> the state label it counts under; a label not in it folds to unknown.

    The ``size``-category taxonomy's labels (30, 20 or 10) map to themselves, and with 20 or 10
    the original 30 map to their merged category; the agent intents and ``extra`` intents (a
    deployment's own) map to themselves; ``unknown`` to itself. The same map in every process: a label's fate never
    depends on which labels a process happened to see first. ValueError names a bad extra.
    """
    mapping = {label: label for label in intents(size)}
    mapping.update(merge_map(size))
    if len(extra) > MAX_EXTRA_INTENTS:
        raise ValueError(f"{len(extra)} extra intents: at most {MAX_EXTRA_INTENTS}")
    for name in extra:
        if not isinstance(name, str) or not _INTENT_NAME.fullmatch(name):
            raise ValueError(f"extra intent {name!r}: use 1-64 of A-Z a-z 0-9 _ . : -")
        if mapping.get(name, name) != name:
            raise ValueError(f"extra intent {name!r} is already merged into {mapping[name]!r}")
        mapping[name] = name
    return mapping
