"""The structured suite's tasks, written for this project: fields extracted from short texts into a JSON schema,
classification into an enum, and function calls for a small set of tools (the call as a JSON object {"name",
"arguments"}, so that GenAI's JSON-schema constraint expresses it too). TASKS: (schema, the user's message)."""
from __future__ import annotations

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                                                "maximum": 120},
                         "city": {"type": "string", "maxLength": 40}}}
EVENT = {"type": "object", "additionalProperties": False, "required": ["title", "date", "attendees"],
         "properties": {"title": {"type": "string", "maxLength": 60},
                        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                        "attendees": {"type": "array", "maxItems": 6, "items": {"type": "string", "maxLength": 30}}}}
PRODUCT = {"type": "object", "additionalProperties": False, "required": ["product", "price", "currency", "in_stock"],
           "properties": {"product": {"type": "string", "maxLength": 40}, "price": {"type": "number"},
                          "currency": {"enum": ["EUR", "USD", "GBP"]}, "in_stock": {"type": "boolean"}}}
SENTIMENT = {"type": "object", "additionalProperties": False, "required": ["sentiment"],
             "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}}}
TOPIC = {"type": "object", "additionalProperties": False, "required": ["topic", "urgent"],
         "properties": {"topic": {"enum": ["billing", "shipping", "account", "technical", "other"]},
                        "urgent": {"type": "boolean"}}}
TOOLS = {
    "get_weather": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                    "properties": {"city": {"type": "string", "maxLength": 40},
                                   "unit": {"enum": ["celsius", "fahrenheit"]}}},
    "send_email": {"type": "object", "additionalProperties": False, "required": ["to", "subject"],
                   "properties": {"to": {"type": "string", "maxLength": 60}, "subject": {"type": "string",
                                                                                        "maxLength": 60}}},
    "create_reminder": {"type": "object", "additionalProperties": False, "required": ["text", "minutes"],
                        "properties": {"text": {"type": "string", "maxLength": 60},
                                       "minutes": {"type": "integer", "minimum": 1, "maximum": 1440}}},
}
CALL = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                   "properties": {"name": {"const": name}, "arguments": schema}} for name, schema in TOOLS.items()]}
TOOL_HELP = ("Answer with one function call as JSON {\"name\": ..., \"arguments\": {...}}. Functions: "
             "get_weather(city, unit: celsius|fahrenheit), send_email(to, subject), create_reminder(text, minutes).")

TASKS = [
    (PERSON, "Extract the person as JSON (name, age, city): Maria Lopez, 34, moved to Valencia last spring."),
    (PERSON, "Extract the person as JSON (name, age, city): Our new intern is Tom Becker (22) from Hamburg."),
    (PERSON, "Extract the person as JSON (name, age, city): At 67, retired teacher Ahmed Karimi still lives in Lyon."),
    (PERSON, "Extract the person as JSON (name, age, city): Kenji Sato, aged 45, is the mayor of Sapporo."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): The design review is on 14 March "
            "2025 with Ana, Ben and Chloe."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): Quarterly planning, 2 June 2026; "
            "invited: Priya, Omar."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): Launch party on 1 December 2025 for "
            "the whole team: Lea, Max, Noor, Ivan."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): The ThinkPad X1 costs 1899 EUR "
              "and ships today."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): Sorry, the Aeron chair (USD 1450) "
              "is sold out."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): Kindle Paperwhite, 149.99 GBP, "
              "available."),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'The battery died after two days. Never again.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'Arrived on time, works exactly as described.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'It is a cable. It transmits data.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'Best purchase I made this year, my kids love it!'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'I was charged twice for my subscription.'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'The app crashes on start, our shop is down!'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'Where is my parcel? It has been three weeks.'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'How do I change the email on my account?'"),
    (CALL, TOOL_HELP + " Request: What's the weather like in Oslo, in celsius?"),
    (CALL, TOOL_HELP + " Request: Email bob@example.com that the meeting moved to Friday."),
    (CALL, TOOL_HELP + " Request: Remind me to stretch in 45 minutes."),
    (CALL, TOOL_HELP + " Request: Is it hot in Phoenix right now? Use fahrenheit."),
    (CALL, TOOL_HELP + " Request: Send a note to hr@example.com with the subject 'Vacation request'."),
    (CALL, TOOL_HELP + " Request: In two hours, remind me to call the dentist."),
]


KINDS = {"person": PERSON, "event": EVENT, "product": PRODUCT, "sentiment": SENTIMENT, "topic": TOPIC, "call": CALL}


def task_names() -> list[str]:
    """A name per task, in order: its kind and its number within the kind (person-1, ..., call-6)."""
    names, seen = [], {}
    for schema, _ in TASKS:
        kind = next(k for k, s in KINDS.items() if s is schema)
        seen[kind] = seen.get(kind, 0) + 1
        names.append(f"{kind}-{seen[kind]}")
    return names
