"""A chat transcript as Markdown (for people) and JSON (with every reply's statistics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

from localcos.chat import Message


@dataclass
class Transcript:
    """What a chat saves: its models and combiner, the conversation, and each reply's record."""

    models: list[str]
    combiner: str
    system: str | None
    messages: Sequence[Message] = ()
    replies: list[dict] = field(default_factory=list)

    def markdown(self) -> str:
        out = ["# localcos chat", ""]
        if self.models:
            out += [f"Models: {', '.join(self.models)}  ", f"Combiner: {self.combiner}", ""]
        if self.system:
            out += [f"**system**: {self.system}", ""]
        for m in self.messages:
            out += [f"## {'You' if m.role == 'user' else 'Ensemble'}", "", m.content, ""]
        return "\n".join(out)

    def json(self) -> dict:
        return {
            "models": self.models,
            "combiner": self.combiner,
            "system": self.system,
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
            "replies": self.replies,
        }
