"""Locust load test against the ray_geolb region endpoints (``/<region>/v1/chat/completions``).

Users are region-tagged (weights skew load toward us, like SkyLB's "US working hours") and hold
multi-turn conversations: every turn re-sends the whole history, so turn k+1's prompt extends turn
k's -- what prefix-aware routing exploits. Responses are streamed; the time to the first SSE chunk is
reported as a separate "TTFT" request type, and where the request was served as "served:<region>".

    locust -f examples/locustfile.py --host http://127.0.0.1:8000 --headless -u 30 -r 10 -t 60s

Environment: ``GEOLB_MODEL`` (default ``geolb-emulated``), ``GEOLB_MAX_TOKENS`` (default 32),
``GEOLB_TURNS`` (turns per conversation, default 4), ``GEOLB_EVENTS`` (a file: one JSON line per request
-- wall time, origin, TTFT, status, error type, serving region -- for ``benchmarks/soak.py``).
"""

import json
import os
import random
import time
import uuid

from locust import HttpUser, between, events, task

MODEL = os.environ.get("GEOLB_MODEL", "geolb-emulated")
MAX_TOKENS = int(os.environ.get("GEOLB_MAX_TOKENS", "32"))
TURNS = int(os.environ.get("GEOLB_TURNS", "4"))
SYSTEM = "You are a helpful assistant for a travel company. Answer briefly and precisely. " * 8
EVENTS = os.environ.get("GEOLB_EVENTS")
TOPICS = ["visa rules", "train passes", "museum tickets", "airport transfers", "travel insurance",
          "local food", "hiking routes", "currency exchange"]


class _Conversation(HttpUser):
    abstract = True
    region = "us"
    wait_time = between(0.2, 1.0)

    def on_start(self):
        self._new_conversation()

    def _new_conversation(self):
        self.session = uuid.uuid4().hex
        self.messages = [{"role": "system", "content": SYSTEM}]
        self.turn = 0

    def _log(self, start, ttft_s, status, error=None, served=None):
        if EVENTS:
            row = {"t": time.time(), "origin": self.region, "ttft_ms": None if ttft_s is None else ttft_s * 1000,
                   "latency_ms": (time.perf_counter() - start) * 1000, "status": status, "error": error,
                   "served": served}
            with open(EVENTS, "a") as f:
                f.write(json.dumps(row) + "\n")

    def _fire(self, name, start, length=0, exc=None):
        events.request.fire(request_type="TTFT" if name.startswith("ttft") else "SERVED", name=name,
                            response_time=(time.perf_counter() - start) * 1000, response_length=length,
                            exception=exc, context={})

    @task
    def chat_turn(self):
        topic = random.choice(TOPICS)
        self.messages.append({"role": "user", "content": f"Turn {self.turn}: tell me about {topic} in {self.region}."})
        body = {"model": MODEL, "messages": self.messages, "max_tokens": MAX_TOKENS, "stream": True}
        t0 = time.perf_counter()
        reply = []
        with self.client.post(f"/{self.region}/v1/chat/completions", json=body, stream=True, catch_response=True,
                              headers={"x-session-id": self.session}, name=f"/{self.region}/chat") as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code}: {r.text[:200]}")
                try:
                    kind = r.json()["error"]["type"]
                except (ValueError, KeyError, TypeError):
                    kind = "untyped"
                self._log(t0, None, r.status_code, kind)
                self._new_conversation()
                return
            first = True
            ttft = None
            for line in r.iter_lines():
                if not line or not line.startswith(b"data: {"):
                    continue
                if first:
                    ttft = time.perf_counter() - t0
                    self._fire(f"ttft /{self.region}", t0)
                    first = False
                chunk = json.loads(line[len(b"data: "):])
                if "error" in chunk:
                    r.failure(chunk["error"].get("message", "stream error"))
                    self._log(t0, ttft, 200, chunk["error"].get("type") or "stream_error")
                    return
                delta = chunk["choices"][0].get("delta", {})
                reply.append(delta.get("content") or "")
            served = r.headers.get("x-geolb-region", "?")
            route = r.headers.get("x-geolb-route", "?")
            self._fire(f"served:{served} from {self.region} ({route})", t0)
            self._log(t0, ttft, 200, None, served)
            r.success()
        self.messages.append({"role": "assistant", "content": "".join(reply)})
        self.turn += 1
        if self.turn >= TURNS:
            self._new_conversation()


class USUser(_Conversation):
    region = "us"
    weight = 6


class EUUser(_Conversation):
    region = "eu"
    weight = 2


class AsiaUser(_Conversation):
    region = "asia"
    weight = 2
