"""The project's prompt generator: varied tasks from templates x topics, each with its category (explanation,
lists, code, writing, chat, math). It writes the demo prompt set the demo recipe trains on
(build_configs/prompts/demo_prompts.jsonl, by scripts/make_demo_prompts.py) and gives the builtin evaluation suite
its prompts (trtspec.suites.builtin_rows); with its passage instructions it also writes prompts over a user's own
documents (passage_prompts, by scripts/make_passage_prompts.py) and, with its follow-ups, second turns over answered
conversations (follow_up_prompts, by scripts/make_follow_up_prompts.py). Deterministic: the same seed gives the same
prompts.
"""

from __future__ import annotations

import random
import re
from functools import cache
from itertools import cycle, product

SUBJECTS = """photosynthesis, gravity, electricity, magnetism, volcanoes, earthquakes, plate tectonics, the water cycle,
rainbows, tides, the seasons, black holes, the solar system, the moon, stars, comets, the immune system, vaccines,
the heart, the brain, sleep, digestion, DNA, evolution, climate change, the greenhouse effect, recycling, inflation,
interest rates, the stock market, supply and demand, taxes, democracy, the Roman Empire, ancient Egypt, the printing
press, the industrial revolution, the internet, email, Wi-Fi, GPS, a compiler, an operating system, a database,
machine learning, neural networks, encryption, passwords, cloud computing, blockchain, batteries, solar panels,
wind turbines, nuclear power, airplanes, rockets, bridges, electric cars, refrigerators, microwaves, music theory,
jazz, the Olympic Games, chess, soccer, coffee, bread baking, fermentation, bees, ants, dolphins, wolves, coral reefs,
rainforests, deserts, glaciers, hurricanes, lightning, clouds, ocean currents, the human eye, muscles, bones,
antibiotics, nutrition, meditation, memory, habits, time zones, calendars, maps, languages, writing systems,
money, banks, credit cards, insurance, elections, the United Nations, libraries, museums, photography, painting,
poetry, theater, film making, video games, robots, 3D printing, satellites, telescopes, microscopes""".split(",")

ACTIVITIES = """getting better sleep, learning a new language, saving money, starting to run, cooking rice, writing a
resume, preparing for a job interview, keeping houseplants alive, staying focused while studying, making friends in a
new city, public speaking, time management, drinking more water, reading more books, learning to draw, planning a road
trip, packing for a weekend trip, organizing a small kitchen, cleaning a laptop keyboard, learning to swim, baking
bread, growing tomatoes, training a puppy, writing a blog, learning guitar, meal planning, reducing screen time,
moving to a new apartment, hosting a dinner party, studying for an exam, starting a small business, taking better
photos, learning to code, keeping a journal, camping for the first time, running a meeting, budgeting for a trip,
staying healthy at a desk job, learning to meditate, decluttering a closet""".split(",")

PAIRS = """tea and coffee; books and movies; trains and planes; cats and dogs; summer and winter; RAM and storage;
a laptop and a desktop; Python and JavaScript; a virus and a bacterium; speed and velocity; renting and buying a home;
city life and country life; email and chat; paper books and e-books; running and swimming; solar and wind power;
weather and climate; a lake and a sea; a planet and a star; frogs and toads; butter and margarine; SQL and NoSQL
databases; public and private schools; working from home and working in an office; bikes and scooters; a loan and a
lease; a crocodile and an alligator; hardware and software; a democracy and a monarchy; cash and credit cards""".split(";")

THINGS = """vegetables that grow fast, things to pack for camping, animals that live in the ocean, planets in the
solar system, healthy snacks, board games, breakfast ideas, musical instruments, programming languages, renewable
energy sources, sports played with a ball, countries in Europe, countries in Asia, types of clouds, birds, fruits,
famous scientists, famous painters, rivers in Africa, kitchen tools, hobbies you can do at home, things to do on a
rainy day, ways to reduce waste, indoor plants, dog breeds, cat breeds, parts of a computer, parts of a flower,
winter sports, desserts, spices, jobs in a hospital, tools for woodworking, things to see in Paris, free time
activities for kids, ways to be kind, ideas for a birthday party, things that use electricity, noisy animals,
shapes, units of measurement, famous inventions, common English idioms, types of bread, root vegetables, herbs for
cooking, reptiles, insects, mammals that live in cold places, national parks, space missions, Greek gods, ancient
wonders of the world, card games, outdoor games for children, classic novels, types of pasta, cheeses, flowers that
bloom in spring, trees that lose their leaves, gemstones, metals, musical genres, dance styles""".split(",")

