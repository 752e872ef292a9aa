"""Training prompts for the draft head: chat, code, JSON and tool-calling turns, generated from templates.

The head is distilled from the target's own answers to these prompts (no
external data set). ``training_prompts(n, seed)`` draws ``n`` distinct prompts
in the proportions of :data:`DEFAULT_MIX`, each a :class:`TrainingPrompt` (its
kind, the chat messages and the tools the turn declares):

- ``chat``: explanations, stories, lists, emails, comparisons (templates x topics);
- ``code``: write, explain, test or fix code (templates x programming tasks);
- ``json``: JSON objects the user describes, and fields extracted from a text;
- ``tools``: a system prompt declaring tools (rendered by the chat template, as
  the engine renders a request's tools), then either a request the model answers
  with a call, or a call already made with its result, which the model reports.

What the benchmarks measure on is held out by construction: the chat prompts of
:data:`hvd_agents.bench.prompts.CHAT_PROMPTS` use topics outside :data:`TOPICS`,
and the tools here are not the benchmarks' tools (tests check both).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

TOPICS: tuple[str, ...] = (
    "photosynthesis", "the water cycle", "black holes", "machine learning", "the French Revolution",
    "climate change", "the human immune system", "electric cars", "the stock market", "coffee brewing",
    "the Roman Empire", "quantum computing", "honeybees", "the internet", "vaccines", "renewable energy",
    "the moon landing", "sleep", "meditation", "recycling", "the printing press", "earthquakes",
    "plate tectonics", "DNA", "the solar system", "rainforests", "ocean currents", "the Renaissance",
    "jazz music", "baking bread", "marathon training", "public speaking", "time management",
    "personal finance", "learning a new language", "gardening", "urban planning", "cryptography",
    "the Great Wall of China", "dinosaurs", "antibiotics", "the theory of relativity", "nutrition",
    "remote work", "video games", "social media", "democracy", "inflation", "supply chains",
    "the Industrial Revolution", "artificial intelligence ethics", "space exploration", "robotics",
    "3D printing", "blockchain", "cloud computing", "databases", "operating systems", "compilers",
    "computer networks", "open source software", "version control", "unit testing", "web browsers",
    "smartphones", "batteries", "wind turbines", "solar panels", "nuclear energy", "hydrogen fuel",
    "desert ecosystems", "coral reefs", "migratory birds", "wolves", "elephants", "octopuses",
    "mushrooms", "tea", "chocolate", "the Olympic Games", "football", "chess strategy", "photography",
    "film making", "poetry", "the novel", "ancient Egypt", "the Silk Road", "the Vikings",
    "the Cold War", "the printing of money", "taxes", "insurance", "job interviews", "leadership",
    "teamwork", "negotiation", "customer service", "project management", "startups", "marketing",
    "e-commerce", "city cycling", "trains", "airplanes", "ships", "bridges", "skyscrapers",
    "architecture", "interior design", "fashion", "cooking pasta", "vegetarian diets", "hiking",
    "camping", "mountains", "rivers", "glaciers", "weather forecasting", "hurricanes", "volunteering",
    "libraries", "museums", "online privacy", "passwords", "email etiquette", "spreadsheets",
)

CHAT_TEMPLATES: tuple[str, ...] = (
    "Explain {topic} to a beginner.",
    "Write a short story that involves {topic}.",
    "What are the main advantages and disadvantages of {topic}?",
    "Give me five practical tips about {topic}.",
    "Summarize the history of {topic} in one paragraph.",
    "Write a poem about {topic}.",
    "How would you explain {topic} to a ten-year-old?",
    "What are common misconceptions about {topic}?",
    "Write a friendly email to a colleague about {topic}.",
    "List the key facts everyone should know about {topic}.",
    "Describe step by step how {topic} works.",
    "Why does {topic} matter today?",
    "Write a short blog post introduction about {topic}.",
    "What questions should I ask an expert on {topic}?",
    "Compare {topic} with {other}.",
    "Write a dialogue between two friends discussing {topic}.",
    "Give a one-sentence definition of {topic}, then expand on it.",
    "Create a study plan for learning about {topic} in one week.",
)

CODE_TASKS: tuple[str, ...] = (
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the words in a text", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "parses a CSV line into fields", "validates an email address", "computes the median of a list",
    "flattens a nested list", "finds the longest common prefix of several strings", "converts Celsius to Fahrenheit",
    "reads a JSON file and returns its keys", "groups records by a key", "computes a moving average",
    "checks whether a string is a palindrome", "returns the factorial of n", "splits a list into chunks of size k",
    "finds the most frequent element of a list", "formats a number of seconds as hours, minutes and seconds",
    "implements binary search", "sorts a list of dictionaries by a field", "retries a function call three times",
    "caches the results of a function", "counts the lines of a file", "converts a string to snake_case",
    "checks that brackets in a string are balanced", "returns the intersection of two lists",
    "computes the greatest common divisor", "generates a random password",
)

CODE_LANGUAGES: tuple[str, ...] = ("Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java")

CODE_TEMPLATES: tuple[str, ...] = (
    "Write a {language} function that {task}.",
    "Write a {language} function that {task}, with a docstring and an example.",
    "Show me how to write a function in {language} that {task}, and explain it briefly.",
    "Write unit tests for a {language} function that {task}.",
    "What is the simplest way in {language} to write a function that {task}?",
    "Write a {language} function that {task}. Handle invalid input with a clear error.",
)

JSON_TEMPLATES: tuple[str, ...] = (
    "Return a JSON object describing {topic} with the keys \"name\", \"summary\" and \"tags\".",
    "Give me a JSON list of three facts about {topic}; each item has \"fact\" and \"source_type\".",
    "Describe {topic} as JSON with the fields \"title\", \"difficulty\" (1 to 5) and \"key_points\" (a list).",
    "Reply with JSON only: an object with \"question\" and \"answer\" for a quiz about {topic}.",
    "Create a JSON object for a to-do item about {topic} with \"id\", \"task\", \"done\" and \"priority\".",
)

PEOPLE: tuple[str, ...] = ("Alice Martin", "Bob Chen", "Carla Diaz", "David Okafor", "Emma Novak", "Farid Haddad",
                           "Grace Kim", "Hugo Silva", "Ines Moreau", "Jonas Berg")
CITIES: tuple[str, ...] = ("Lisbon", "Toronto", "Osaka", "Nairobi", "Oslo", "Denver", "Prague", "Lima", "Seoul",
                           "Dublin", "Melbourne", "Austin")
JSON_SYSTEM = "You are a helpful assistant. Answer with valid JSON only."


def tool_schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


def string_property(description: str) -> dict:
    return {"type": "string", "description": description}


TOOLS: tuple[dict, ...] = (
    tool_schema("get_stock_price", "Get the latest price of a stock.", {"symbol": string_property("ticker symbol, e.g. AAPL")},
          ["symbol"]),
    tool_schema("convert_currency", "Convert an amount between two currencies.",
          {"amount": {"type": "number"}, "from_currency": string_property("ISO code"), "to_currency": string_property("ISO code")},
          ["amount", "from_currency", "to_currency"]),
    tool_schema("send_email", "Send an email.", {"to": string_property("recipient address"), "subject": string_property("subject line"),
                                           "body": string_property("message text")}, ["to", "subject", "body"]),
    tool_schema("create_event", "Add an event to the calendar.",
          {"title": string_property("event title"), "date": string_property("YYYY-MM-DD"), "time": string_property("HH:MM")},
          ["title", "date"]),
    tool_schema("lookup_order", "Look up the status of a customer's order.", {"order_id": string_property("the order number")},
          ["order_id"]),
    tool_schema("find_restaurants", "Find restaurants in a city.",
          {"city": string_property("city name"), "cuisine": string_property("kind of food")}, ["city"]),
    tool_schema("read_file", "Read a text file of the project.", {"path": string_property("file path")}, ["path"]),
    tool_schema("run_sql", "Run a read-only SQL query on the sales database.", {"query": string_property("the SQL query")},
          ["query"]),
)

TOOL_SYSTEMS: tuple[str, ...] = (
    "You are a helpful assistant with access to tools. Call a tool when it helps answer the user.",
    "You are an assistant for a small business. Use the tools to act for the user, then report briefly.",
    "You are a precise assistant. Use tools for facts you do not know.",
)

_SYMBOLS = ("AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "IBM", "SAP", "ASML")
_CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "CAD")
_CUISINES = ("Italian", "Thai", "Mexican", "vegetarian", "Japanese", "Lebanese")
_FILES = ("src/app.py", "README.md", "config/settings.yaml", "tests/test_api.py", "setup.cfg")


def _tool_turn(rng: random.Random) -> tuple[dict, str, dict, dict]:
    """A tool, a user request for it, the call's arguments and a plausible result."""
    tool = rng.choice(TOOLS)
    name = tool["function"]["name"]
    person, city = rng.choice(PEOPLE), rng.choice(CITIES)
    day = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if name == "get_stock_price":
        symbol = rng.choice(_SYMBOLS)
        return tool, f"What is {symbol} trading at right now?", {"symbol": symbol}, \
            {"symbol": symbol, "price": round(rng.uniform(20, 900), 2), "currency": "USD"}
    if name == "convert_currency":
        amount, a, b = rng.randint(5, 5000), *rng.sample(_CURRENCIES, 2)
        return tool, f"How much is {amount} {a} in {b}?", {"amount": amount, "from_currency": a, "to_currency": b}, \
            {"amount": amount, "converted": round(amount * rng.uniform(0.5, 1.5), 2), "currency": b}
    if name == "send_email":
        to = person.split()[0].lower() + "@example.com"
        subject = rng.choice(("Meeting tomorrow", "Invoice", "Project update", "Lunch on Friday"))
        return tool, f"Email {to} with the subject '{subject}' and tell them I will be late.", \
            {"to": to, "subject": subject, "body": "I will be late."}, {"status": "sent", "to": to}
    if name == "create_event":
        title = rng.choice(("Dentist", "Team sync", f"Call with {person}", "Gym"))
        return tool, f"Put '{title}' in my calendar on {day} at {rng.randint(8, 18)}:00.", \
            {"title": title, "date": day}, {"created": True, "title": title, "date": day}
    if name == "lookup_order":
        order = str(rng.randint(10000, 99999))
        return tool, f"Where is my order {order}?", {"order_id": order}, \
            {"order_id": order, "status": rng.choice(("shipped", "processing", "delivered")), "eta": day}
    if name == "find_restaurants":
        cuisine = rng.choice(_CUISINES)
        return tool, f"Find me a {cuisine} restaurant in {city}.", {"city": city, "cuisine": cuisine}, \
            {"results": [{"name": f"{cuisine} House", "rating": 4.5}, {"name": f"Casa {city}", "rating": 4.1}]}
    if name == "read_file":
        path = rng.choice(_FILES)
        return tool, f"What is in {path}?", {"path": path}, {"path": path, "content": "# settings\nDEBUG = False\n"}
    year = rng.randint(2019, 2025)
    return tool, f"What were the total sales in {year}?", \
        {"query": f"SELECT SUM(amount) FROM sales WHERE year = {year}"}, {"rows": [[rng.randint(10**5, 10**7)]]}


