"""The HTTP API's requests and responses as plain values: parsing and checking request bodies,
and building the OpenAI-shaped bodies. No HTTP library here (colibri.serving.http serves them).

POST /v1/completions takes the OpenAI completion fields Colibri can honour:
  prompt       a string (encoded by the model's tokenizer) or a list of token ids; one prompt
  max_tokens   tokens to generate, default 16; prompt + max_tokens - 1 positions must fit the
               context
  temperature  0 is greedy (arg-max), > 0 samples softmax(logits / temperature); default 1
  seed         the sampler's seed (an int >= 0); default: a fresh one, recorded in the trace
  stream       server-sent events, one per engine step that adds tokens, then `data: [DONE]`
  model, user  accepted and ignored (one model is served)
Fields of the OpenAI API that would change the output and that Colibri does not implement (n,
best_of, echo, logprobs, stop, suffix, top_p, penalties, logit_bias) are refused when set to
anything but their neutral value, and unknown fields are refused, so nothing is silently
ignored. Every error names the field (`param`) in the OpenAI error shape:
{"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": null}}.

Responses add a `colibri` object beside the OpenAI fields: the prompt's and the completion's
token ids, the model (file, generation) the request ran on, hot reloads during it, and its
timings. The response `id` is also the trace id (GET /v1/traces/{id}).
"""

from __future__ import annotations

import math
import secrets
from typing import Any

from colibri.serving.traces import CompletionParams, RequestTrace
from colibri.serving.worker import ServingModel
from colibri.tokens import token_text

DEFAULT_MAX_TOKENS = 16
ACCEPTED = ("prompt", "max_tokens", "temperature", "seed", "stream", "model", "user",
            "stream_options")
# field -> the values that leave the output as Colibri computes it
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1, None), "best_of": (1, None), "echo": (False, None), "logprobs": (None, 0),
    "stop": (None, [], ""), "suffix": (None, ""), "top_p": (1, 1.0, None),
    "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
}


class RequestError(Exception):
    """A request Colibri refuses: HTTP `status`, a message naming the problem, the field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.param, self.kind)


def error_body(message: str, param: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise RequestError(f"{name} must be a finite number >= 0, got {value!r}", param=name)
    return float(value)


def check_fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    for name, value in body.items():
        if name in NEUTRAL:
            if value not in NEUTRAL[name] or (isinstance(value, bool) and name != "echo"):
                raise RequestError(f"{name} is not supported by this server (leave it out or "
                                   f"set it to {NEUTRAL[name][0]!r}), got {value!r}", param=name)
        elif name not in ACCEPTED:
            raise RequestError(f"unknown field {name!r}", param=name)
    for name in ("model", "user"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise RequestError(f"{name} must be a string, got {body[name]!r}", param=name)
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and set(options) <= {"include_usage"}
                                    and all(isinstance(v, bool) for v in options.values())):
        raise RequestError("stream_options may only hold include_usage (true or false); usage "
                           "is always in the last chunk", param="stream_options")
    return body


def prompt_tokens(prompt: Any, serving: ServingModel) -> list[int]:
    """The prompt's token ids: a string encoded by the model's tokenizer, or a list of ids in
    the vocabulary."""
    if prompt is None:
        raise RequestError("prompt is required (a string or a list of token ids)", param="prompt")
    if isinstance(prompt, str):
        if serving.tokenizer is None:
            raise RequestError(f"{serving.name} has no tokenizer: send the prompt as a list of "
                               "token ids", param="prompt")
        ids = [int(t) for t in serving.tokenizer.encode(prompt).ids]
        if not ids:
            raise RequestError(f"prompt {prompt[:40]!r} encodes to no tokens", param="prompt")
        return ids
    if not isinstance(prompt, list):
        raise RequestError(f"prompt must be a string or a list of token ids, got "
                           f"{type(prompt).__name__}", param="prompt")
    if not prompt:
        raise RequestError("prompt is empty", param="prompt")
    if all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"one prompt per request (a string or a list of token ids), got a "
                           f"batch of {len(prompt)}", param="prompt")
    vocab = serving.vocab_size
    for i, token in enumerate(prompt):
        if not _is_int(token):
            raise RequestError(f"prompt[{i}] must be a token id (an int), got {token!r}",
                               param="prompt")
        if not 0 <= token < vocab:
            raise RequestError(f"prompt[{i}]: token id {token} outside the vocabulary "
                               f"[0, {vocab}) of {serving.name}", param="prompt")
    return list(prompt)


def parse_completion(body: Any, serving: ServingModel) -> CompletionParams:
    """A checked completion request (RequestError names the first bad field). Encodes a text
    prompt: call it off the event loop."""
    body = check_fields(body)
    prompt = prompt_tokens(body.get("prompt"), serving)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens) or max_tokens < 0:
        raise RequestError(f"max_tokens must be an int >= 0, got {max_tokens!r}",
                           param="max_tokens")
    context = serving.context
    if len(prompt) > context:
        raise RequestError(f"the prompt has {len(prompt)} tokens; the context of {serving.name} "
                           f"is {context}", param="prompt")
    needed = len(prompt) + max(max_tokens - 1, 0)
    if needed > context:
        raise RequestError(f"prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) need "
                           f"{needed} positions; the context of {serving.name} is {context} "
                           f"(max_tokens <= {context - len(prompt) + 1})", param="max_tokens")
    temperature = _number(body, "temperature", 1.0)
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbits(63)
    elif not _is_int(seed) or not 0 <= seed < 2**63:
        raise RequestError(f"seed must be an int in [0, 2^63), got {seed!r}", param="seed")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}", param="stream")
    return CompletionParams(tuple(prompt), max_tokens, temperature, seed, stream)


def parse_tokenize(body: Any, serving: ServingModel) -> dict[str, Any]:
    """POST /tokenize {"prompt": text} -> the token ids and each one's text."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"prompt"})
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}", param=unknown[0])
    text = body.get("prompt")
    if not isinstance(text, str):
        raise RequestError(f"prompt must be a string, got {text!r}", param="prompt")
    if serving.tokenizer is None:
        raise RequestError(f"{serving.name} has no tokenizer", param="prompt")
    ids = [int(t) for t in serving.tokenizer.encode(text).ids]
    return {"tokens": ids, "pieces": [token_text(serving.tokenizer, t) for t in ids],
            "count": len(ids), "context": serving.context, "model": serving.name}