LANGS = ["Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "TypeScript", "Ruby", "Bash", "SQL"]
CODE_TASKS = """reverses a string, checks if a number is prime, computes the nth Fibonacci number, counts words in a
sentence, checks if a year is a leap year, finds the largest number in a list, removes duplicates from a list,
checks if a string is a palindrome, sorts a list of numbers, computes the factorial of a number, converts Celsius to
Fahrenheit, merges two sorted lists, counts the vowels in a string, computes the average of a list, finds the second
largest number in a list, checks if two strings are anagrams, flattens a nested list, computes the greatest common
divisor of two numbers, capitalizes every word in a sentence, sums the digits of a number, counts how often each word
appears in a text, converts a binary string to a number, finds the smallest number in a list, reverses the words in a
sentence, checks if a list is sorted, computes the power of a number, returns the even numbers of a list, counts the
lines in a file, checks if a number is a perfect square, joins a list of strings with commas, removes spaces from a
string, computes the length of a list without a built-in function""".split(",")
# code tasks only the builtin evaluation suite asks (trtspec.suites.builtin_rows): the shipped sets draw most of the
# code prompts the lists above make, so without these the suite would hold a handful of code prompts
EVAL_CODE_TASKS = """finds the longest word in a sentence, checks if a string has balanced parentheses, converts a number to
Roman numerals, counts the characters that appear only once in a string, rotates a list by k places, checks if a number
is even without the modulo operator, returns the first n square numbers, finds the index of an item in a sorted list
with binary search, converts hours and minutes to seconds, checks if a string contains only digits, finds the common
items of two lists, computes the median of a list, splits a list into chunks of size n, converts a string to title
case, counts the uppercase letters in a string, finds the missing number in a list from 1 to n, checks if all items
of a list are equal, reverses a number's digits, returns the last n items of a list, pads a string to a given length,
computes the sum of a list of lists, checks if a word starts with a vowel, swaps the keys and values of a dictionary,
returns the longest common prefix of two strings, computes a running total of a list""".split(",")
CODE_QUESTIONS = """What is a variable in programming?; What is recursion?; What does a for loop do?; What is an API?;
What is the difference between a list and a tuple in Python?; What is a class in object-oriented programming?;
Explain what Git is used for.; What is a hash table?; What does Big O notation mean?; What is a unit test?;
Explain the difference between a compiler and an interpreter.; What is a race condition?; What does JSON look like?;
What is a pointer in C?; What is the difference between == and === in JavaScript?; What is a function?;
What is a loop?; What is an array?; What is a string in programming?; What does an if statement do?; What is a
bug?; What is open source software?; What is a library in programming?; What is the difference between a bit and a
byte?; What is version control?""".split(";")

WRITING_FORMS = ["Write a short poem about {}.", "Write a haiku about {}.", "Write a limerick about {}.",
                 "Write a two-sentence story about {}.", "Write a short diary entry about {}.",
                 "Write a paragraph describing {}.", "Describe {} using vivid language.",
                 "Write a short story about {}.", "Write a tweet about {}."]
WRITING_SUBJECTS = """dogs, snow, the stars, a train journey, a rainy morning, coffee, friendship, the ocean, a garden,
autumn, a lighthouse, mountains, cats, an old library, a busy market, a quiet forest, a city at night, the first day
of school, a lost key, a robot learning to paint, a summer festival, a thunderstorm, a small bakery, an empty beach,
a bicycle ride, a grandmother's kitchen, a broken clock, the last day of winter, a paper boat, a street musician,
a snowy village, a sleepy cat, the smell of rain, a hot air balloon, a forgotten umbrella, the first snow, a
spring morning, a crowded train station, a sunflower field, an old bookshop, a night sky full of stars, a birthday
cake, a walk in the park, a campfire, a rainy Sunday afternoon""".split(",")
WRITING_TASKS = """Write an email asking a colleague for a meeting tomorrow.; Write a polite message declining an
invitation.; Write a short thank-you note to a teacher.; Write an apology message for missing a meeting.; Write a
birthday message for a friend.; Write a short speech welcoming new students.; Write a short bio for a software
engineer.; Write a product description for a reusable water bottle.; Write a short advertisement for a bakery.;
Write a motivational quote about hard work.; Give a title for a blog post about healthy breakfasts.; Write a short
review of a coffee shop.; Summarize the plot of Cinderella in three sentences.; Write a cover letter opening for a
nurse.; Write a toast for a wedding.; Write a short note to a neighbor about a noisy party.; Write a welcome message
for a new team member.; Write a short complaint about a late delivery.; Write an out-of-office reply.; Write a
short product review of headphones.""".split(";")

CHAT = """Hi! How are you today?; What can you help me with?; Tell me a fun fact.; Tell me a joke.; Can you give me
a riddle?; What should I cook for dinner tonight?; Suggest a fun weekend activity.; I'm bored. What should I do?;
What's a good name for a cat?; I feel tired today. Any tips?; Can you help me plan my day?; Recommend a movie for a
family night.; Can you recommend a good book?; What is a good hobby for relaxing?; Good morning!; Hello, who are you?;
What is the capital of France?; What is the tallest mountain in the world?; Why is the sky blue?; Which is heavier, a
kilogram of feathers or a kilogram of steel?; How many continents are there?; What is the largest ocean?; Who wrote
Romeo and Juliet?; How do I say thank you in Spanish?; What rhymes with cat?; What is the opposite of happy?; What
should I name my new plant?; What is a good gift for a friend who likes music?; How far is the moon from Earth?;
What language is spoken in Brazil?""".split(";")
CHAT_FORMS = ["I need help with {}. Where do I start?", "Any advice on {}?", "Can you talk me through {}?",
              "Do you have any tips for {}?", "I want to get better at {}. What should I do first?",
              "I'm a beginner at {}. Any advice?", "How do I get started with {}?", "What helps most with {}?"]

EXPLAIN_FORMS = ["Explain {} in simple terms.", "How does {} work?", "What is {}? Give a short explanation.",
                 "Explain {} to a ten-year-old.", "Can you describe {} in a few sentences?", "Why is {} important?",
                 "Tell me three facts about {}."]
LIST_FORMS = ["List some {}.", "Give me a list of {}.", "What are some {}?", "Name five {}.", "Name three {}.",
              "Can you list a few {}?", "Which {} are the most popular?"]
ACTIVITY_LIST_FORMS = ["Give me five tips for {}.", "Make a short checklist for {}.", "List some simple steps for {}.",
                       "What are three common mistakes with {}?"]


def clean(items: list[str]) -> list[str]:
    return [" ".join(x.split()) for x in items if x.strip()]


def math_prompts(rng: random.Random, n: int) -> list[str]:
    """Arithmetic and word problems with random numbers (the target's answers vary with the numbers)."""
    forms = [
        lambda: f"What is {rng.randint(11, 99)} times {rng.randint(11, 99)}?",
        lambda: f"What is {rng.randint(5, 60)}% of {rng.randint(2, 99) * 10}?",
        lambda: f"What is {rng.randint(100, 999)} plus {rng.randint(100, 999)}?",
        lambda: f"What is {rng.randint(500, 999)} minus {rng.randint(100, 499)}?",
        lambda: f"Divide {rng.randint(2, 30) * 12} by 12.",
        lambda: f"Solve for x: {rng.randint(2, 9)}x + {rng.randint(1, 20)} = {rng.randint(21, 99)}.",
        lambda: f"A shirt costs ${rng.randint(10, 80)} and is on sale for {rng.choice([10, 20, 25, 30, 50])}% off. What is the sale price?",
        lambda: f"If a car travels at {rng.randint(30, 120)} km per hour, how far does it go in {rng.randint(2, 6)} hours?",
        lambda: f"What is the area of a rectangle {rng.randint(2, 30)} meters long and {rng.randint(2, 30)} meters wide?",
        lambda: f"What is the perimeter of a square with sides of {rng.randint(2, 50)} cm?",
        lambda: f"I have {rng.randint(10, 99)} apples and give away {rng.randint(1, 9)}. How many are left?",
        lambda: f"Convert {rng.randint(1, 50)} kilometers to meters.",
        lambda: f"Is {rng.randint(20, 300)} a prime number?",
        lambda: f"What is the square root of {rng.randint(2, 30) ** 2}?",
        lambda: f"How many minutes are in {rng.randint(2, 12)} hours?",
        lambda: f"Round {rng.randint(100, 9999) / 100} to the nearest whole number.",
    ]
    fixed = ["How do you find the area of a circle?", "What is a prime number?", "Explain what a fraction is.",
             "What is the Pythagorean theorem?", "How do you calculate an average?", "What is a percentage?",
             "Explain long division step by step.", "What is the difference between mean and median?",
             "What is an equation?", "How do you add fractions with different denominators?"]
    out = list(fixed)
    while len(out) < n:
        out.append(rng.choice(forms)())
    return out


DEMO_N, DEMO_SEED = 2400, 0  # build_configs/prompts/demo_prompts.jsonl: build(DEMO_N, DEMO_SEED)
# each kind of task and its share of the demo set
SHARE = {"explanation": 0.25, "lists": 0.2, "code": 0.15, "writing": 0.15, "chat": 0.1, "math": 0.15}
CATEGORIES = tuple(SHARE)


def code_prompts(tasks: list[str]) -> list[str]:
    """A function to write in each of LANGS for each of `tasks`."""
    return [f"Write a {lang} function that {task}." for lang, task in product(LANGS, clean(tasks))]


def pools(rng: random.Random, n_math: int) -> dict[str, list[str]]:
    """Every prompt the templates make, by category (math: `n_math` drawn with `rng`, the numbers random)."""
    subjects, acts, things = clean(SUBJECTS), clean(ACTIVITIES), clean(THINGS)
    return {
        "explanation": [f.format(s) for f, s in product(EXPLAIN_FORMS, subjects)]
        + [f"What is the difference between {p}?" for p in clean(PAIRS)],
        "lists": [f.format(t) for f, t in product(LIST_FORMS, things)]
        + [f.format(a) for f, a in product(ACTIVITY_LIST_FORMS, acts)]
        + [f"Compare {p} in a short list of pros and cons." for p in clean(PAIRS)],
        "code": code_prompts(CODE_TASKS) + clean(CODE_QUESTIONS),
        "writing": [f.format(s) for f, s in product(WRITING_FORMS, clean(WRITING_SUBJECTS))] + clean(WRITING_TASKS),
        "chat": clean(CHAT) + [f.format(a) for f, a in product(CHAT_FORMS, acts)],
        "math": math_prompts(rng, n_math),
    }


def build(n: int, seed: int) -> list[dict]:
    """The demo set: n prompts, each category its SHARE of them, shuffled ({"prompt", "category"} rows)."""
    rng = random.Random(seed)
    return draw(pools(rng, 10 * n), SHARE, n, rng)


def draw(by_category: dict[str, list[str]], share: dict[str, float], n: int, rng: random.Random) -> list[dict]:
    """n prompts, each category its share of them (no prompt twice), shuffled ({"prompt", "category"} rows)."""
    rows, seen = [], set()
    for cat, frac in share.items():
        pool = list(dict.fromkeys(by_category[cat]))
        rng.shuffle(pool)
        picked = [p for p in pool if p not in seen][: round(frac * n)]
        seen.update(picked)
        rows += [{"prompt": p, "category": cat} for p in picked]
    rng.shuffle(rows)
    return rows


# --- kinds beyond the six: a passage handed over (extract, summarise, rewrite), a role to play, step-by-step
# reasoning, history and ideas. Passages are made from random names, places, numbers and times, so the answers
# copy from the prompt as they do on real traffic (the draft learns to look back at the context).
NAMES = """Alice, Ben, Chen, Dana, Eli, Fatima, Gus, Hana, Ivan, Jade, Kofi, Lena, Marco, Nadia, Omar, Pia, Quinn, Rosa,
Sami, Tara, Uma, Victor, Wen, Yara, Zoe, Hugo, Ines, Jonas, Kira, Luis, Mei, Nils, Olga, Pavel, Rita, Sven""".split(",")
PLACES = """Lisbon, Oslo, Nairobi, Lima, Hanoi, Dublin, Krakow, Osaka, Quebec, Perth, Bogota, Tunis, Riga, Seville,
Adelaide, Porto, Vienna, Accra, Bergen, Cusco, Leeds, Malmo, Tartu, Split, Ghent, Turin, Busan, Cork""".split(",")
JOBS = """baker, pilot, nurse, plumber, librarian, chemist, carpenter, florist, teacher, dentist, journalist, farmer,
electrician, architect, accountant, translator, mechanic, gardener, pharmacist, photographer""".split(",")
ITEMS = """desk lamp, rain jacket, water filter, camping stove, coffee grinder, phone charger, travel pillow, yoga mat,
bike lock, kettle, backpack, blender, bookshelf, thermos, wireless mouse, sleeping bag, umbrella, tent""".split(",")
EVENTS = """book fair, bake sale, charity run, chess tournament, film night, science fair, farmers market, concert,
swimming gala, art show, quiz night, plant swap, coding workshop, dance class, open day""".split(",")
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def passage(rng: random.Random) -> str:
    """A short made-up text full of facts: a notice, people, a product, an email, a schedule or a report."""
    n = lambda a, b: rng.randint(a, b)  # noqa: E731
    name, place, job, item, event = (rng.choice(clean(x)) for x in (NAMES, PLACES, JOBS, ITEMS, EVENTS))
    other, day, month = rng.choice(clean(NAMES)), rng.choice(DAYS), rng.choice(MONTHS)
    kinds = [
        lambda: (f"The {place} {event} takes place on {day}, {month} {n(1, 28)}, from {n(8, 11)} a.m. to {n(1, 6)} p.m. "
                 f"Tickets cost ${n(3, 25)} for adults and ${n(1, 9)} for children. About {n(2, 40) * 50} visitors are "
                 f"expected. {name}, who organizes it, asks volunteers to arrive by {n(6, 8)}:{rng.choice(['00', '30'])} a.m."),
        lambda: (f"{name} is {n(22, 70)} and works as a {job} in {place}. {other}, {n(18, 70)}, moved there from "
                 f"{rng.choice(clean(PLACES))} {n(2, 15)} years ago and is now a {rng.choice(clean(JOBS))}. They met at a "
                 f"{event} in {month} and have run a small {rng.choice(['shop', 'club', 'podcast', 'garden'])} together "
                 f"since {n(1995, 2024)}."),
        lambda: (f"The {item} weighs {n(1, 30) * 50} grams and costs ${n(9, 199)}.{n(0, 99):02d}. It comes in "
                 f"{rng.choice(['black', 'green', 'grey', 'blue', 'red'])} and {rng.choice(['white', 'orange', 'silver'])}, "
                 f"has a {n(1, 5)}-year warranty and ships within {n(1, 10)} days. Customers rate it {n(30, 50) / 10} out "
                 f"of 5 after {n(20, 3000)} reviews."),
        lambda: (f"Hi {other}, can we move our call from {day} to {rng.choice(DAYS)} at {n(9, 17)}:00? I also need the "
                 f"{rng.choice(['budget', 'report', 'slides', 'contract', 'invoice'])} by {month} {n(1, 28)}, and "
                 f"{rng.choice(clean(NAMES))} is waiting for the list of {rng.choice(['suppliers', 'guests', 'speakers', 'rooms'])}. "
                 f"Thanks, {name}"),
        lambda: (f"Buses from {place} to {rng.choice(clean(PLACES))} leave at {n(5, 9)}:{n(10, 59)}, {n(10, 13)}:{n(10, 59)} "
                 f"and {n(15, 22)}:{n(10, 59)}. The trip takes {n(1, 5)} hours {n(5, 55)} minutes, and a ticket costs "
                 f"{n(8, 60)} euros, or {n(5, 40)} euros for students. The last bus on {day}s does not run."),
        lambda: (f"In {month}, the {place} library lent {n(1000, 9000)} books, {n(10, 90)} percent more than a year "
                 f"before. It added {n(100, 900)} new titles and {n(2, 12)} computers, and {n(20, 300)} children joined "
                 f"its reading club. {name}, the head librarian, said the new {rng.choice(['café', 'garden', 'study room'])} "
                 f"opens in {rng.choice(MONTHS)}."),
    ]
    return rng.choice(kinds)()


EXTRACT_FORMS = ["List every number in this text and say what it counts.\n\n{}", "Extract the names, places and dates "
                 "from the text below as a list.\n\n{}", "{}\n\nWhat are the key facts in this text? Answer as a list.",
                 "Read this and answer: who, what, when and how much?\n\n{}", "Pull out the times and prices from this "
                 "text.\n\n{}", "Turn the facts in this text into a short table.\n\n{}"]
SUMMARY_FORMS = ["Summarize this in one sentence.\n\n{}", "Give me the main point of this text.\n\n{}",
                 "{}\n\nSummarize the text above in two sentences.", "Write a short headline and a one-line summary for "
                 "this:\n\n{}", "Explain this text to a child in simple words.\n\n{}"]
REWRITE_FORMS = ["Rewrite this text to sound more formal.\n\n{}", "Rewrite this text in a friendly, casual tone.\n\n{}",
                 "Rewrite this as a short announcement.\n\n{}", "Make this text shorter without losing any facts.\n\n{}",
                 "Rewrite this text in the first person.\n\n{}"]
ROLES = """a ship's cook, a museum guard, a lighthouse keeper, a friendly dragon, a train conductor, a space station
commander, a fortune teller, a grumpy cat, a park ranger, a knight, a chef judging a cooking contest, a librarian from
the future, a tailor, a mountain guide, a circus ringmaster, a radio host, a school principal, a gardener, a weather
forecaster, a shopkeeper in a small village""".split(",")
ROLE_SCENES = ["A visitor asks what your day is like. Answer in character.", "Introduce yourself to a newcomer.",
               "Someone asks for your best advice. Reply in character.", "Describe the most surprising thing that happened "
               "to you this week, in character.", "Welcome a group of children and tell them the rules.",
               "A customer is unhappy. Calm them down, staying in character.", "Give a short speech to open the day."]
ROLE_TASKS = ["tell me about your work.", "explain what you are most proud of.", "describe your favorite place.",
              "give me a tip only you would know."]
REASONING_FORMS = [
    lambda r: (f"{r.choice(clean(NAMES))} has {r.randint(3, 40)} marbles and buys {r.randint(2, 9)} bags of "
               f"{r.randint(2, 12)}. Then they give away {r.randint(1, 20)}. How many are left? Think step by step."),
    lambda r: (f"A tank holds {r.randint(2, 20) * 50} liters and fills at {r.randint(5, 25)} liters a minute. How long until "
               f"it is full? Explain your steps."),
    lambda r: (f"A meeting starts at {r.randint(8, 16)}:{r.choice(['05', '20', '35', '50'])} and lasts "
               f"{r.randint(35, 170)} minutes. When does it end? Show your reasoning."),
    lambda r: (f"{', '.join(r.sample(clean(NAMES), 3))} ran a race. The first named was faster than the second, and the "
               f"third was slower than the second. Who won? Reason it out."),
    lambda r: (f"If {r.randint(2, 9)} workers build a wall in {r.randint(2, 12)} days, how long do "
               f"{r.randint(2, 9)} workers take at the same speed? Explain step by step."),
    lambda r: (f"A recipe for {r.randint(2, 6)} people needs {r.randint(100, 600)} grams of flour. How much for "
               f"{r.randint(3, 12)} people? Show the calculation."),
    lambda r: (f"Today is {r.choice(DAYS)}. What day is it in {r.randint(10, 400)} days? Explain how you worked it out."),
    lambda r: (f"Is it cheaper to buy {r.randint(2, 6)} items at ${r.randint(2, 9)} each, or a pack of "
               f"{r.randint(5, 12)} for ${r.randint(10, 40)}, if I need {r.randint(5, 12)}? Reason step by step."),
]
PEOPLE = """Aristotle, Cleopatra, Marie Curie, Leonardo da Vinci, Nelson Mandela, Simon Bolivar, Ada Lovelace, Genghis
Khan, Jane Austen, Socrates, Mahatma Gandhi, Queen Victoria, Ibn Battuta, Frida Kahlo, Isaac Newton, Harriet Tubman,
Immanuel Kant, Mansa Musa, William Shakespeare, Charles Darwin""".split(",")
HISTORY = """the fall of the Berlin Wall, the Black Death, the Meiji Restoration, the American Civil War, the Cold War,
the Age of Exploration, the Reformation, the Apollo moon landing, the invention of the steam engine, the Mongol Empire,
the abolition of slavery, the founding of the United Nations, the Inca Empire, the spread of the printing press, the
women's suffrage movement""".split(",")
IDEAS = """utilitarianism, stoicism, free will, existentialism, the scientific method, human rights, romanticism in
art, the golden rule, impressionism, minimalism, the tragedy of the commons, cultural relativism""".split(",")
PERSON_FORMS = ["Who was {}, and why are they remembered?", "What did {} contribute to the world?", "Tell me about "
                "the life of {}.", "What can we learn today from {}?", "What would {} think of the modern world?"]
HISTORY_FORMS = ["What were the main causes of {}?", "Why was {} important?", "What were the consequences of {}?",
                 "Describe daily life during {}.", "How did {} change ordinary people's lives?"]
IDEA_FORMS = ["Explain {} in a few sentences.", "What are the main arguments for and against {}?",
              "How does {} apply to everyday life?", "Who were the main thinkers behind {}?"]


def broad_pools(rng: random.Random, n: int) -> dict[str, list[str]]:
    """Prompts of the kinds beyond the six, by category (the passages and numbers drawn with `rng`)."""
    humanities = [f.format(x) for forms, xs in ((PERSON_FORMS, PEOPLE), (HISTORY_FORMS, HISTORY), (IDEA_FORMS, IDEAS))
                  for f, x in product(forms, clean(xs))]
    return {
        "extraction": [rng.choice(EXTRACT_FORMS).format(passage(rng)) for _ in range(n)],
        "summarization": [rng.choice(SUMMARY_FORMS).format(passage(rng)) for _ in range(n)],
        "rewriting": [rng.choice(REWRITE_FORMS).format(passage(rng)) for _ in range(n)],
        "roleplay": [f"You are {r}. {s}" for r, s in product(clean(ROLES), ROLE_SCENES)]
        + [f"Pretend to be {r} and {s}" for r, s in product(clean(ROLES), ROLE_TASKS)],
        "reasoning": [rng.choice(REASONING_FORMS)(rng) for _ in range(n)],
        "humanities": humanities,
    }


PASSAGE_FORMS = {"extraction": EXTRACT_FORMS, "summarization": SUMMARY_FORMS, "rewriting": REWRITE_FORMS}
# the spaces after a sentence's end (. ! or ?, a closing quote or bracket after it kept) before a capital or digit
SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]*[A-Z0-9])")


