"""Workload data model (see the package docstring for the overview)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator


@dataclass
class Call:
    """One LLM request of a program.

    Exactly one of ``messages`` (OpenAI chat format: ``[{"role", "content"}]``) or ``prompt``
    (completion text) is set. ``session_key`` is the user/session/question id used as the
    consistent-hashing key. ``depends_on`` holds indexes of *earlier* calls of the same program
    that must finish before this call is sent.
    """

    output_tokens: int
    session_key: str
    messages: list[dict] | None = None
    prompt: str | None = None
    depends_on: tuple[int, ...] = ()
    tenant: str | None = None
    #: the client's ``max_tokens`` (None: not sent); ``output_tokens`` never exceeds it. A vLLM engine
    #: ignores it; an SGLang engine reserves KV for it when it admits the request.
    max_tokens: int | None = None
    #: the reply this call's output stands for when a later call replays it (a conversation's next turn):
    #: the engine caches the KV blocks of prompt + reply as vLLM caches full output blocks. None: unknown.
    reply: str | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("Call needs exactly one of messages or prompt")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.max_tokens is not None and self.max_tokens < self.output_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= output_tokens ({self.output_tokens})")

    @property
    def text(self) -> str:
        """The request's canonical text (``ray_geolb.policy.canonical_text``, the one function the
        router, simulator and ingress all use); a conversation turn's text is a prefix of the next
        turn's text."""
        from ray_geolb.policy.canonical import canonical_text

        if self.prompt is not None:
            return canonical_text(self.prompt)
        return canonical_text({"messages": self.messages})

    def reply_span(self, text: str | None = None) -> tuple[int, int] | None:
        """Where the last reply this chat carries back lies in :attr:`text` (``canonical.reply_span``; ``text``:
        :attr:`text` if the caller has it)."""
        if self.messages is None:
            return None
        from ray_geolb.policy.canonical import reply_span

        return reply_span({"messages": self.messages}, text)

    @property
    def text_with_reply(self) -> str | None:
        """The canonical text of prompt + reply (a prefix of the next turn's text), or None without a reply."""
        if self.reply is None:
            return None
        from ray_geolb.policy.canonical import text_with_reply

        return text_with_reply(self.prompt if self.prompt is not None else {"messages": self.messages}, self.reply)

    @property
    def input_tokens(self) -> int:
        """Estimated prompt tokens at ~4 characters per token (at least 1)."""
        return max(1, math.ceil(len(self.text) / 4))


@dataclass
class Program:
    """A client-side program: a DAG of calls (``Call.depends_on``) issued from ``region``."""

    program_id: str
    region: str
    calls: list[Call]

    def __post_init__(self) -> None:
        for i, c in enumerate(self.calls):
            for d in c.depends_on:
                if not (0 <= d < i):
                    raise ValueError(f"program {self.program_id}: call {i} depends on {d}, not an earlier call")


class ProgramStream:
    """A deterministic, lazily built, possibly infinite sequence of programs.

    ``stream[i]`` is always the same program (built by ``make(i)``), regardless of the order in
    which a simulator consumes programs. ``limit=None`` means unbounded (iteration never ends).
    """

    def __init__(self, make: Callable[[int], Program], limit: int | None = None):
        self._make = make
        self.limit = limit

    def __getitem__(self, i: int) -> Program:
        if i < 0 or (self.limit is not None and i >= self.limit):
            raise IndexError(i)
        return self._make(i)

    def __iter__(self) -> Iterator[Program]:
        i = 0
        while self.limit is None or i < self.limit:
            yield self._make(i)
            i += 1

    def __len__(self) -> int:
        if self.limit is None:
            raise TypeError("unbounded ProgramStream has no len(); use .limit or take(n)")
        return self.limit

    def take(self, n: int) -> list[Program]:
        n = n if self.limit is None else min(n, self.limit)
        return [self._make(i) for i in range(n)]

    @classmethod
    def from_list(cls, programs: list[Program]) -> "ProgramStream":
        progs = list(programs)
        return cls(progs.__getitem__, limit=len(progs))


@dataclass
class ClosedLoopSpec:
    """Closed loop (SkyLB §5.1): ``clients[region]`` clients, each running one program at a time.

    A client that finishes a program takes the next unused program from ``programs[region]``
    (a shared per-region ``ProgramStream``). A client stops when its region's stream is exhausted.
    ``think_time_s`` is the pause between a program's end and the client's next program.
    """

    clients: dict[str, int]
    programs: dict[str, ProgramStream]
    think_time_s: float = 0.0

    def __post_init__(self) -> None:
        for r in self.clients:
            if r not in self.programs:
                raise ValueError(f"ClosedLoopSpec: region {r!r} has clients but no program stream")
        for r, n in self.clients.items():
            if n < 0:
                raise ValueError(f"ClosedLoopSpec: negative client count for {r!r}")


@dataclass
class OpenLoopSpec:
    """Open loop: ``arrivals`` is a time-sorted list of ``(time_s, Program)``; t=0 is the run start."""

    arrivals: list[tuple[float, Program]]

    def __post_init__(self) -> None:
        self.arrivals.sort(key=lambda a: a[0])  # stable: ties keep their build order

    @property
    def duration_s(self) -> float:
        return self.arrivals[-1][0] if self.arrivals else 0.0


@dataclass
class Workload:
    """A named workload: exactly one of ``closed`` / ``open`` is set. ``meta`` holds build parameters."""

    name: str
    description: str
    closed: ClosedLoopSpec | None = None
    open: OpenLoopSpec | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.closed is None) == (self.open is None):
            raise ValueError("Workload needs exactly one of closed / open")

    @property
    def regions(self) -> list[str]:
        if self.closed is not None:
            return list(self.closed.clients)
        return sorted({p.region for _, p in self.open.arrivals})
