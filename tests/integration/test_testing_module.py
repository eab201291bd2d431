"""``outbox.testing`` as users import it: the example of docs/testing.md runs as written."""

from __future__ import annotations

import re

from tests.relay_harness import REPO


def test_the_documented_example_passes(db_url):
    text = (REPO / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "def test_" in b)
    namespace: dict[str, object] = {}
    exec(compile(example, "docs/testing.md", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert len(tests) == 1
    tests[0](db_url)
