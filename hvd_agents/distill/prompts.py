"""Training prompts for the draft head: diverse free-text chat requests, generated from templates.

The head is distilled from the target's own answers to these prompts (no
external data set). ``training_prompts(n, seed)`` draws ``n`` distinct prompts
from the product of task templates and topics: explanations, stories, lists,
emails, comparisons, code and JSON. The chat prompts the model-drafter
benchmark measures on (:data:`hvd_agents.bench.prompts.CHAT_PROMPTS`) use
topics that are not in :data:`TOPICS`, so they are held out by construction
(a test checks it).
"""

from __future__ import annotations

import random

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

TEMPLATES: tuple[str, ...] = (
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
    "Return a JSON object describing {topic} with the keys \"name\", \"summary\" and \"tags\".",
    "Write a Python function related to {topic}, with a docstring and an example.",
)


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct training prompts drawn reproducibly from ``TEMPLATES`` x ``TOPICS``.

    Raises:
        ValueError: ``n`` exceeds the number of distinct prompts.
    """
    rng = random.Random(seed)
    pairs = [(t, topic) for t in TEMPLATES for topic in TOPICS]
    if n > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct training prompts, asked for {n}")
    rng.shuffle(pairs)
    prompts = []
    for template, topic in pairs[:n]:
        other = rng.choice([t for t in TOPICS if t != topic])
        prompts.append(template.format(topic=topic, other=other))
    return prompts
