"""Prompt catalogs for the draft head's training data: the templated one, and a broader one made procedurally.

A head learns the prompts it is trained on: on held-out prompts the shipped head agreed with the target at
0.476 teacher-forced against 0.558 on its own prompts' held-out split, furthest apart on tool calls (0.433
against 0.624) and code (0.468 against 0.596), where :mod:`hvd_agents.distill.prompts` has 8 tools and 30
programming tasks (``hvd-agents bench-head``, docs/benchmarks.md). The ``broad`` catalog draws, beside those
templates, from combinations that make far more distinct prompts:

- ``tools``: tools made from an entity and an action (``get_invoice_details``, ``cancel_hotel_booking``,
  ``count_support_tickets``, ...: 24 entities x 6 actions, each with its own parameters, a request worded for
  it, arguments and a result), declared beside up to two others; the call turn and the report turn as in the
  templated catalog;
- ``code``: programming tasks made of an operation and the data it works on (16 x 16), in more languages and
  phrasings;
- ``chat`` and ``json``: the templated topics and more (:data:`MORE_TOPICS`), with question-style templates
  beside the templated ones.

Nothing here names a benchmark's prompt, tool, task or topic (tests check it). Like the templated catalog it is
deterministic: a seed gives the same prompts on any machine.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from hvd_agents.distill.prompts import (
    CHAT_TEMPLATES,
    CODE_LANGUAGES,
    CODE_TEMPLATES,
    JSON_SYSTEM,
    JSON_TEMPLATES,
    PEOPLE,
    TOOLS,
    TOPICS,
    TrainingPrompt,
    string_property,
    templated_prompt,
    tool_prompt,
    tool_schema,
    user_turn,
)

MORE_TOPICS: tuple[str, ...] = (
    "bicycle maintenance", "sourdough starters", "tide pools", "the metric system", "sign language",
    "birdwatching", "typography", "public transport", "composting", "the history of maps", "solar eclipses",
    "first aid", "houseplants", "caves", "penguins", "the immune response to allergies", "knitting",
    "ancient Greece", "the Byzantine Empire", "radio waves", "microwave ovens", "refrigerators", "tsunamis",
    "sand dunes", "fossils", "the periodic table", "magnets", "rainbows", "fermentation", "cheese making",
    "street food", "tango", "opera", "sculpture", "comic books", "animation", "podcasting", "journaling",
    "minimalism", "budget travel", "jet lag", "noise pollution", "light pollution", "water purification",
    "salt", "spices", "the human heart", "memory", "habits", "procrastination", "negotiating a salary",
    "writing a CV", "renting an apartment", "saving for retirement", "credit scores", "electric scooters",
    "satellites", "GPS", "barcodes", "QR codes", "touchscreens", "keyboards", "fonts", "emoji",
)

QUESTION_TEMPLATES: tuple[str, ...] = (
    "Why is {topic} more complicated than it looks?",
    "How can I get started with {topic} this weekend?",
    "What would happen if nobody cared about {topic} any more?",
    "I keep hearing about {topic}. What do I actually need to know?",
    "My friend says {topic} is overrated. What would you tell them?",
    "Tell me a short, funny anecdote involving {topic}.",
    "What does a day look like for someone whose job is {topic}?",
    "What mistakes do beginners make with {topic}, and how can they avoid them?",
    "Describe {topic} with an analogy from the kitchen.",
    "Is there anything surprising about {topic} that most people get wrong?",
    "Plan a one-hour workshop on {topic} for teenagers.",
    "Can you explain {topic} in three short paragraphs?",
    "What changed about {topic} in the last fifty years?",
    "How is {topic} different from {other}, in plain words?",
)

CODE_OPERATIONS: tuple[str, ...] = (
    "counts", "sorts", "filters out the invalid entries of", "groups", "totals", "finds the largest of",
    "removes empty entries from", "validates", "normalizes", "deduplicates", "reverses the order of",
    "pairs up", "serializes to JSON", "parses", "compares", "summarizes",
)
CODE_DATA: tuple[str, ...] = (
    "the temperatures in a list of daily readings", "a list of user records by age", "the vowels in a word",
    "a list of URLs", "prices given as strings like '$4.50'", "a list of (city, population) tuples",
    "the keys of two dictionaries", "the lines of a log file", "version strings like '1.2.10'",
    "hex color codes", "phone numbers written in different formats", "a list of tasks with due dates",
    "words by their first letter", "IPv4 addresses", "the digits of an integer", "rows of a spreadsheet",
)
MORE_LANGUAGES: tuple[str, ...] = ("C#", "C++", "Kotlin", "Ruby", "PHP", "Swift")
MORE_CODE_TEMPLATES: tuple[str, ...] = (
    "In {language}, how would I write code that {task}?",
    "Write a small {language} class with a method that {task}.",
    "What edge cases should a {language} function that {task} handle? Show the code.",
    "Write a {language} command-line script that {task} and prints the result.",
    "Explain, then write, a {language} function that {task}.",
)

# (entity, plural, identifier parameter, a value's prefix): the tools' domains
ENTITIES: tuple[tuple[str, str, str, str], ...] = (
    ("invoice", "invoices", "invoice_id", "INV"), ("support ticket", "support tickets", "ticket_id", "T"),
    ("flight booking", "flight bookings", "booking_ref", "FL"), ("hotel booking", "hotel bookings", "booking_id", "H"),
    ("parcel", "parcels", "tracking_number", "PK"), ("user account", "user accounts", "username", ""),
    ("playlist", "playlists", "playlist_id", "PL"), ("recipe", "recipes", "recipe_id", "R"),
    ("appointment", "appointments", "appointment_id", "AP"), ("product", "products", "sku", "SKU"),
    ("repository", "repositories", "repo", ""), ("meeting room", "meeting rooms", "room_id", "RM"),
    ("library loan", "library loans", "loan_id", "L"), ("train ticket", "train tickets", "ticket_number", "TR"),
    ("task", "tasks", "task_id", "TK"), ("note", "notes", "note_id", "N"), ("contact", "contacts", "contact_id", "C"),
    ("shipment", "shipments", "shipment_id", "SH"), ("thermostat", "thermostats", "device_id", "D"),
    ("course enrollment", "course enrollments", "enrollment_id", "E"), ("job posting", "job postings", "posting_id", "J"),
    ("podcast episode", "podcast episodes", "episode_id", "EP"), ("car rental", "car rentals", "rental_id", "CR"),
    ("insurance claim", "insurance claims", "claim_id", "CL"),
)
ACTIONS: tuple[str, ...] = ("details", "search", "create", "cancel", "status", "count")
_STATUSES = ("open", "pending", "done", "on hold", "archived")
_QUERIES = ("late", "urgent", "from last week", "over 100 dollars", "tagged billing", "in Berlin", "unpaid")
_REASONS = ("a schedule change", "a duplicate", "the customer asked", "wrong details")
_WORDS = ("Orion", "Maple", "Harbor", "Quartz", "Juniper", "Atlas", "Nimbus", "Cedar", "Falcon", "Willow")


def _name(entity: str) -> str:
    return entity.replace(" ", "_")


def _identifier(prefix: str, rng: random.Random) -> str:
    if not prefix:
        return f"{rng.choice(_WORDS).lower()}{rng.randint(1, 99)}"
    return f"{prefix}-{rng.randint(1000, 99999)}"


def made_tool(entity: tuple[str, str, str, str], action: str, rng: random.Random) -> tuple[dict, str, dict, object]:
    """A tool for ``action`` on ``entity``, a user request for it, the call's arguments and a plausible result."""
    noun, plural, key, prefix = entity
    ident = _identifier(prefix, rng)
    if action == "details":
        tool = tool_schema(f"get_{_name(noun)}_details", f"Get the details of a {noun}.",
                           {key: string_property(f"the {noun}'s identifier")}, [key])
        return tool, rng.choice((f"Can you pull up {noun} {ident}?", f"What do we know about {noun} {ident}?")), \
            {key: ident}, {key: ident, "owner": rng.choice(PEOPLE), "status": rng.choice(_STATUSES)}
    if action == "search":
        query = rng.choice(_QUERIES)
        tool = tool_schema(f"search_{_name(plural)}", f"Search the {plural}.",
                           {"query": string_property("words to search for"),
                            "limit": {"type": "integer", "description": "most results"}}, ["query"])
        return tool, f"Find the {plural} that are {query}.", {"query": query}, \
            {"results": [{key: _identifier(prefix, rng)} for _ in range(rng.randint(1, 3))]}
    if action == "create":
        title = f"{rng.choice(_WORDS)} {rng.choice(('review', 'plan', 'order', 'draft', 'request'))}"
        tool = tool_schema(f"create_{_name(noun)}", f"Create a new {noun}.",
                           {"title": string_property("a short title"), "owner": string_property("who owns it")},
                           ["title"])
        owner = rng.choice(PEOPLE)
        return tool, f"Create a new {noun} called '{title}' for {owner}.", {"title": title, "owner": owner}, \
            {"created": True, key: ident}
    if action == "cancel":
        reason = rng.choice(_REASONS)
        tool = tool_schema(f"cancel_{_name(noun)}", f"Cancel a {noun}.",
                           {key: string_property(f"the {noun}'s identifier"), "reason": string_property("why")},
                           [key])
        return tool, f"Please cancel {noun} {ident}; the reason is {reason}.", {key: ident, "reason": reason}, \
            {"cancelled": True, key: ident}
    if action == "status":
        status = rng.choice(_STATUSES)
        tool = tool_schema(f"set_{_name(noun)}_status", f"Change the status of a {noun}.",
                           {key: string_property(f"the {noun}'s identifier"),
                            "status": {"type": "string", "enum": list(_STATUSES)}}, [key, "status"])
        return tool, f"Mark {noun} {ident} as {status}.", {key: ident, "status": status}, \
            {key: ident, "status": status, "updated": True}
    query = rng.choice(_STATUSES)
    tool = tool_schema(f"count_{_name(plural)}", f"Count the {plural} in a given state.",
                       {"state": {"type": "string", "enum": list(_STATUSES)}}, ["state"])
    return tool, f"How many {plural} are {query} right now?", {"state": query}, {"count": rng.randint(0, 250)}


