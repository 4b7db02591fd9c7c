"""SGLang's ``Generate`` messages to and from radixray's protocol.

In: token ids and SGLang's sampling parameters (proto3 zeros read as SGLang's defaults where
zero is no valid value: ``top_p`` 0 is 1, ``top_k`` 0 is off, ``repetition_penalty`` 0 is 1,
``n`` 0 is 1; ``max_new_tokens`` absent is SGLang's default, 128, within the context). Out: a
``GenerateStreamChunk`` per chunk of new tokens (streamed requests only) and, per sample, a
``GenerateComplete`` with all its tokens, the finish reason and the token counts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import grpc

from radixray.protocol import (
    Aborted,
    EngineFailure,
    GenerateRequest,
    GrammarSpec,
    InvalidRequest,
    Overloaded,
    RequestError,
    SamplingParams,
    StreamChunk,
    TokenLogprob,
    WorkerUnavailable,
)

from . import sglang_scheduler_pb2 as pb

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "generate_request", "Responses", "status_code"]

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's, when a request names none


def status_code(e: RequestError) -> grpc.StatusCode:
    """The gRPC status a failed request ends with."""
    if isinstance(e, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(e, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(e, (EngineFailure, WorkerUnavailable)):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(e, Aborted):
        return grpc.StatusCode.ABORTED
    return grpc.StatusCode.INTERNAL


def _grammar(sp: pb.SamplingParams) -> GrammarSpec | None:
    which = sp.WhichOneof("constraint")
    if which is None:
        return None
    if which == "regex":
        return GrammarSpec("regex", sp.regex)
    if which == "json_schema":
        return GrammarSpec("json_schema", sp.json_schema)
    raise InvalidRequest(f"{which} constraints are not supported; use regex or json_schema", which)


def _f(x: float) -> float:
    """A proto float32 back to the decimal it was sent as (0.7, not 0.699999988)."""
    return float(f"{x:.7g}")


def sampling_params(req: pb.GenerateRequest, prompt_len: int, max_model_len: int) -> SamplingParams:
    sp = req.sampling_params
    room = max(max_model_len - prompt_len, 1)
    max_new = sp.max_new_tokens if sp.HasField("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS
    if sp.HasField("max_new_tokens") and max_new > room:
        raise InvalidRequest(
            f"max_new_tokens {max_new} + {prompt_len} prompt tokens exceed the context "
            f"({max_model_len})",
            "max_new_tokens",
        )
    try:
        bias = tuple(sorted((int(k), _f(v)) for k, v in sp.logit_bias.items()))
    except ValueError:
        raise InvalidRequest("logit_bias keys must be token ids", "logit_bias") from None
    return SamplingParams(
        max_tokens=min(max_new, room),
        temperature=_f(sp.temperature),
        top_p=_f(sp.top_p) or 1.0,
        top_k=sp.top_k if sp.top_k > 0 else -1,
        stop=tuple(sp.stop),
        stop_token_ids=tuple(sp.stop_token_ids),
        ignore_eos=sp.ignore_eos,
        min_p=_f(sp.min_p),
        presence_penalty=_f(sp.presence_penalty),
        frequency_penalty=_f(sp.frequency_penalty),
        repetition_penalty=_f(sp.repetition_penalty) or 1.0,
        logit_bias=bias,
        min_tokens=sp.min_new_tokens,
        logprobs=max(req.top_logprobs_num, 0) if req.return_logprob else None,
        grammar=_grammar(sp),
        n=sp.n or 1,
    )


def generate_request(req: pb.GenerateRequest, max_model_len: int) -> GenerateRequest:
    """radixray's request for SGLang's (raises InvalidRequest)."""
    ids = list(req.tokenized.input_ids)
    if not ids:
        raise InvalidRequest("Generate needs tokenized.input_ids (no text input)", "tokenized")
    if any(t >= 2**31 for t in ids):
        raise InvalidRequest("a token id is out of range", "tokenized")
    params = sampling_params(req, len(ids), max_model_len)
    return GenerateRequest(req.request_id or f"grpc-{uuid.uuid4().hex}", ids, params)


def _logprobs(lps: list[TokenLogprob] | None, ids: list[int]) -> pb.OutputLogProbs | None:
    if lps is None:
        return None
    return pb.OutputLogProbs(
        token_logprobs=[lp.logprob for lp in lps],
        token_ids=ids[: len(lps)],
        top_logprobs=[pb.TopLogProbs(values=lp.top_logprobs, token_ids=lp.top_ids) for lp in lps],
    )


@dataclass
class _Sample:
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class Responses:
    """One request's ``GenerateResponse`` messages, chunk by chunk of the engine's stream."""

    def __init__(self, request_id: str, prompt_len: int, stream: bool, stop_ids: set[int]):
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.stream = stream
        self.stop_ids = stop_ids  # the ids a "stop" finish may have matched (EOS, stop_token_ids)
        self.samples: dict[int, _Sample] = {}

    def of(self, chunk: StreamChunk) -> list[pb.GenerateResponse]:
        s = self.samples.setdefault(chunk.index, _Sample())
        s.ids += chunk.token_ids
        if chunk.logprobs is not None:
            s.logprobs = (s.logprobs or []) + chunk.logprobs
        out = []
        if self.stream and (chunk.token_ids or not chunk.ended):
            out.append(
                pb.GenerateResponse(
                    request_id=self.request_id,
                    chunk=pb.GenerateStreamChunk(
                        token_ids=chunk.token_ids,
                        prompt_tokens=self.prompt_len,
                        completion_tokens=len(s.ids),
                        cached_tokens=chunk.cached_tokens,
                        output_logprobs=_logprobs(chunk.logprobs, chunk.token_ids),
                        index=chunk.index,
                    ),
                )
            )
        if chunk.ended:
            out.append(self._complete(chunk, s))
        return out

    def _complete(self, chunk: StreamChunk, s: _Sample) -> pb.GenerateResponse:
        done = pb.GenerateComplete(
            output_ids=s.ids,
            finish_reason=chunk.finish_reason or "stop",
            prompt_tokens=chunk.prompt_tokens or self.prompt_len,
            completion_tokens=chunk.completion_tokens or len(s.ids),
            cached_tokens=chunk.cached_tokens,
            output_logprobs=_logprobs(s.logprobs, s.ids),
            index=chunk.index,
        )
        if chunk.finish_reason == "stop" and s.ids and s.ids[-1] in self.stop_ids:
            done.matched_token_id = s.ids[-1]
        return pb.GenerateResponse(request_id=self.request_id, complete=done)