@dataclass(frozen=True)
class TrainingPrompt:
    """One conversation the target answers: its ``kind`` (``chat``, ``code``, ``json``, ``tools``),
    the chat ``messages`` and the ``tools`` it declares (OpenAI format)."""

    kind: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = field(default=())

    def key(self) -> str:
        return json.dumps([self.messages, self.tools], sort_keys=True)


KINDS: tuple[str, ...] = ("chat", "code", "json", "tools")
DEFAULT_MIX: dict[str, float] = {"chat": 0.5, "code": 0.17, "json": 0.13, "tools": 0.2}


def user_turn(text: str, system: str | None = None) -> tuple[dict, ...]:
    """The messages of one user turn, after ``system`` when given."""
    head = ({"role": "system", "content": system},) if system else ()
    return (*head, {"role": "user", "content": text})


def templated_prompt(kind: str, rng: random.Random) -> TrainingPrompt:
    """One prompt of ``kind`` from this module's templates (the ``templated`` catalog)."""
    if kind == "chat":
        topic = rng.choice(TOPICS)
        other = rng.choice([t for t in TOPICS if t != topic])
        return TrainingPrompt(kind, user_turn(rng.choice(CHAT_TEMPLATES).format(topic=topic, other=other)))
    if kind == "code":
        text = rng.choice(CODE_TEMPLATES).format(language=rng.choice(CODE_LANGUAGES), task=rng.choice(CODE_TASKS))
        return TrainingPrompt(kind, user_turn(text))
    if kind == "json":
        if rng.random() < 0.6:
            return TrainingPrompt(kind, user_turn(rng.choice(JSON_TEMPLATES).format(topic=rng.choice(TOPICS)),
                                              JSON_SYSTEM if rng.random() < 0.5 else None))
        person, city, age = rng.choice(PEOPLE), rng.choice(CITIES), rng.randint(19, 80)
        text = (f"Extract the name, age and city from this text as a JSON object: \"{person} is {age} years old "
                f"and moved to {city} last year.\"")
        return TrainingPrompt(kind, user_turn(text, JSON_SYSTEM if rng.random() < 0.5 else None))
    tool, request, arguments, result = _tool_turn(rng)
    return tool_prompt(tool, request, arguments, result, [t for t in TOOLS if t is not tool], rng)


