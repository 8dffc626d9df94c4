"""The served model's tokenizer: loading it, its chat template, and incremental detokenization.

- `load_tokenizer(folder)`: a Hugging Face `tokenizer.json` (the `tokenizers` library), the
  format `stepgap train` writes; `ServedTokenizer.load` adds what a server needs beside it: the
  EOS token (generation_config.json, else tokenizer_config.json) and the chat template
  (tokenizer_config.json's `chat_template`, or chat_template.jinja), rendered with jinja2 as
  transformers renders it. A folder without tokenizer.json has no tokenizer: prompts must then
  be token ids, and the text of a completion is empty (vLLM's --skip-tokenizer-init).
- `Detokenizer`: one request's text, a step's tokens at a time. Byte-level BPE pieces can split
  a character (`é` is two tokens), so a piece that ends inside a character is held back until
  the character is complete: `tokenizers`' DecodeStream, the detokenizer vLLM uses for fast
  tokenizers. At the end `finish` emits what is still held, so that the streamed pieces add up
  to the full decode, exactly.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stepgap.common.errors import UserError, where


def load_tokenizer(folder: Path | str):
    """The model folder's tokenizer.json (a fresh object: the engine's own to configure)."""
    from stepgap.common.datasets import read_tokenizer
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{path}: no tokenizer there")
    return read_tokenizer(path)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    from stepgap.common.fileio import read_json
    d = read_json(path)
    return d if isinstance(d, dict) else {}


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or {"content": ...}."""
    return v.get("content") if isinstance(v, dict) else v


# What one render of a chat template may cost: its running time (a template of two nested
# loops of 99,999, each within jinja2's sandbox range limit, ran for minutes and held the
# server), and the size of what a `*` or `**` makes (a string times 10^10, 7 ** 10^7), which one
# Python operation builds before any time check can run.
RENDER_S = 5.0
MAX_OPERAND = 10_000_000   # characters or items of a product
MAX_DIGITS = 4300          # digits of a power: no more can be printed (sys.get_int_max_str_digits)


class RenderTooLong(ValueError):
    """A chat template's output past the characters the context holds."""


def _bounded_env():
    """transformers' sandboxed environment, whose `*` and `**` refuse a result past
    MAX_OPERAND items or MAX_DIGITS digits before they build it."""
    import math

    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                            and len(seq) * n > MAX_OPERAND:
                        raise SecurityError(f"a product of {len(seq) * n:,} items")
            elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                    and right * math.log10(abs(left)) > MAX_DIGITS:
                raise SecurityError(f"a power of {right * math.log10(abs(left)):,.0f} digits")
            return super().call_binop(context, operator, left, right)

    return Bounded(trim_blocks=True, lstrip_blocks=True)


def compile_template(template: str, source: str):
    """The chat template compiled once, as transformers' apply_chat_template compiles it (a
    sandboxed jinja2 environment, trim_blocks and lstrip_blocks, `raise_exception`; here `*`
    and `**` bounded, `_bounded_env`); one that does not compile is refused at start-up, naming
    where it came from."""
    from jinja2.exceptions import TemplateError

    def raise_exception(message):
        raise TemplateError(message)

    env = _bounded_env()
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise UserError(f"{source}: the chat template does not compile ({e})") from None
    except (RecursionError, MemoryError):
        raise UserError(f"{source}: the chat template does not compile (nested too "
                        "deeply)") from None


@dataclass
class ServedTokenizer:
    tok: object                     # tokenizers.Tokenizer
    eos_token_id: int | None
    chat_template: str | None
    bos_token: str | None = None
    eos_token: str | None = None
    template: object = None         # chat_template compiled (compile_template)
    longest_token: int = 1          # characters of the vocabulary's longest token

    @classmethod
    def load(cls, folder: Path | str) -> "ServedTokenizer | None":
        """The tokenizer of a model folder, or None where it has none (presets, `tiny`)."""
        folder = Path(folder)
        if folder.is_file():
            folder = folder.parent
        if not (folder / "tokenizer.json").is_file():
            return None
        tok = load_tokenizer(folder)
        cfg = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        eos_id = gen.get("eos_token_id")
        if isinstance(eos_id, list):
            eos_id = eos_id[0] if eos_id else None
        if eos_id is None and eos:
            eos_id = tok.token_to_id(eos)
        template = cfg.get("chat_template")
        source = where(folder / "tokenizer_config.json", field="chat_template")
        if isinstance(template, list):   # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja = folder / "chat_template.jinja"
        if not template and jinja.is_file():
            from stepgap.common.fileio import read_text
            template, source = read_text(jinja), str(jinja)
        if template is not None and not isinstance(template, str):
            raise UserError(f"{source}: expected a jinja template (a string), got "
                            f"{type(template).__name__}")
        compiled = compile_template(template, source) if template else None
        longest = max((len(t) for t in tok.get_vocab()), default=1)
        return cls(tok, eos_id, template or None, bos, eos, compiled, longest)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def max_chars(self, max_tokens: int) -> int:
        """The most characters a text of `max_tokens` tokens can have: no token is longer
        than the vocabulary's longest. A longer text is refused before it is tokenized."""
        return max_tokens * self.longest_token

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    max_chars: int | None = None) -> str:
        """The prompt text of a conversation, by the model's chat template, rendered a piece
        at a time and stopped past `max_chars`. Whatever the template raises (its own
        raise_exception, 1/0, a range the sandbox refuses, recursion) is a ValueError saying
        so: the request's fault or the template's, never the server's."""
        out, n = [], 0
        deadline = time.monotonic() + RENDER_S

        def clock(frame, event, arg):   # every line the template runs: past RENDER_S, stop
            if time.monotonic() > deadline:
                raise TimeoutError(f"it ran past {RENDER_S:g} s")
            return clock

        traced = sys.gettrace()   # (a coverage tool's, under the tests)
        sys.settrace(clock)
        try:
            for piece in self.template.generate(
                    messages=messages, add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token or "", eos_token=self.eos_token or ""):
                out.append(piece)
                n += len(piece)
                if max_chars is not None and n > max_chars:
                    raise RenderTooLong(f"the chat template's output passes {max_chars} "
                                        "characters, more than the context holds")
        except RenderTooLong:
            raise
        except Exception as e:   # jinja2's TemplateError, or anything the template raised
            raise ValueError(f"the chat template failed: {type(e).__name__}: "
                             f"{str(e)[:200]}") from None
        finally:
            sys.settrace(traced)
        return "".join(out)


class Detokenizer:
    """One request's output text, step by step; `finish` flushes what a split character held
    back, so that the pieces concatenate to decode(all tokens)."""

    __slots__ = ("tok", "stream", "ids", "text_len")

    def __init__(self, tok: ServedTokenizer | None):
        self.tok = tok
        self.ids: list[int] = []
        self.text_len = 0
        if tok is not None:
            from tokenizers.decoders import DecodeStream
            self.stream = DecodeStream(skip_special_tokens=True)

    def step(self, new_ids: list[int]) -> str:
        self.ids += new_ids
        if self.tok is None:
            return ""
        pieces = [self.stream.step(self.tok.tok, t) for t in new_ids]
        text = "".join(p for p in pieces if p)
        self.text_len += len(text)
        return text

    def finish(self) -> str:
        """What decode(all) holds beyond the streamed text: normally nothing; the replacement
        character of an incomplete last character, as decode writes it."""
        if self.tok is None:
            return ""
        return self.tok.decode(self.ids)[self.text_len:]