def document_windows(docs: list[str], rng: random.Random, words: tuple[int, int]) -> list[str]:
    """Passages cut from documents: runs of 2-4 whole sentences, each document read once from its start, kept where
    they hold words[0]..words[1] words; in document order."""
    out = []
    for doc in docs:
        sentences, i = SENTENCE_END.split(" ".join(doc.split())), 0
        while i < len(sentences):
            k = rng.randint(2, 4)
            window = " ".join(sentences[i : i + k])
            if words[0] <= len(window.split()) <= words[1]:
                out.append(window)
            i += k
    return out


def passage_prompts(docs: list[str], n: int, seed: int, words: tuple[int, int] = (25, 75)) -> list[dict]:
    """Up to n prompts of the passage kinds (extraction, summarization, rewriting in turn, each passage once) over
    documents of yours, with the generator's instructions: {"prompt", "category"} rows, shuffled. Deterministic."""
    rng = random.Random(seed)
    windows = list(dict.fromkeys(document_windows(docs, rng, words)))  # a document given twice: its passages once
    rng.shuffle(windows)
    rows = [{"prompt": rng.choice(PASSAGE_FORMS[kind]).format(w), "category": kind}
            for w, kind in zip(windows[:n], cycle(PASSAGE_FORMS))]
    rng.shuffle(rows)
    return rows


