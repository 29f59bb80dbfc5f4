"""How an observation enters the conversation: as the model's chat template renders it.

The template renders whole conversations, so the tokens an observation adds are found by
difference: render a sample conversation ending in an assistant turn, then the same with the
observation's messages and the generation prompt after it, and keep what the second adds. What
the template puts after an assistant message ("<|im_end|>\\n" in ChatML) closes the model's turn:
the part the model generated itself (its eos) is not repeated, the rest ("\\n") goes in front of
the observation. A tokenizer without a chat template gets the messages' contents on lines of their
own. Raw-text observations are appended exactly as they are, right after the model's last token
(its end-of-turn token included when it generated one): the server owns that format.

An opening observation (Start's) comes before the first assistant turn, as a user turn would: the
prompt ends with the template's generation prompt ("<|im_start|>assistant\n"), so the episode drops
those tokens from its context and the opening brings them back after itself (`opening`).
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
            asked = self._render(self._base()[:1], generation_prompt=False)
            self._asked_text = asked
            self.generation_prompt = self._render(self._base()[:1], generation_prompt=True)[len(asked):]
        else:
            self.generation_prompt = ""

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

    def opening(self, observation: Observation, prompt_ids: list[int]) -> tuple[int, str]:
        """Start's observation: (prompt tokens to drop, text to append). Messages become turns of their
        own before the first assistant turn: the prompt's generation prompt is dropped and comes back
        after them. Raw text, an untemplated tokenizer, or a prompt that does not end with the
        generation prompt: nothing dropped, the text appended as `text` would append it."""
        if observation.text or not observation.messages or not self.templated or not self.generation_prompt:
            return 0, self.text(observation, turn_ended_with_eos=True)
        trim = self.ids(self.generation_prompt)
        if len(prompt_ids) < len(trim) or prompt_ids[len(prompt_ids) - len(trim):] != trim:
            return 0, self.text(observation, turn_ended_with_eos=True)
        messages = [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})}
                    for m in observation.messages]
        full = self._render(self._base()[:1] + messages, generation_prompt=True)
        if not full.startswith(self._asked_text):
            raise ValueError("the chat template renders a conversation differently once more messages "
                             "follow it; an opening observation cannot be appended by difference")
        return len(trim), full[len(self._asked_text):]

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
