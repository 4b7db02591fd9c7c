"""From a validated OpenAI request body to the ``SamplingParams`` that crosses to the workers.

The schema (``schemas.py``) has checked each field's type and range; what needs the served model
or the other fields is checked here, once, at the edge: token ids in the vocabulary
(``stop_token_ids``, ``logit_bias``'s keys), ``min_tokens`` <= max_tokens. Every refusal is a
400 naming the field.
"""

from __future__ import annotations

from radixray.protocol import GrammarSpec, InvalidRequest, SamplingParams
from radixray.protocol.rules import check_sampling_tokens

from .errors import ApiError
from .structured import grammar_spec

__all__ = ["sampling_params"]


def sampling_params(
    body, max_tokens: int, vocab_size: int, tool_grammar: GrammarSpec | None = None
) -> SamplingParams:
    """``body``: a ``CompletionRequest`` or ``ChatCompletionRequest``. ``tool_grammar``: the
    grammar that enforces a chat request's ``tool_choice`` (``tool_grammar.py``), which leaves
    no room for the request's own structured output."""
    bias = body.logit_bias or {}
    top_k = body.top_k if body.top_k not in (None, 0) else -1  # vLLM: 0 and -1 both mean off

    def given(value, default):
        return default if value is None else value

    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=top_k,
            seed=body.seed,
            stop=tuple(body.stop or ()),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            min_p=given(body.min_p, 0.0),
            presence_penalty=given(body.presence_penalty, 0.0),
            frequency_penalty=given(body.frequency_penalty, 0.0),
            repetition_penalty=given(body.repetition_penalty, 1.0),
            logit_bias={int(k): v for k, v in bias.items()},
            min_tokens=given(body.min_tokens, 0),
            **_logprob_counts(body),
            grammar=_grammar(body, tool_grammar),
            n=body.n or 1,
        )
        check_sampling_tokens(params, vocab_size)
    except InvalidRequest as e:
        message = e.message.removeprefix("SamplingParams.")
        raise ApiError(400, message, param=e.param) from None
    return params


def _grammar(body, tool_grammar: GrammarSpec | None) -> GrammarSpec | None:
    asked = grammar_spec(body)
    if tool_grammar is None:
        return asked
    if asked is not None:
        raise ApiError(
            400,
            f"tool_choice {_choice_text(body.tool_choice)} constrains the answer to tool calls: "
            "it cannot be combined with response_format or other structured output",
            param="tool_choice",
        )
    return tool_grammar


def _choice_text(choice) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"


def _logprob_counts(body) -> dict:
    """``logprobs`` and ``prompt_logprobs`` of SamplingParams: chat's ``logprobs`` (bool) with
    ``top_logprobs`` alternatives; completions' ``logprobs`` (the count), of the prompt too
    with ``echo``."""
    if hasattr(body, "echo"):
        k = body.logprobs
        return {"logprobs": k, "prompt_logprobs": k if body.echo else None}
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    return {"logprobs": (body.top_logprobs or 0) if body.logprobs else None}
