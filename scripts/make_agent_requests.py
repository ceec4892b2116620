#!/usr/bin/env python
"""Write an agent's traffic: OpenAI chat requests that offer tools, as an agent framework sends them to a served
model. Each offers 2-4 functions of ten (weather, web search, stock prices, e-mail, calendar, currencies, arithmetic,
translation, restaurants, directions), the one the request needs among them; half are the agent's first step (the
user's request: the model calls a function or answers), half its next (the model's call and the function's output
after it: the model answers from that output). `trtspec adapt RUN --prompts FILE` reads them (format chat), the
target answering each with its tools rendered by its chat template (model.chat_template where its own shows none).

    python scripts/make_agent_requests.py --out agent.jsonl                 # 300 requests, category "agent"
    python scripts/make_agent_requests.py --n 64 --seed 2 --out held.jsonl

Deterministic: the same seed writes the same file; another seed draws other requests from the same pools.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from trtspec.errors import run_main


def function(name: str, description: str, **params: str) -> dict:
    """An OpenAI tool spec: a function of string parameters, each required."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
        "required": list(params)}}}


TOOLS = {
    "get_weather": function("get_weather", "Current weather and today's forecast for a city", city="the city's name"),
    "search_web": function("search_web", "Search the web and return the top results", query="what to search for"),
    "get_stock_price": function("get_stock_price", "The latest price of a stock", ticker="the stock's ticker symbol"),
    "send_email": function("send_email", "Send an e-mail", to="the recipient's address", subject="the subject line",
                           body="the message"),
    "create_event": function("create_event", "Add an event to the user's calendar", title="what the event is",
                             date="the day, YYYY-MM-DD", time="the start, HH:MM"),
    "convert_currency": function("convert_currency", "Convert an amount between currencies", amount="the amount",
                                 from_currency="ISO code of the currency held", to_currency="ISO code wanted"),
    "calculate": function("calculate", "Evaluate an arithmetic expression", expression="the expression, e.g. 3 * (4 + 5)"),
    "translate": function("translate", "Translate a text", text="the text", target_language="the language wanted"),
    "find_restaurants": function("find_restaurants", "Restaurants near a place", city="the city", cuisine="the kind of food"),
    "get_directions": function("get_directions", "Directions between two places", origin="where from",
                               destination="where to", mode="driving, walking, cycling or transit"),
}