# ---------------------------------------------------------------------------------------------
# Responses


def _colibri(trace: RequestTrace) -> dict[str, Any]:
    return {"prompt_token_ids": list(trace.params.prompt), "token_ids": list(trace.generated),
            "model": trace.model, "reloads": list(trace.reloads), "seed": trace.params.seed,
            "timings": dict(trace.timings), "trace": f"/v1/traces/{trace.id}"}


def _usage(trace: RequestTrace) -> dict[str, int]:
    n_prompt, n_out = len(trace.params.prompt), len(trace.generated)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out}


def completion_body(trace: RequestTrace) -> dict[str, Any]:
    """The response of a finished, non-streamed request."""
    return {"id": trace.id, "object": "text_completion", "created": int(trace.created),
            "model": trace.model.get("name", ""),
            "choices": [{"index": 0, "text": trace.text, "logprobs": None,
                         "finish_reason": trace.finish_reason}],
            "usage": _usage(trace), "colibri": _colibri(trace)}


def stream_chunk(trace: RequestTrace, text: str, token_ids: list[int],
                 final: bool = False) -> dict[str, Any]:
    """One server-sent event of a streamed request; the last one has the finish reason, the
    usage and the `colibri` object."""
    chunk: dict[str, Any] = {
        "id": trace.id, "object": "text_completion", "created": int(trace.created),
        "model": trace.model.get("name", ""),
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": trace.finish_reason if final else None,
                     "token_ids": token_ids}]}
    if final:
        chunk["usage"] = _usage(trace)
        chunk["colibri"] = _colibri(trace)
    return chunk


def failure(trace: RequestTrace) -> RequestError:
    """The error of a failed request (its HTTP status and field)."""
    kind = "server_error" if trace.error_status >= 500 else "invalid_request_error"
    return RequestError(trace.error or "failed", trace.error_status or 500, trace.error_param,
                        kind)


__all__ = ["ACCEPTED", "DEFAULT_MAX_TOKENS", "NEUTRAL", "RequestError", "check_fields",
           "completion_body", "error_body", "failure", "parse_completion", "parse_tokenize",
           "prompt_tokens", "stream_chunk"]