# a user's next turn after an answer, for any first question
FOLLOW_UPS = """Can you say more about that?; Can you give me an example?; Can you explain that more simply?; Why is
that?; Can you make that shorter?; Can you put that as a list?; What would you do first?; Is there anything I should
avoid?; How would I explain that to a child?; What is the most important part of that?; Can you go on?; What are the
downsides?; Can you give me another example?; How sure are you about that?; What should I read to learn more?; Could
you say that in one sentence?; What is a common mistake here?; Thanks! Can you add a tip or two?; How does that work in
practice?; Can you compare that with an alternative?; Why does that matter?; What happens next?; Can you write that more
formally?; Can you make it sound friendlier?; What would an expert add?; Is that always true?; Can you summarize what
you said?; What questions should I ask next?; Can you break that into steps?; How long would that take?""".split(";")


LIST_NUMBER = re.compile(r"(?:^|\n)[ \t]*\d+\.$")  # "2." opening a list item's line: no sentence ends there


def first_sentences(text: str, words: int) -> str:
    """The whole sentences at the start of `text` (its line breaks kept) that fit in `words` words, at least the first;
    "" when even the first sentence is more than twice that."""
    text = text.strip()
    ends = [m.start() for m in SENTENCE_END.finditer(text) if not LIST_NUMBER.search(text[: m.start()])] + [len(text)]
    fit = [e for e in ends if len(text[:e].split()) <= words]
    cut = fit[-1] if fit else ends[0]
    return text[:cut] if len(text[:cut].split()) <= 2 * words else ""


