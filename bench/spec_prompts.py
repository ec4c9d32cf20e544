"""Prompts of issue 42's speculative-decoding workloads: output that repeats its input
(an edit of a code block of about 300 tokens, a summary that quotes its passage) and free
text, in the chat form `bench.client.request_body` sends."""

from __future__ import annotations

CODE = '''class Inventory:
    """Items in stock, by name, with a price and a count each."""

    def __init__(self):
        self.items = {}

    def add(self, name, price, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        if name in self.items:
            old_price, old_count = self.items[name]
            self.items[name] = (price, old_count + count)
        else:
            self.items[name] = (price, count)

    def remove(self, name, count=1):
        price, held = self.items[name]
        if count > held:
            raise ValueError(f"only {held} of {name} in stock")
        if count == held:
            del self.items[name]
        else:
            self.items[name] = (price, held - count)

    def value(self):
        total = 0
        for price, count in self.items.values():
            total += price * count
        return total

    def cheapest(self):
        if not self.items:
            return None
        return min(self.items, key=lambda name: self.items[name][0])

    def report(self):
        lines = []
        for name, (price, count) in sorted(self.items.items()):
            lines.append(f"{name}: {count} at {price:.2f}")
        return "\\n".join(lines)
'''

PASSAGE = (
    "The lighthouse on the northern cape was built in 1871 from granite quarried on the island "
    "itself. For ninety years a keeper and his family lived in the cottage at its foot, climbing "
    "one hundred and twelve steps each evening to light the lamp. The light could be seen from "
    "twenty-two nautical miles away on a clear night. In 1962 the lamp was automated and the last "
    "keeper, Margaret Hale, moved to the mainland, where she wrote a book about the storms she had "
    "watched from the gallery. The cottage is now a small museum that keeps her logbooks, the "
    "original brass lens and a collection of photographs of the ships that passed the cape."
)

WORKLOADS: dict[str, list[str]] = {
    "code_edit": [
        f"Here is a Python class:\n\n```python\n{CODE}```\n\nRename the method `value` to `total_value` "
        "and output the whole class again, unchanged otherwise.",
        f"Here is a Python class:\n\n```python\n{CODE}```\n\nAdd a docstring to the method `report` and "
        "output the whole class again, unchanged otherwise.",
    ],
    "quote_summary": [
        f"{PASSAGE}\n\nSummarize this passage in three sentences, quoting its most important sentences word for word.",
        f"{PASSAGE}\n\nList the facts of this passage, one per line, each copied exactly from the text.",
    ],
    "free_text": [
        "Write a short story about a fox who learns to sail.",
        "Explain in a few paragraphs why the seasons change on Earth.",
    ],
}
"""Workload name -> its prompts (each run at batch 1, one after the other)."""
