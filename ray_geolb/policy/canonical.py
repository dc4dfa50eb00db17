"""Canonical prompt text: the one function that turns a request into the text that is matched.

The router, the simulator and the region ingress all call :func:`canonical_text`, so a prefix
inserted by one of them is found by the others.

Accepted inputs (anything else raises :class:`PromptFormatError` naming what was wrong):

* a plain ``str`` (returned unchanged);
* an OpenAI chat request: an object with a ``.messages`` attribute (Ray Serve LLM's
  ``ChatCompletionRequest``) or a dict with a ``"messages"`` key; message ``content`` may be a
  string, ``None`` or a list of content parts (``{"type": "text", "text": ...}``, images, audio...);
  ``tools`` (if present) come first, as chat templates put them in the system prompt;
* an OpenAI completion request: an object with ``.prompt`` or a dict with ``"prompt"``; the prompt
  may be a string, a list of strings (joined by newlines) or a list of token ids.

Chat text is the concatenation of one segment per message, ``"<|role|>\\n" + content + "\\n"``, so
two chats that differ only after message *k* share the canonical text of messages 1..k exactly:
the text of a conversation's turn *k* is a prefix of the text of turn *k+1*.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional, Tuple

__all__ = ["PromptFormatError", "canonical_text", "chat_text", "message_text", "reply_span", "text_with_reply"]


class PromptFormatError(ValueError):
    """The request does not hold a prompt in a form we understand."""


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _plain(obj: Any) -> Any:
    """Pydantic models and other objects -> plain JSON-able data (deterministic)."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return obj


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    part = _plain(part)
    if not isinstance(part, dict):
        raise PromptFormatError(f"content part must be a string or an object, got {type(part).__name__}")
    kind = part.get("type", "text")
    if kind == "text" or "text" in part and kind in ("input_text", "output_text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise PromptFormatError("content part of type 'text' has no string 'text' field")
        return text
    # Non-text parts (image_url, input_audio, file, ...): a deterministic placeholder that keeps
    # two requests with the same image on the same path and different images apart.
    payload = {k: v for k, v in part.items() if k != "type"}
    return f"<{kind}:{json.dumps(payload, sort_keys=True, default=str)}>"


def message_text(message: Any) -> str:
    """The canonical segment of one chat message (role kept)."""
    message = _plain(message)
    if not isinstance(message, dict):
        raise PromptFormatError(f"chat message must be an object with 'role', got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise PromptFormatError("chat message has no 'role'")
    content = message.get("content")
    if content is None:
        body = ""
    elif isinstance(content, str):
        body = content
    elif isinstance(content, (list, tuple)):
        body = "".join(_part_text(p) for p in content)
    else:
        raise PromptFormatError(
            f"chat message 'content' must be a string, a list of parts or null, got {type(content).__name__}"
        )
    extra = []
    for key in ("name", "tool_call_id"):
        if message.get(key):
            extra.append(f"{key}={message[key]}")
    if message.get("tool_calls"):
        extra.append("tool_calls=" + json.dumps(_plain_deep(message["tool_calls"]), sort_keys=True, default=str))
    head = f"<|{role}|>" + ("[" + ";".join(extra) + "]" if extra else "")
    return f"{head}\n{body}\n"


def _plain_deep(obj: Any) -> Any:
    obj = _plain(obj)
    if isinstance(obj, dict):
        return {k: _plain_deep(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain_deep(v) for v in obj]
    return obj


def chat_text(messages: Iterable[Any], tools: Any = None) -> str:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise PromptFormatError("'messages' must be a list of chat messages")
    parts = []
    if tools:
        parts.append("<|tools|>\n" + json.dumps(_plain_deep(tools), sort_keys=True, default=str) + "\n")
    parts.extend(message_text(m) for m in messages)
    if not parts:
        raise PromptFormatError("'messages' is empty")
    return "".join(parts)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise PromptFormatError("'prompt' is an empty list")
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return "<|tokens|>" + ",".join(map(str, prompt))
        if all(isinstance(p, (list, tuple)) for p in prompt):  # batch of token lists
            return "\n".join(_prompt_text(p) for p in prompt)
    raise PromptFormatError(
        f"'prompt' must be a string, a list of strings or a list of token ids, got {type(prompt).__name__}"
    )


def canonical_text(request: Any) -> str:
    """Deterministic text to match for a request (see the module docstring)."""
    if isinstance(request, str):
        return request
    if isinstance(request, bytes):
        return request.decode("utf-8", errors="replace")
    messages = _get(request, "messages")
    if messages is not None:
        return chat_text(messages, _get(request, "tools"))
    prompt = _get(request, "prompt")
    if prompt is not None:
        return _prompt_text(prompt)
    raise PromptFormatError(
        f"cannot find a prompt in {type(request).__name__}: expected a string, or an object/dict "
        "with 'messages' (chat) or 'prompt' (completion)"
    )


def text_with_reply(request: Any, reply: str) -> Optional[str]:
    """The canonical text of ``request`` followed by its ``reply``: a prefix of the next turn's text when
    the client sends the reply back (a chat's next request carries it as an assistant message after the
    same messages; a completion's next prompt continues prompt + reply). The engine caches the reply's
    blocks as it decodes them, so this is what the replica holds after the request. None where the next
    turn cannot be predicted: a prompt that is not one string (token ids, a batch), a reply that is not text."""
    if not isinstance(reply, str):
        return None
    if isinstance(request, (str, bytes)):
        return canonical_text(request) + reply
    if _get(request, "messages") is not None:
        return canonical_text(request) + message_text({"role": "assistant", "content": reply})
    prompt = _get(request, "prompt")
    if isinstance(prompt, str):
        return prompt + reply
    return None


def reply_span(request: Any, text: Optional[str] = None) -> Optional[Tuple[int, int]]:
    """Where the last reply this chat carries back lies in its canonical text, in UTF-8 bytes (the unit of a
    prefix index's match): ``(start, end)`` of the last assistant message that another message follows, or
    None (not a chat, or no such message). ``start`` is the length of the turn that reply answered, whole:
    a replica known to hold that turn decoded the reply after it and cached it too (the cost policies'
    ``through_reply``). ``text``: the request's :func:`canonical_text` if the caller has it (only the
    messages from that reply on are read again). Raises :class:`PromptFormatError` as :func:`canonical_text`
    does."""
    if isinstance(request, (str, bytes)):
        return None
    messages = _get(request, "messages")
    if messages is None or isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        return None
    messages = list(messages)
    last = None
    for i in range(len(messages) - 2, -1, -1):
        if _get(_plain(messages[i]), "role") == "assistant":
            last = i
            break
    if last is None:
        return None
    if text is None:
        text = canonical_text(request)
    end = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    for m in messages[last + 1:]:
        end -= len(message_text(m).encode("utf-8", "surrogatepass"))
    return end - len(message_text(messages[last]).encode("utf-8", "surrogatepass")), end
