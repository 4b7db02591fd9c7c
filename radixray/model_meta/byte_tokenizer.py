"""A deterministic byte-level tokenizer for the tiny test model: UTF-8 bytes are token ids.

Ids 0..255 are the bytes themselves; three ChatML-style special tokens follow, so the engine can
run chat prompts on the tiny model exactly as on SmolLM2::

    0 .. 255   bytes
    256        <|endoftext|>   bos
    257        <|im_start|>
    258        <|im_end|>      eos
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .chat_template import CHATML, ChatTemplate

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Bytes in, bytes out; special-token strings in the text become their ids."""

    BOS_ID = 256
    IM_START_ID = 257
    EOS_ID = 258
    SPECIAL_TOKENS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}

    def __init__(self) -> None:
        self._special_re = re.compile("|".join(re.escape(s) for s in self.SPECIAL_TOKENS))
        self._id_to_special = {i: s for s, i in self.SPECIAL_TOKENS.items()}
        self._chat = ChatTemplate(CHATML)
        self.bos_token_id = self.BOS_ID
        self.eos_token_id = self.EOS_ID
        self.pad_token_id = self.EOS_ID
        self.stop_token_ids: tuple[int, ...] = (self.BOS_ID, self.EOS_ID)
        self.vocab_size = 256 + len(self.SPECIAL_TOKENS)
        self.chat_template = CHATML

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = [self.bos_token_id] if add_special_tokens else []
        pos = 0
        for m in self._special_re.finditer(text):
            ids.extend(text[pos : m.start()].encode("utf-8"))
            ids.append(self.SPECIAL_TOKENS[m.group()])
            pos = m.end()
        ids.extend(text[pos:].encode("utf-8"))
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            if i < 0:
                raise ValueError(f"token id {i} is negative")
            if i not in self._id_to_special:
                # A model's vocabulary may be larger than this tokenizer's (the tiny test model
                # has 320 ids): such ids are reserved tokens and render as nothing.
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens:
                out.append(self._id_to_special[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        return self._chat.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
