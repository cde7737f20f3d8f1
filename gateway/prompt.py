"""A request's prompt as token ids of its model, and its generation budget, checked against the
model before anything is admitted: a prompt that can never be served is refused at once rather
than after it waited in a queue."""
from __future__ import annotations

from gateway.executors.directory import ServedModel
from gateway.generation_request import GenerationRequest
from pagedserve.common.errors import InvalidArgument


def prompt_token_ids(request: GenerationRequest, model: ServedModel) -> list[int]:
    if request.token_ids is not None:
        ids = list(request.token_ids)
        for index, token_id in enumerate(ids):
            if not 0 <= token_id < model.vocab_size:
                raise InvalidArgument(
                    f"prompt token_ids[{index}] = {token_id} is outside {model.name}'s "
                    f"vocabulary [0, {model.vocab_size})")
        return ids
    if request.chat is not None:
        ids = model.tokenizer.encode_chat([m.template_message() for m in request.chat],
                                          add_generation_prompt=request.add_generation_prompt,
                                          tools=request.tools)
    else:
        ids = model.tokenizer.encode(request.text)
    if not ids:
        raise InvalidArgument("the prompt tokenizes to no tokens")
    return ids


def generation_budget(request: GenerationRequest, prompt_len: int, model: ServedModel) -> int:
    """max_tokens, checked against the context window; unset, whatever the window leaves."""
    room = model.max_model_len - prompt_len
    if room < 1:
        raise InvalidArgument(
            f"the prompt has {prompt_len} tokens; {model.name}'s context window of "
            f"{model.max_model_len} tokens leaves no room to generate: shorten the prompt")
    if request.max_tokens is None:
        return room
    if request.max_tokens > room:
        raise InvalidArgument(
            f"the prompt has {prompt_len} tokens and max_tokens is {request.max_tokens}: "
            f"{prompt_len + request.max_tokens} is over {model.name}'s context window of "
            f"{model.max_model_len} tokens; lower max_tokens to at most {room} or shorten the "
            "prompt")
    return request.max_tokens
