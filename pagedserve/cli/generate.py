"""`pagedserve generate PROMPT`: one request to a running gateway, text to stdout.

With --n 1 the text streams as it is decoded; with --n above 1 each completion is printed when
it finishes, under a `--- completion i ---` header. A control character in the text (ESC, ^N,
...) is shown escaped (`\\x1b`), never sent raw to the terminal; newlines and tabs are kept.
An RPC error prints `error: STATUS: details` to stderr and exits 1; Ctrl-C cancels the request
and exits 130.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc

from pagedserve.cli.printable import printable
from pagedserve.common.config import env_or
from pagedserve.gateway_client import GatewayClient, GenerationStream


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--target", default=env_or("PAGEDSERVE_GATEWAY_TARGET",
                                                   "127.0.0.1:50051"),
                        help="gateway host:port (env PAGEDSERVE_GATEWAY_TARGET)")
    parser.add_argument("--api-key", default=env_or("PAGEDSERVE_API_KEY", ""),
                        help="sent as 'authorization: Bearer KEY' (env PAGEDSERVE_API_KEY)")
    parser.add_argument("--tls-ca", default="", help="CA certificate to reach a TLS gateway")
    parser.add_argument("--model", default="", help="model name (default: the only one served)")
    parser.add_argument("--chat", action="store_true",
                        help="send the prompt as one user message of a chat")
    parser.add_argument("--max-tokens", type=int, help="tokens at most per completion")
    parser.add_argument("--temperature", type=float, help="0 is greedy")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1]")
    parser.add_argument("--top-k", type=int, help="keep only the k most likely tokens")
    parser.add_argument("--n", type=int, help="completions for the prompt")
    parser.add_argument("--seed", type=int, help="makes sampling reproducible")
    parser.add_argument("--stop", action="append", default=[],
                        help="stop before this string (repeatable)")
    parser.add_argument("--usage", action="store_true",
                        help="print token usage to stderr at the end")
    return parser


def print_streamed(generation: GenerationStream) -> list[str]:
    """Writes the one completion's text as it arrives; returns the errors it ended with."""
    errors = []
    for delta in generation:
        sys.stdout.write(printable(delta.text))
        sys.stdout.flush()
        if delta.finish_reason == "error":
            errors.append(delta.error)
    sys.stdout.write("\n")
    return errors


def print_finished(generation: GenerationStream) -> list[str]:
    """Writes each completion once it finishes, in finishing order; returns their errors."""
    texts: dict[int, list[str]] = {}
    errors = []
    for delta in generation:
        texts.setdefault(delta.index, []).append(delta.text)
        if delta.finish_reason is not None:
            print(f"--- completion {delta.index} ---\n"
                  f"{printable(''.join(texts.pop(delta.index)))}",
                  flush=True)
        if delta.finish_reason == "error":
            errors.append(f"completion {delta.index}: {delta.error}")
    return errors


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    with GatewayClient(args.target, args.api_key, args.tls_ca) as client:
        generation = client.stream(
            prompt, model=args.model, max_tokens=args.max_tokens, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, n=args.n, seed=args.seed, stop=args.stop)
        try:
            errors = (print_streamed if (args.n or 1) == 1 else print_finished)(generation)
        except grpc.RpcError as error:
            sys.stdout.flush()
            print(f"error: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            generation.cancel()
            sys.stdout.write("\n")
            return 130
    for message in errors:
        print(f"error: {message}", file=sys.stderr)
    if args.usage and generation.usage is not None:
        u = generation.usage
        print(f"usage: prompt_tokens={u.prompt_tokens} completion_tokens={u.completion_tokens}"
              f" cached_tokens={u.cached_tokens}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
