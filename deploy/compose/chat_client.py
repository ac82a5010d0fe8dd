"""Chat traffic for the compose stack: multi-turn conversations against an OpenAI-compatible
server (``kvcast tap`` in front of the engine), as a chat front end sends them.

    python chat_client.py --base-url http://kvcast-tap:8001/v1 --parallel 4

Each conversation sends its whole history every turn (system prompt, then user and assistant
messages) and no session id: the tap recovers the conversation from the history. Odd turns
stream (``"stream": true``), even ones do not. Standard library only (it runs in the kvcast
image). With ``--conversations N`` it stops after N and prints one JSON line: the turns of
each conversation, in the order they finished.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request

TOPICS = [
    ("Fix the null check in this Python function", "You are a careful code reviewer."),
    ("Plan three days in Lisbon on a budget", "You are a travel assistant."),
    ("Summarize the attached quarterly report", "You summarize documents."),
    ("Translate this paragraph into German", "You are a translator."),
    ("What should I cook with leeks and potatoes", "You are a cooking assistant."),
]
MARKER = "zebracorn"  # in every user message: tests look for it where no user text may go


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://kvcast-tap:8001/v1")
    parser.add_argument("--model", default="m")
    parser.add_argument("--parallel", type=int, default=4, help="conversations at once")
    parser.add_argument("--conversations", type=int, default=0, help="0: run until stopped")
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--think-s", type=float, default=2.0, help="mean pause between turns")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--wait-s", type=float, default=120.0, help="for the server at start")
    return parser.parse_args()


def post(url: str, body: dict, timeout_s: float = 60.0) -> str:
    """The assistant's reply to one chat request (streamed or not)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if not body.get("stream"):
            return json.loads(response.read())["choices"][0]["message"]["content"]
        parts = []
        for line in response:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
        return "".join(parts)


def conversation(args: argparse.Namespace, rng: random.Random, run: int, number: int) -> int:
    """One conversation; returns its number of turns. ``run`` and ``number`` make its first
    message its own: two conversations with the same history and no identity are one
    conversation asked twice to kvcast (a retry), so two runs of this client must differ."""
    question, system = rng.choice(TOPICS)
    messages = [{"role": "system", "content": system}]
    turns = rng.randint(1, args.max_turns)
    url = args.base_url.rstrip("/") + "/chat/completions"
    for turn in range(1, turns + 1):
        text = f"{question} ({MARKER} {run}.{number})" if turn == 1 else f"And then? {MARKER}"
        messages.append({"role": "user", "content": text})
        body = {"model": args.model, "messages": messages, "stream": turn % 2 == 1}
        reply = post(url, body)
        messages.append({"role": "assistant", "content": reply})
        if turn < turns:
            time.sleep(rng.expovariate(1.0 / args.think_s) if args.think_s > 0 else 0.0)
    return turns


def wait_for_server(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.wait_s
    url = args.base_url.rstrip("/") + "/models"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def main() -> int:
    args = parse_args()
    wait_for_server(args)
    lock = threading.Lock()
    started = [0]
    finished: list[int] = []
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            with lock:
                if args.conversations and started[0] >= args.conversations:
                    return
                started[0] += 1
                number = started[0]
            try:
                turns = conversation(args, rng, base, number)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(1.0)
                continue
            with lock:
                finished.append(turns)

    base = args.seed if args.seed is not None else random.randrange(1 << 30)
    threads = [threading.Thread(target=worker, args=(base + k,)) for k in range(args.parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"turns": finished, "failures": failures}))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