def made_tool_names() -> set[str]:
    """Every tool name :func:`made_tool` can make."""
    rng = random.Random(0)
    return {made_tool(entity, action, rng)[0]["function"]["name"] for entity in ENTITIES for action in ACTIONS}


@functools.cache
def made_code_tasks() -> tuple[str, ...]:
    """Every programming task the ``broad`` catalog makes (built once)."""
    return tuple(f"{operation} {data}" for operation in CODE_OPERATIONS for data in CODE_DATA)


def broad_prompt(kind: str, rng: random.Random) -> TrainingPrompt:
    """One prompt of ``kind`` from the ``broad`` catalog (see the module docstring)."""
    if kind == "tools":
        if rng.random() < 0.25:
            return templated_prompt(kind, rng)
        tool, request, arguments, result = made_tool(rng.choice(ENTITIES), rng.choice(ACTIONS), rng)
        others = [made_tool(rng.choice(ENTITIES), rng.choice(ACTIONS), rng)[0] for _ in range(2)] + list(TOOLS[:2])
        others = [other for other in others if other["function"]["name"] != tool["function"]["name"]]
        return tool_prompt(tool, request, arguments, result, others, rng)
    if kind == "code":
        if rng.random() < 0.25:
            return templated_prompt(kind, rng)
        template = rng.choice(CODE_TEMPLATES + MORE_CODE_TEMPLATES)
        language = rng.choice(CODE_LANGUAGES + MORE_LANGUAGES)
        return TrainingPrompt(kind, user_turn(template.format(language=language, task=rng.choice(made_code_tasks()))))
    topics = TOPICS + MORE_TOPICS
    topic = rng.choice(topics)
    if kind == "chat":
        other = rng.choice([t for t in topics if t != topic])
        template = rng.choice(CHAT_TEMPLATES + QUESTION_TEMPLATES)
        return TrainingPrompt(kind, user_turn(template.format(topic=topic, other=other)))
    if rng.random() < 0.5:
        return TrainingPrompt(kind, user_turn(rng.choice(JSON_TEMPLATES).format(topic=topic),
                                              JSON_SYSTEM if rng.random() < 0.5 else None))
    return templated_prompt(kind, rng)


CATALOGS: dict[str, Callable[[str, random.Random], TrainingPrompt]] = {
    "templated": templated_prompt,
    "broad": broad_prompt,
}
"""The prompt catalogs by name (``train-drafter --catalog``): what draws one prompt of a kind."""
