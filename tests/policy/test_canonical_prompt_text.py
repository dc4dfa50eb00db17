from types import SimpleNamespace

import pytest

from ray_geolb.policy.canonical import PromptFormatError, canonical_text


def chat(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def test_plain_string_unchanged():
    assert canonical_text("hello") == "hello"


def test_roles_are_kept_and_distinguish_texts():
    a = canonical_text(chat(("user", "hi")))
    b = canonical_text(chat(("assistant", "hi")))
    assert "user" in a and "assistant" in b and a != b


def test_chats_sharing_k_messages_share_that_prefix():
    base = [("system", "You are terse."), ("user", "What is 2+2?"), ("assistant", "4")]
    k = canonical_text(chat(*base))
    longer = canonical_text(chat(*base, ("user", "And 3+3?")))
    other = canonical_text(chat(*base, ("user", "Something else")))
    assert longer.startswith(k) and other.startswith(k)
    assert longer != other


def test_content_parts_equal_plain_string():
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert canonical_text(parts) == canonical_text(chat(("user", "ab")))


def test_image_parts_are_deterministic_placeholders():
    def req(url):
        return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}

    assert canonical_text(req("x")) == canonical_text(req("x"))
    assert canonical_text(req("x")) != canonical_text(req("y"))


def test_attribute_objects_like_ray_serve_llm_requests():
    msg = SimpleNamespace(model_dump=lambda exclude_none=True: {"role": "user", "content": "hey"})
    obj = SimpleNamespace(messages=[msg], tools=None)
    assert canonical_text(obj) == canonical_text(chat(("user", "hey")))
    assert canonical_text(SimpleNamespace(prompt="abc", messages=None)) == "abc"


def test_tools_come_first_and_are_order_independent():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]
    tools2 = [{"function": {"parameters": {"a": 2, "b": 1}, "name": "f"}, "type": "function"}]
    t1 = canonical_text({**chat(("user", "x")), "tools": tools})
    t2 = canonical_text({**chat(("user", "x")), "tools": tools2})
    assert t1 == t2 and t1.startswith("<|tools|>")


def test_completion_prompts():
    assert canonical_text({"prompt": "abc"}) == "abc"
    assert canonical_text({"prompt": ["a", "b"]}) == "a\nb"
    assert canonical_text({"prompt": [1, 2, 3]}).endswith("1,2,3")


@pytest.mark.parametrize(
    "bad, needle",
    [
        (42, "cannot find a prompt"),
        ({"foo": 1}, "cannot find a prompt"),
        ({"messages": []}, "empty"),
        ({"messages": "hi"}, "list of chat messages"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"prompt": []}, "empty list"),
        ({"prompt": [1.5]}, "prompt"),
    ],
)
def test_bad_input_names_the_problem(bad, needle):
    with pytest.raises(PromptFormatError, match=needle):
        canonical_text(bad)