def tool_prompt(tool: dict, request: str, arguments: dict, result: object, others: list[dict],
                rng: random.Random) -> TrainingPrompt:
    """A tool-calling turn: ``tool`` declared with up to two of ``others``, a system prompt and the user's
    ``request``; half the time the call with ``arguments`` already made and its ``result`` returned, which the
    model reports."""
    tools = (tool, *rng.sample(others, rng.randint(0, 2)))
    messages = user_turn(request, rng.choice(TOOL_SYSTEMS))
    if rng.random() < 0.5:  # the call was made: the model reports its result
        name = tool["function"]["name"]
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        messages = (*messages, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(result)})
    return TrainingPrompt("tools", messages, tools)


def training_prompts(n: int, seed: int = 0, mix: dict[str, float] | None = None,
                     make: Callable[[str, random.Random], TrainingPrompt] = templated_prompt) -> list[TrainingPrompt]:
    """``n`` distinct training prompts, drawn reproducibly in the proportions of ``mix`` (default
    :data:`DEFAULT_MIX`; kinds from :data:`KINDS`), in a shuffled order; ``make(kind, rng)`` draws one
    (default: :func:`templated_prompt`; :mod:`hvd_agents.distill.catalogs` has the others).

    Raises:
        ValueError: an unknown kind, a negative share, or ``n`` more than the templates can make distinct.
    """
    mix = DEFAULT_MIX if mix is None else mix
    unknown = sorted(set(mix) - set(KINDS))
    if unknown or any(share < 0 for share in mix.values()) or not sum(mix.values()):
        raise ValueError(f"a mix gives non-negative shares of {', '.join(KINDS)}; got {mix}")
    rng = random.Random(seed)
    total = sum(mix.values())
    counts = {kind: int(n * share / total) for kind, share in mix.items()}
    counts[max(mix, key=mix.get)] += n - sum(counts.values())
    prompts: list[TrainingPrompt] = []
    for kind, count in counts.items():
        seen: set[str] = set()
        for _ in range(count * 50):
            if len(seen) == count:
                break
            prompt = make(kind, rng)
            if prompt.key() not in seen:
                seen.add(prompt.key())
                prompts.append(prompt)
        if len(seen) < count:
            raise ValueError(f"at most about {len(seen)} distinct {kind} prompts, asked for {count}")
    rng.shuffle(prompts)
    return prompts
