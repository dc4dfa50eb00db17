"""Importing vLLM's protocol classes in a process whose logging Ray Serve has set up (the region
ingress) must not break Serve's buffering log handler: vLLM's logging setup closes every handler, and
a closed ``MemoryHandler`` keeps every record for good (one per request: a memory leak)."""

from __future__ import annotations

import subprocess
import sys

CHECK = r"""
import logging, logging.handlers, sys
from ray_geolb.serve.llm_server import llm_protocol  # imports Ray Serve, which sets up its logger
target = logging.StreamHandler(sys.stdout)
mh = logging.handlers.MemoryHandler(capacity=1, target=target, flushLevel=logging.ERROR)
logging.getLogger("ray.serve").addHandler(mh)
assert "vllm" not in sys.modules
llm_protocol()
assert "vllm" in sys.modules, "vLLM was not imported: nothing tested"
logging.getLogger("ray.serve").warning("after the import")
print("TARGET", mh.target is target, "BUFFERED", len(mh.buffer))
"""


def test_serves_memory_handler_keeps_its_target_across_the_vllm_import():
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "after the import" in p.stdout and "TARGET True BUFFERED 0" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