def follow_up_prompts(conversations: list[list[dict]], n: int, seed: int, words: int = 45) -> list[dict]:
    """Up to n second turns: a conversation's first user turn, its first answer cut to the whole sentences that fit in
    `words` words, and a follow-up of FOLLOW_UPS, as {"messages", "category": "multiturn"} rows for the target to
    answer (trtspec adapt --prompts, or data.sources kind regenerate). Deterministic."""
    rng = random.Random(seed)
    follow_ups = clean(FOLLOW_UPS)
    rows = []
    for msgs in conversations:
        user = next((i for i, m in enumerate(msgs) if m["role"] == "user"), None)
        if user is None or user + 1 >= len(msgs) or msgs[user + 1]["role"] != "assistant":
            continue
        answer = first_sentences(msgs[user + 1]["content"], words)
        if answer:
            rows.append({"messages": [*msgs[: user + 1], {"role": "assistant", "content": answer},
                                      {"role": "user", "content": rng.choice(follow_ups)}], "category": "multiturn"})
    rng.shuffle(rows)
    return rows[:n]


# the broad set: the six kinds and the six above, each its share
BROAD_SHARE = {"explanation": 0.12, "lists": 0.09, "code": 0.1, "writing": 0.09, "chat": 0.06, "math": 0.08,
               "extraction": 0.1, "summarization": 0.08, "rewriting": 0.06, "roleplay": 0.06, "reasoning": 0.08,
               "humanities": 0.08}


def build_broad(n: int, seed: int) -> list[dict]:
    """n prompts of twelve kinds, each category its BROAD_SHARE, shuffled ({"prompt", "category"} rows)."""
    rng = random.Random(seed)
    return draw({**pools(rng, 10 * n), **broad_pools(rng, 2 * n)}, BROAD_SHARE, n, rng)


@cache
def shipped_prompts() -> frozenset[str]:
    """Every prompt of the project's shipped training sets (build_configs/prompts/demo_prompts.jsonl and
    broad_prompts.jsonl: build and build_broad at their defaults); made once a process (build_broad takes ~0.3 s)."""
    return frozenset(r["prompt"] for r in build(DEMO_N, DEMO_SEED) + build_broad(DEMO_N, DEMO_SEED))
