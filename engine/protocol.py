"""The OpenAI API as `vllm serve` speaks it: requests, their checks, and the shapes of answers.

Requests are pydantic models with the field names, types and defaults of vLLM's
(`vllm/entrypoints/openai/completion/protocol.py` and `chat_completion/protocol.py`), so that a
value is coerced, or refused, as vLLM's own models do it (pydantic's lax mode: "8" and 8.0 are
8 for an integer, "true" is true, 8.5 and "x" are refused); unknown fields are accepted and
ignored, as vLLM accepts them. What the engine does not model is refused with a 400 that names
the field rather than silently dropped: n > 1, echo, logprobs, stop strings, penalties, min_tokens, and a
temperature, top_p or top_k other than the server's (`stepgap serve --temperature ...`: the
engine samples every request alike). Errors have OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`.

Answers: a streamed completion is one `text_completion` chunk per engine step that gave the
request tokens (1..k+1 of them), the last with its `finish_reason` ("length", or "stop" at the
EOS token), then a usage chunk when `stream_options.include_usage` asks, then `[DONE]`; chat
streams `chat.completion.chunk`s with a first chunk that carries the role.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TokenId = Annotated[int, Field(ge=0)]
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1   # vLLM's bounds of a seed


class APIError(Exception):
    """A request the server refuses: OpenAI's error object, with the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type_: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.type = type_ or {400: "BadRequestError", 404: "NotFoundError",
                              503: "ServiceUnavailableError"}.get(status, "InternalServerError")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: int | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    return_token_ids: bool | None = None
    user: str | None = None


class CompletionRequest(SamplingFields):
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16   # OpenAI's default for completions
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict | str] | None = None   # text, or OpenAI's parts (vLLM: or strings)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    add_generation_prompt: bool = True
    n: int | None = 1
    echo: bool = False
    logprobs: bool | None = False
    top_logprobs: int | None = 0


def parse(model: type[BaseModel], body: bytes) -> BaseModel:
    """The request from its JSON body, or an APIError naming the first bad field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise APIError(f"the body is not valid JSON: {err.get('ctx', {}).get('error', '')}"
                           .rstrip(": "), param=None) from None
        if err["type"] == "model_type":
            raise APIError("the body must be a JSON object", param=None) from None
        loc = [str(x) for x in err["loc"] if not _pydantic_marker(x)]
        param = ".".join(loc) or None
        what = "missing" if err["type"] == "missing" else err["msg"]
        got = "" if err["type"] == "missing" else f", got {_short(err.get('input'))}"
        raise APIError(f"{param}: {what}{got}", param=param) from None


def _pydantic_marker(x) -> bool:
    """Union branches in an error's location (`list[int]`, `str`) are not field names."""
    return isinstance(x, str) and (any(c in x for c in "[](){}") or x in
                                   ("str", "int", "float", "bool", "list", "dict"))


