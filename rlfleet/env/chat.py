"""How an observation enters the conversation: as the model's chat template renders it.

The template renders whole conversations, so the tokens an observation adds are found by
difference: render a sample conversation ending in an assistant turn, then the same with the
observation's messages and the generation prompt after it, and keep what the second adds. What
the template puts after an assistant message ("<|im_end|>\\n" in ChatML) closes the model's turn:
the part the model generated itself (its eos) is not repeated, the rest ("\\n") goes in front of
the observation. A tokenizer without a chat template gets the messages' contents on lines of their
own. Raw-text observations are appended exactly as they are.
"""
from __future__ import annotations

from typing import Any

from rlfleet.env.types import Observation

_SENTINEL = "rlfleet-sentinel-7f3a"


class ObservationRenderer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.eos_text = tokenizer.eos_token or ""
        if self.templated:
            base = self._base()
            rendered = self._render(base, generation_prompt=False)
            self._base_text = rendered
            self._closing = rendered[rendered.rindex(_SENTINEL) + len(_SENTINEL):]

    @staticmethod
    def _base() -> list[dict[str, str]]:
        return [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def closing(self, turn_ended_with_eos: bool) -> str:
        """What closes the model's turn before an observation."""
        if not self.templated:
            return "\n"
        if turn_ended_with_eos and self.eos_text and self._closing.startswith(self.eos_text):
            return self._closing[len(self.eos_text):]
        return self._closing

    def text(self, observation: Observation, turn_ended_with_eos: bool) -> str:
        """The text appended after the model's turn: its closing, the observation, the generation prompt."""
        if observation.text or not observation.messages:
            return observation.text
        messages = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                    for m in observation.messages]
        if not self.templated:
            return "\n" + "\n".join(m["content"] for m in messages) + "\n"
        full = self._render(self._base() + messages, generation_prompt=True)
        if not full.startswith(self._base_text):
            raise ValueError("the chat template renders a conversation differently once more messages "
                             "follow it; observations cannot be appended by difference")
        return self.closing(turn_ended_with_eos) + full[len(self._base_text):]

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
