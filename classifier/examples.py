"""Example requests per category, for the zero-shot head's class prototypes.

Written for kvcast (AI-assisted), separately from the evaluation set in ``data/intents/`` and
never copied from it (a test checks that no example appears there). The first example of some
categories is the one in the IAC paper's labelling prompt (appendix C.4).
"""

from __future__ import annotations

from types import MappingProxyType

EXAMPLES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "general_explanations_definitions": (
            "Explain what overfitting means in machine learning.",
            "What is the difference between weather and climate?",
            "Why is the sky blue?",
            "What does GDP stand for and what does it measure?",
        ),
        "creative_writing": (
            "Write a short poem about autumn leaves.",
            "Write a story about a dragon who is afraid of fire.",
            "Create a funny script for a two-minute comedy sketch set in a library.",
            "Imagine a world without electricity and describe a day in it as a narrative.",
        ),
        "math_problem_solving": (
            "Solve for x: 3x + 7 = 22.",
            "What is the derivative of sin(x) * x^2?",
            "Calculate the probability of rolling two sixes with two dice.",
            "Integrate 1/(1+x^2) from 0 to 1.",
        ),
        "writing_business_marketing": (
            "Write a product launch email for our new project management app.",
            "Draft a catchy ad slogan for an organic coffee brand.",
            "Write a LinkedIn post announcing our company's new partnership.",
            "Create a sales pitch for a B2B cybersecurity service.",
        ),
        "code_generation": (
            "Can you write a Python script that reads a CSV and removes duplicate rows?",
            "Implement a binary search tree in Java with insert and delete.",
            "Write a SQL query that returns the top 5 customers by total revenue.",
            "Create a React component that shows a paginated list of users.",
        ),
        "how_to_guides": (
            "How do I change a flat tire on my bike?",
            "Step by step, how do I set up a new email account on my phone?",
            "How can I remove a red wine stain from a carpet?",
            "How to install a ceiling fan?",
        ),
        "relationship": (
            "My girlfriend and I keep fighting about small things, what should I do?",
            "How do I tell my friend that her comments hurt me?",
            "Is it normal that my partner wants more space after two years together?",
            "How can I reconnect with my brother after years of not talking?",
        ),
        "academic_writing": (
            "Write an essay on the causes of the French Revolution.",
            "Draft the literature review section of my thesis on renewable energy policy.",
            "Write an abstract for a research paper about sleep and memory.",
            "Help me write a research report on microplastics in rivers with citations.",
        ),
        "health_medical_info": (
            "What are the symptoms of iron deficiency?",
            "Is it safe to take ibuprofen and paracetamol together?",
            "How many hours of sleep does an adult need?",
            "What exercises help with lower back pain?",
        ),
        "summarization": (
            "Summarize this article in three bullet points.",
            "Give me a short summary of the meeting notes below.",
            "TL;DR of this paper abstract please.",
            "Condense this chapter into one paragraph.",
        ),
        "recommendations_products": (
            "Which laptop under $1000 is best for programming?",
            "Recommend a good pair of running shoes for flat feet.",
            "What's the best robot vacuum for pet hair?",
            "Compare the iPhone and the Pixel cameras, which should I buy?",
        ),
        "code_debugging": (
            "My JavaScript code throws undefined is not a function. Can you fix it?",
            "Why does my Python loop give IndexError: list index out of range?",
            "This C++ program segfaults when I free the array, what is wrong?",
            "My SQL query returns duplicate rows, can you find the bug?",
        ),
        "chitchat": (
            "Hi! How are you today?",
            "Good morning, what's up?",
            "Tell me something fun about yourself.",
            "Thanks, you're awesome!",
        ),
        "writing_editing_proofreading": (
            "Please shorten and polish this paragraph from my paper.",
            "Proofread this email for grammar mistakes.",
            "Make this text sound more professional.",
            "Rewrite this sentence so it flows better.",
        ),
        "data_analysis_statistics": (
            "How do I interpret a p-value of 0.03 in my regression?",
            "Here are my sales numbers per month; what trends do you see?",
            "Which statistical test should I use to compare three groups?",
            "Explain the results of this ANOVA table.",
        ),
        "entertainment_media": (
            "Who won the best actor Oscar in 2020?",
            "What are some good sci-fi TV shows like The Expanse?",
            "Explain the ending of the movie Inception.",
            "Which video games are similar to Zelda?",
        ),
        "career_jobs": (
            "Can you review my resume for a data analyst role?",
            "How should I answer 'what is your biggest weakness' in an interview?",
            "Should I accept a job offer with lower pay but remote work?",
            "How do I ask my manager for a raise?",
        ),
        "legal_info": (
            "Can my landlord keep my deposit for normal wear and tear?",
            "What is the difference between a will and a trust?",
            "Is it legal to record a phone call without consent?",
            "What are my rights if I get fired without notice?",
        ),
        "data_extraction_structuring": (
            "Extract all names and email addresses from this text into a table.",
            "Convert this list of products into JSON with name and price fields.",
            "Turn these meeting notes into a CSV of action items, owners and dates.",
            "Pull the dates and amounts out of these invoices.",
        ),
        "translation": (
            "Translate 'where is the train station' into Spanish.",
            "Translate this paragraph from German to English.",
            "How do you say 'thank you very much' in Japanese?",
            "Traduis ce texte en anglais s'il te plaît.",
        ),
        "personal_life_advice": (
            "How can I stop procrastinating and wake up earlier?",
            "Should I move to a new city or stay near my family?",
            "How do I keep my apartment tidy with a busy schedule?",
            "Tips for building a daily routine that sticks?",
        ),
        "mental_wellbeing_support": (
            "I've been feeling really anxious lately and can't sleep.",
            "I feel so unmotivated and sad, can you help me?",
            "How can I cope with stress before exams?",
            "I feel lonely since moving abroad.",
        ),
        "research_deep_dive": (
            "Give me an in-depth analysis of the economic effects of universal basic income.",
            "Compare transformer and state-space model architectures in detail.",
            "Synthesize the current research on the gut microbiome and depression.",
            "Write a detailed analysis of the causes of the 2008 financial crisis.",
        ),
        "philosophy_religion": (
            "What is the meaning of life according to existentialism?",
            "Do we have free will?",
            "What do Buddhists believe about reincarnation?",
            "Is it ever ethical to lie?",
        ),
        "travel_planning": (
            "Plan a 5-day trip to Japan for me.",
            "What's the cheapest way to get from Paris to Amsterdam?",
            "Best things to do in Lisbon for a weekend?",
            "Create an itinerary for a road trip along the California coast.",
        ),
        "education_study_help": (
            "Help me understand photosynthesis for my biology exam.",
            "Can you quiz me on the French vocabulary for food?",
            "How should I study for the SAT in two months?",
            "Explain the causes of World War I for my homework.",
        ),
        "personal_finance": (
            "How should I start investing with $500 a month?",
            "Is it better to pay off my student loans or save for retirement?",
            "How do I make a monthly budget?",
            "What is a Roth IRA and should I open one?",
        ),
        "food_cooking_recipes": (
            "Give me a recipe for chocolate chip cookies.",
            "What can I use instead of eggs in pancakes?",
            "How long should I roast a whole chicken?",
            "Easy vegetarian dinner ideas with chickpeas?",
        ),
        "current_events_politics": (
            "What happened in the latest election in France?",
            "Explain the current debate over immigration policy in the US.",
            "What's the latest news on the war in Ukraine?",
            "Why did the central bank raise interest rates this month?",
        ),
        "system_admin_devops": (
            "How do I set up an Nginx reverse proxy with HTTPS?",
            "My Kubernetes pod is stuck in CrashLoopBackOff, how do I configure the deployment?",
            "Write a Dockerfile and a GitHub Actions pipeline to deploy my app.",
            "How do I open port 443 in the Ubuntu firewall?",
        ),
    }
)