def _short(v) -> str:
    """A value as an error message shows it: at most 80 characters."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 256:
        return f"an integer of {len(str(abs(v)))} digits"
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


# Fields of OpenAI's and vLLM's requests that change what is generated, which the engine does
# not model, with the value that changes nothing: any other value is a 400 naming the field,
# never a silent drop (they are not declared above, so pydantic keeps them as extras).
UNMODELLED = {"best_of": (1,), "use_beam_search": (False,), "logit_bias": ({},),
              "prompt_logprobs": (), "allowed_token_ids": (), "bad_words": ([],),
              "min_p": (0,), "length_penalty": (1,), "response_format": ({"type": "text"},),
              "structured_outputs": (), "guided_json": (), "guided_regex": (),
              "guided_choice": (), "guided_grammar": (), "tools": ([],)}


def check_sampling(req: SamplingFields, sampling) -> None:
    """Refuse what the engine does not model, naming the field. `sampling` is the server's
    SamplingConfig: every request is sampled with it."""
    if req.n not in (1, None):
        raise APIError(f"n: only n = 1 is served, got {req.n}", "n")
    if getattr(req, "echo", False):
        raise APIError("echo: not supported", "echo")
    if getattr(req, "suffix", None):
        raise APIError("suffix: not supported", "suffix")
    if req.logprobs is not None and req.logprobs is not False:   # 0 asks for them too
        raise APIError(f"logprobs: not supported, got {_short(req.logprobs)}", "logprobs")
    if getattr(req, "top_logprobs", None):
        raise APIError("top_logprobs: not supported", "top_logprobs")
    if req.stop:
        raise APIError("stop: stop strings are not supported (the EOS token is, unless "
                       "ignore_eos)", "stop")
    if req.stop_token_ids:
        raise APIError("stop_token_ids: not supported (the EOS token is, unless ignore_eos)",
                       "stop_token_ids")
    if req.min_tokens:
        raise APIError("min_tokens: not supported", "min_tokens")
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0)):
        v = getattr(req, name)
        if v is not None and v != neutral:
            raise APIError(f"{name}: penalties are not modelled (only {neutral:g})", name)
    for name, neutral in UNMODELLED.items():
        v = (req.model_extra or {}).get(name)
        if v is not None and v not in neutral:
            raise APIError(f"{name}: not modelled (the engine serves plain decoding, one "
                           f"sequence a request), got {_short(v)}", name)
    served = {"temperature": sampling.temperature, "top_p": sampling.top_p,
              "top_k": sampling.top_k}
    for name, value in served.items():
        v = getattr(req, name)
        if name == "top_k" and v == -1:
            v = 0       # vLLM's spelling of "off"
        if v is not None and v != value:
            raise APIError(f"{name}: this server samples every request with {name} {value:g} "
                           f"(set by `stepgap serve --{name.replace('_', '-')}`); per-request "
                           f"sampling is not modelled, got {_short(v)}", name)
    if req.seed is not None and not sampling.greedy:
        raise APIError("seed: per-request seeds are not modelled (the server's --seed seeds "
                       "sampling)", "seed")
    if req.stream_options is not None and not req.stream:
        raise APIError("stream_options: only with stream = true", "stream_options")


def message_text(content, param: str) -> str:
    """A chat message's text: a string, or OpenAI's list of parts (strings, or objects of type
    "text" whose `text` is a string), joined. Any other part (an image, a number where text
    belongs) is a 400 naming it: the model reads text only, and a dropped part would change the
    prompt silently."""
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        kind = part.get("type")
        if kind != "text":
            raise APIError(f"{param}.{j}.type: only text parts are served (a text-only "
                           f"model), got {_short(kind)}", f"{param}.{j}.type")
        text = part.get("text")
        if not isinstance(text, str):
            raise APIError(f"{param}.{j}.text: expected a string, got {_short(text)}",
                           f"{param}.{j}.text")
        out.append(text)
    return "".join(out)


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completion request: one, or a batch (one choice each)."""
    p = req.prompt
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        return [p]
    if not p:
        raise APIError("prompt: must not be empty", "prompt")
    return list(p)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------------
# Answers


class Shapes:
    """The JSON of one answer: completion or chat, streamed or whole."""

    def __init__(self, chat: bool, rid: str, model: str, return_token_ids: bool):
        self.chat, self.id, self.model = chat, rid, model
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.return_token_ids = return_token_ids

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def role_chunk(self, index: int) -> str:
        choice = {"index": index, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}
        return sse({**self._head(self.object), "choices": [choice]})

    def chunk(self, index: int, text: str, token_ids: list[int], finish: str | None) -> str:
        if self.chat:
            choice = {"index": index, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        return sse({**self._head(self.object), "choices": [choice]})

    def usage_chunk(self, usage: dict) -> str:
        return sse({**self._head(self.object), "choices": [], "usage": usage})

    def whole(self, choices: list[tuple[str, list[int], str]], usage: dict) -> dict:
        """The non-streamed answer: (text, token ids, finish reason) per choice."""
        out = []
        for i, (text, ids, finish) in enumerate(choices):
            c = {"index": i, "message": {"role": "assistant", "content": text}} if self.chat \
                else {"index": i, "text": text}
            c.update({"logprobs": None, "finish_reason": finish, "stop_reason": None})
            if self.return_token_ids:
                c["token_ids"] = ids
            out.append(c)
        return {**self._head("chat.completion" if self.chat else "text_completion"),
                "choices": out, "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