CITIES = """Lisbon, Oslo, Nairobi, Lima, Hanoi, Dublin, Krakow, Osaka, Quebec, Perth, Bogota, Tunis, Riga, Seville, Porto,
Cairo, Denver, Austin, Madrid, Vienna, Prague, Zurich, Seoul, Taipei, Manila, Jakarta, Chennai, Dakar, Accra, Quito""".split(", ")
TOPICS = """electric bikes, the history of tea, solar panels for homes, learning to swim as an adult, the best time to
visit Japan, how vaccines are tested, composting at home, the rules of cricket, remote work tips, sourdough starters,
noise-cancelling headphones, the tallest buildings in Asia, how to fix a leaking tap, marathon training plans""".split(", ")
TICKERS = ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "GOOGL", "META", "IBM", "ORCL", "INTC", "AMD", "NFLX"]
NAMES = ["Alice", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Marco", "Nadia"]
EVENTS = ["dentist appointment", "team meeting", "yoga class", "dinner with Sam", "project review", "haircut", "flight to Rome"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "INR", "BRL"]
PHRASES = ["Where is the train station?", "Thank you for your help.", "How much does this cost?", "I would like a coffee.",
           "Can you recommend a good book?", "The meeting starts at nine."]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Japanese", "Portuguese"]
CUISINES = ["Italian", "Thai", "vegetarian", "seafood", "Mexican", "Indian", "Japanese"]
MODES = ["driving", "walking", "cycling", "transit"]
SYSTEMS = [None, "You are a helpful assistant. Use the tools when they help.",
           "You are an assistant with access to functions. Call one when the user's request needs it, then answer "
           "from its result.", "You are a concise personal assistant."]


def request(rng: random.Random) -> tuple[str, str, dict, dict]:
    """(tool, the user's words, the call's arguments, the function's output) of one request."""
    tool = rng.choice(list(TOOLS))
    city, other, name = rng.choice(CITIES), rng.choice(CITIES), rng.choice(NAMES)
    if tool == "get_weather":
        words = rng.choice(["What's the weather like in {c} today?", "Should I take an umbrella in {c}?",
                            "Is it warm enough for a walk in {c} this afternoon?", "Weather in {c}?"]).format(c=city)
        return tool, words, {"city": city}, {"city": city, "temperature_c": rng.randint(-5, 35), "condition":
                                             rng.choice(["sunny", "light rain", "cloudy", "snow", "windy"]),
                                             "chance_of_rain": f"{rng.randint(0, 100)}%"}
    if tool == "search_web":
        topic = rng.choice(TOPICS)
        words = rng.choice(["Search the web for {t}.", "Find me something about {t}.", "What does the web say about {t}?"]).format(t=topic)
        return tool, words, {"query": topic}, {"results": [{"title": f"A guide to {topic}", "url": f"https://example.org/{i}",
                                                           "snippet": f"Everything to know about {topic}, part {i}."} for i in (1, 2)]}
    if tool == "get_stock_price":
        t = rng.choice(TICKERS)
        words = rng.choice(["How is {t} trading right now?", "What's the price of {t}?", "Check the {t} stock price."]).format(t=t)
        return tool, words, {"ticker": t}, {"ticker": t, "price": round(rng.uniform(20, 900), 2),
                                            "change_percent": round(rng.uniform(-4, 4), 2)}
    if tool == "send_email":
        addr = f"{name.lower()}@example.com"
        subject = rng.choice(["Lunch on Friday", "The report", "Running late", "Thanks!"])
        words = f"E-mail {name} at {addr} with the subject '{subject}' and tell them I'll call tomorrow."
        return tool, words, {"to": addr, "subject": subject, "body": "I'll call you tomorrow."}, {"status": "sent", "id": f"msg-{rng.randint(1000, 9999)}"}
    if tool == "create_event":
        ev, day, hour = rng.choice(EVENTS), rng.randint(1, 28), rng.randint(8, 19)
        date, time = f"2027-0{rng.randint(1, 9)}-{day:02d}", f"{hour:02d}:{rng.choice(['00', '30'])}"
        words = f"Put a {ev} in my calendar on {date} at {time}."
        return tool, words, {"title": ev, "date": date, "time": time}, {"status": "created", "event_id": rng.randint(100, 999)}
    if tool == "convert_currency":
        a, b = rng.sample(CURRENCIES, 2)
        amount = rng.choice([20, 50, 100, 250, 1200])
        words = rng.choice(["How much is {n} {a} in {b}?", "Convert {n} {a} to {b}."]).format(n=amount, a=a, b=b)
        rate = round(rng.uniform(0.2, 3), 4)
        return tool, words, {"amount": str(amount), "from_currency": a, "to_currency": b}, {"amount": round(amount * rate, 2), "currency": b, "rate": rate}
    if tool == "calculate":
        x, y, z = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        expr = f"{x} * {y} + {z}"
        return tool, f"What is {x} times {y}, plus {z}?", {"expression": expr}, {"result": x * y + z}
    if tool == "translate":
        phrase, lang = rng.choice(PHRASES), rng.choice(LANGUAGES)
        return tool, f"How do I say '{phrase}' in {lang}?", {"text": phrase, "target_language": lang}, {"translation": f"[{lang}] {phrase}"}
    if tool == "find_restaurants":
        cuisine = rng.choice(CUISINES)
        words = rng.choice(["Find a {k} restaurant in {c}.", "Any good {k} places to eat in {c}?"]).format(k=cuisine, c=city)
        return tool, words, {"city": city, "cuisine": cuisine}, {"restaurants": [
            {"name": f"{rng.choice(NAMES)}'s {cuisine} Kitchen", "rating": round(rng.uniform(3.5, 5), 1)} for _ in range(2)]}
    mode = rng.choice(MODES)
    words = f"How do I get from {city} to {other} by {mode}?"
    return tool, words, {"origin": city, "destination": other, "mode": mode}, {
        "distance_km": rng.randint(5, 900), "duration": f"{rng.randint(1, 14)} h {rng.randint(0, 59)} min"}


def agent_request(rng: random.Random, i: int, category: str) -> dict:
    """One chat request: a system line (or none), the user's words, the tools offered; every other one the model's call and
    the function's output after them."""
    tool, words, args, output = request(rng)
    offered = [tool] + rng.sample([t for t in TOOLS if t != tool], rng.randint(1, 3))
    rng.shuffle(offered)
    system = rng.choice(SYSTEMS)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": words}]
    if rng.random() < 0.5:
        call_id = f"call_{i:05d}"
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                          {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]},
                     {"role": "tool", "tool_call_id": call_id, "content": json.dumps(output)}]
    return {"messages": messages, "tools": [TOOLS[t] for t in offered], "category": category}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="requests to write (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--category", default="agent", help="the requests' category (default agent)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rows = [agent_request(rng, i, a.category) for i in range(a.n)]
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    steps = sum(r["messages"][-1]["role"] == "tool" for r in rows)
    print(f"wrote {len(rows)} agent requests to {a.out}: {len(rows) - steps} first steps, {steps} after a call")


if __name__ == "__main__":
    run_main(main)
